"""Forward+backward tokens/s: our JAX decoder against transformers' PyTorch model.

Both run the same config and the same weights (a random Qwen2 checkpoint saved
with `save_pretrained` and read back by `hf_io.load`), on the same CPU, in one
run. Prints tokens/s of each, the ratio, and our model-FLOPs utilisation
against a measured float32 matmul peak. Usage: `python bench/model.py [--steps 3]`.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import transformers
from flax import nnx

from jaxrl_agents.models import count_params, hf_io

# About 21M parameters (tied 8192 x 512 embedding plus six layers).
BENCH_CONFIG = dict(vocab_size=8192, hidden_size=512, intermediate_size=1408,
                    num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=2,
                    tie_word_embeddings=True, max_position_embeddings=1024)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def best_time(fn, steps: int) -> float:
    """Fastest of `steps` timed calls, after one warm-up call (compilation)."""
    fn()
    return min(_timed(fn) for _ in range(steps))


def best_times_interleaved(fns, steps: int) -> list[float]:
    """Fastest of `steps` calls of each fn, the fns taking turns (the CPU is shared:
    turns spread load changes over all of them). One warm-up call each first."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(steps):
        for fn, ts in zip(fns, times):
            ts.append(_timed(fn))
    return [min(ts) for ts in times]


def matmul_peak_flops(n: int = 2048, steps: int = 5) -> float:
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n), np.float32))
    dot = jax.jit(lambda x: x @ x)
    return 2 * n**3 / best_time(lambda: dot(a).block_until_ready(), steps)


def model_flops_per_step(cfg, batch: int, seq: int) -> float:
    """6 * (matmul parameters) per token, plus causal-free attention scores 12*L*T*D."""
    d, f, h = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    per_layer = d * h * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + 3 * d * f
    matmul_params = cfg.num_layers * per_layer + cfg.vocab_size * d  # + output projection
    attention = 12 * cfg.num_layers * seq * cfg.num_heads * h
    return batch * seq * (6 * matmul_params + attention)


def jax_step(model):
    graphdef, state = nnx.split(model)

    def loss(state, ids):  # next-token cross-entropy, like transformers' `labels=ids`
        logits = nnx.merge(graphdef, state)(ids)[:, :-1]
        return optax.softmax_cross_entropy_with_integer_labels(logits, ids[:, 1:]).mean()

    step = jax.jit(jax.value_and_grad(loss))
    return lambda ids: jax.block_until_ready(step(state, ids))


def torch_step(model):
    def step(ids):
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()

    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(0)
    hf_model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**BENCH_CONFIG))
    hf_model.train()
    with tempfile.TemporaryDirectory() as tmp:
        hf_model.save_pretrained(tmp)
        model, cfg = hf_io.load(tmp)
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (args.batch, args.seq))
    tokens = args.batch * args.seq

    ours, theirs = jax_step(model), torch_step(hf_model)
    jax_ids, torch_ids = jnp.asarray(ids, jnp.int32), torch.tensor(ids, dtype=torch.long)
    t_jax, t_torch = best_times_interleaved(
        [lambda: ours(jax_ids), lambda: theirs(torch_ids)], args.steps)
    peak = matmul_peak_flops()
    flops = model_flops_per_step(cfg, args.batch, args.seq)

    print(f"config: {count_params(model) / 1e6:.1f}M params, batch {args.batch} x seq "
          f"{args.seq}, float32, jax {jax.__version__} on {jax.devices()[0].platform}, "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads)")
    print(f"jax   fwd+bwd: {tokens / t_jax:9.0f} tokens/s  ({t_jax * 1e3:.0f} ms/step)")
    print(f"torch fwd+bwd: {tokens / t_torch:9.0f} tokens/s  ({t_torch * 1e3:.0f} ms/step)")
    print(f"ratio jax/torch: {t_torch / t_jax:.2f}x")
    print(f"matmul peak: {peak / 1e9:.1f} GFLOP/s; model FLOPs/step {flops / 1e9:.1f} G; "
          f"MFU {flops / t_jax / peak:.1%}")


if __name__ == "__main__":
    main()
