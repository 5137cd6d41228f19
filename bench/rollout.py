"""Rollout benchmark, in one run on this machine.

1. Decode throughput (new tokens / s) of our jitted KV-cache sampler against transformers'
   PyTorch `generate` (with its KV cache), greedy, the same random weights, batch 1, 8 and
   32, 128 new tokens each; prints the ratio (target: >= 2x at batch 8 and 32).
   Ours runs twice: on one CPU device, and sharded over one CPU device per core (a
   `data` mesh; the batch split between them), which is how this framework spreads work
   over cores. XLA:CPU splits one program's small matmuls (32 rows here) over the cores
   poorly, while the devices of a mesh run their shares of the batch side by side. This
   script asks XLA for one host device per core (`XLA_FLAGS`) unless a count is set.
2. Episodes per minute of `EpisodeDriver` on TextWorld w2-o3-q4 with a tiny random policy
   (sampled at temperature 1, so episodes mostly run to their step budget).

Usage: .venv/bin/python bench/rollout.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.common import (  # noqa: E402
    best_seconds_interleaved,
    data_mesh_sampler,
    one_host_device_per_core,
    table,
)

one_host_device_per_core()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from jaxrl_agents.models import hf_io  # noqa: E402
from jaxrl_agents.rollout import Sampler, SamplingParams  # noqa: E402

NEW_TOKENS = 128
PROMPT_LEN = 32
MAX_CONTEXT = 4096  # large enough that episodes run to the env's step budget


def make_checkpoint(path: str, vocab: int = 2048) -> transformers.PreTrainedModel:
    """A random Qwen2-style model (about 5M parameters), saved to `path`."""
    config = transformers.Qwen2Config(
        vocab_size=vocab, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
        tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).eval()
    model.save_pretrained(path)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def torch_generate(model, prompts: np.ndarray):
    with torch.no_grad():
        ids = torch.tensor(prompts, dtype=torch.long)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                             do_sample=False, use_cache=True)
    assert out.shape[1] == prompts.shape[1] + NEW_TOKENS
    return out


def decode_throughput(repeats: int):
    """Ours on one device and over one device per core, vs torch with its default threads
    and vs torch on one thread (on a small, shared CPU torch's thread pool can lose more to
    contention than it gains). Per batch the four are timed in turns
    (`best_seconds_interleaved`), so load from elsewhere does not fall on one side only."""
    default_threads = torch.get_num_threads()
    devices = jax.device_count()
    batches = (1, 8, 32)
    rng = np.random.default_rng(0)
    prompts = {b: rng.integers(1, 2048, size=(b, PROMPT_LEN)) for b in batches}
    ours, theirs = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        torch_model = make_checkpoint(tmp)
        samplers = {1: Sampler(hf_io.load(tmp)[0])}
        if devices > 1:  # its own copy: the mesh sampler moves a model's parameters
            samplers[devices] = data_mesh_sampler(hf_io.load(tmp)[0])
        for b in batches:
            contestants = {
                ("ours", n): lambda p=prompts[b], s=sampler: s.generate(
                    p.tolist(), NEW_TOKENS, SamplingParams())
                for n, sampler in samplers.items() if b % n == 0  # devices share it evenly
            }
            for threads in (default_threads, 1):
                contestants["torch", threads] = (
                    lambda t=threads: torch.set_num_threads(t),
                    lambda p=prompts[b]: torch_generate(torch_model, p))
            for (side, n), seconds in best_seconds_interleaved(
                    contestants, repeats=repeats, warmup=1).items():
                (ours if side == "ours" else theirs)[b, n] = seconds
        torch.set_num_threads(default_threads)
    rows = []
    for b in batches:
        tok = b * NEW_TOKENS
        best = min(seconds for (batch, _), seconds in ours.items() if batch == b)
        row = [b] + [f"{tok / ours[b, n]:,.0f}" if (b, n) in ours else "-" for n in samplers]
        for threads in (default_threads, 1):
            row += [f"{tok / theirs[b, threads]:,.0f}", f"{theirs[b, threads] / best:.2f}x"]
        rows.append(row)
    print(f"Decode throughput: greedy, prompt {PROMPT_LEN} tokens, {NEW_TOKENS} new tokens, "
          f"Qwen2 D=256 L=4 V=2048 (random weights), transformers {transformers.__version__}, "
          f"torch {torch.__version__}, jax {jax.__version__} on {devices} "
          f"{jax.devices()[0].platform} device(s), best of {repeats} runs each; the ratios "
          "take our faster column")
    t = default_threads
    ours_columns = [f"ours {n} dev tok/s" for n in samplers]
    print(table(rows, ["batch", *ours_columns, f"torch({t} thr) tok/s", "ratio",
                       "torch(1 thr) tok/s", "ratio"]))


def episodes_per_minute(episodes: int):
    from flax import nnx

    import envs
    from envs import textworld_env
    from jaxrl_agents.models import ModelConfig, Transformer
    from jaxrl_agents.models.tokenizer import train_tokenizer
    from jaxrl_agents.rollout import EpisodeDriver

    cache_dir = os.path.join(tempfile.gettempdir(), "jaxrl-bench-textworld")
    specs = [{"family": "textworld", "name": "w2-o3-q4", "seed": i, "split": "train",
              "cache_dir": cache_dir} for i in range(episodes)]
    t0 = time.perf_counter()
    textworld_env.generate_games(specs, num_workers=2)
    print(f"\n(TextWorld games ready in {time.perf_counter() - t0:.1f} s, cached in {cache_dir})")
    with tempfile.TemporaryDirectory() as tmp, envs.EnvPool(specs, num_workers=2) as pool:
        texts = [r.observation for r in pool.reset()] + ["go north", "take apple", "open box"]
        tokenizer = train_tokenizer(texts * 4, vocab_size=512, path=tmp)
        cfg = ModelConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=384,
                          num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32,
                          tie_embeddings=True, qkv_bias=False)
        model = Transformer(cfg, rngs=nnx.Rngs(0))
        driver = EpisodeDriver(model, tokenizer, pool, max_action_tokens=16,
                               max_context=MAX_CONTEXT, temperature=1.0)
        ids = list(range(episodes))
        driver.run(ids, jax.random.key(0))  # compiles every shape the timed run meets
        start = time.perf_counter()
        trajectories = driver.run(ids, jax.random.key(0))
        wall = time.perf_counter() - start
        stats = driver.last_stats
    turns = sum(t.num_turns for t in trajectories)
    ends = sorted({t.info["end_reason"] for t in trajectories})
    print(f"Driver on TextWorld w2-o3-q4, {episodes} episodes in lock-step (2 env workers, "
          f"two half-batches), tiny random policy (D=128 L=4), max 16 action tokens, "
          f"max_context {MAX_CONTEXT}, episodes ended by {ends}:")
    print(f"  {episodes / wall * 60:.1f} episodes/min, {turns / wall:.1f} turns/s, "
          f"{stats['rollout/action_tokens'] / wall:.0f} action tokens/s, "
          f"mean {turns / episodes:.1f} turns, mean length "
          f"{np.mean([len(t) for t in trajectories]):.0f} tokens")
    print(f"  model waited for envs {stats['rollout/model_wait_frac']:.0%} of wall time, "
          f"envs waited for the model {stats['rollout/env_wait_frac']:.0%}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repeats and episodes")
    parser.add_argument("--skip-driver", action="store_true")
    args = parser.parse_args()
    decode_throughput(repeats=2 if args.quick else 5)
    if not args.skip_driver:
        episodes_per_minute(8 if args.quick else 16)


if __name__ == "__main__":
    main()
