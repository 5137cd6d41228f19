"""Real-model sampler benchmark: compile time, compiled programs and decode speed at the
shape of SmolLM2-135M-Instruct (Llama: 30 layers, D=576, 9 query / 3 kv heads, head dim
64, F=1536, vocabulary 49,152, tied embeddings), in one run on this machine.

1. `--compile`: what a 32-episode evaluation compiles. A scripted multi-turn workload
   drives the sampler as the episode driver does (a ~350-token first prompt, then turns of
   a ~60-token observation and an action of up to 16 tokens), and JAX's compile events are
   counted: programs compiled, seconds spent lowering and compiling, and wall time.
2. `--decode`: greedy decode tokens/s against transformers' PyTorch `generate` with the same
   weights (float32, 64-token prompts, 64 new tokens), batch 1, 8 and 32, timed in turns
   (best of `--repeats`), with the layers under scan and unrolled as two contestants of the
   same run (`--decode-layers`), and the scanned layers over a `data` mesh of one CPU
   device per core ("mesh": each device decodes its share of the batch; this script asks
   XLA for that many host devices unless a count is set); at batch 1 also against the
   memory-bandwidth bound (weight bytes read per token over a measured copy bandwidth).
   Then, per batch, the least time any implementation could take here (bench/floor.py: the
   FLOPs at the best GEMM rate measured in the same run, each step's weight reads at the
   copy bandwidth) and so the largest ratio to torch's measured time this machine allows.
3. `--learner`: forward + backward tokens/s of a next-token loss against the torch model.
4. `--memory`: peak resident memory of a 32-episode rollout that fills a 2048-slot cache,
   against `jaxrl-plan`'s rows for it.
5. `--textworld`: the real weights (the `smollm2-135m-instruct` preset) playing one batch
   of 32 held-out w2-o3-q4 games as `configs/textworld_smollm2.py` does (constrained):
   sampled at temperature 1, greedy by command and greedy by token, one batch each (wall
   time with its lowering and compiling counted apart, tokens, tokens/s, the model's
   share), and the process's peak resident memory. With `--calls`, every sampler call of
   the sampled batch too: its chunk bucket, cache slots and index before and after, and
   seconds (where a rollout's time goes as its context grows).

6. `--gemm`: one decoder layer's seven matrix products x @ W^T at 1, 8, 32 and 2048 rows
   (a decode step's batch, or a learner's tokens), XLA against torch, next to the time
   their weight reads take at the measured copy bandwidth.

Weights (1-4): random, of the real shape (the numbers do not depend on their values).
Usage: .venv/bin/python bench/real_model.py [--compile] [--decode] [--learner] [--memory]
       [--textworld [--calls]] [--gemm] [--unrolled]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.common import one_host_device_per_core  # noqa: E402

one_host_device_per_core()

import jax  # noqa: E402
import numpy as np  # noqa: E402

PROMPT, NEW, BATCHES = 64, 64, (1, 8, 32)
COMPILE_EVENTS = {
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lowering",
    "/jax/core/compile/backend_compile_duration": "compiling",
}


def smollm2_shape(path: str, layers: int = 30):
    """A random Llama checkpoint of SmolLM2-135M's shape, saved to `path`; returns it."""
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
        num_attention_heads=9, num_key_value_heads=3, head_dim=64, tie_word_embeddings=True,
        max_position_embeddings=8192, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(path)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


class CompileCounter:
    """Counts JAX's lowering and compile events (and their seconds) while it is active."""

    def __init__(self):
        self.seconds = dict.fromkeys(COMPILE_EVENTS.values(), 0.0)
        self.programs = 0

    def __call__(self, event, duration, **_):
        if event in COMPILE_EVENTS:
            self.seconds[COMPILE_EVENTS[event]] += duration
            self.programs += event.endswith("backend_compile_duration")

    def __enter__(self):
        jax.monitoring.register_event_duration_secs_listener(self)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self)


def evaluation_workload(sampler, episodes: int, rows: int, turns: int, seed: int = 0):
    """Plays `episodes` scripted episodes `rows` at a time through the sampler as the episode
    driver does (one state per batch, a chunk per turn, `ensure_room` as it grows)."""
    from jaxrl_agents.rollout import SamplingParams

    rng = np.random.default_rng(seed)
    vocab = sampler.config.vocab_size
    for start in range(0, episodes, rows):
        n = min(rows, episodes - start)
        batch = sampler.batch_size(n)
        state = sampler.new_state(batch, 512)
        for turn in range(turns):
            length = 350 if turn == 0 else int(rng.integers(40, 90))
            chunks = [rng.integers(1, vocab, length).tolist() for _ in range(n)]
            chunks += [[]] * (batch - n)
            state, _ = sampler.extend(state, chunks, 16, SamplingParams(),
                                      jax.random.key(turn))


def measure_compile(path: str, episodes: int, rows: int, turns: int, scan: bool):
    from jaxrl_agents.models import hf_io
    from jaxrl_agents.rollout import Sampler

    model = hf_io.load(path, scan_layers=scan)[0]
    sampler = Sampler(model)
    start = time.perf_counter()
    with CompileCounter() as counter:
        evaluation_workload(sampler, episodes, rows, turns)
    wall = time.perf_counter() - start
    print(f"Compile: {episodes} scripted episodes, {rows} a batch, {turns} turns, "
          f"scan_layers={model.config.scan_layers}: {counter.programs} programs compiled, "
          f"lowering {counter.seconds['lowering']:.1f} s + compiling "
          f"{counter.seconds['compiling']:.1f} s, wall {wall:.1f} s (first run, cold)")
    start = time.perf_counter()
    evaluation_workload(sampler, episodes, rows, turns, seed=1)
    print(f"  the same workload again (compiled): {time.perf_counter() - start:.1f} s")


def _decode_sampler(path: str, mode: str):
    """A sampler of the checkpoint for one `--decode-layers` entry: "scan" and "unrolled"
    on one device, "mesh" (scanned layers) over a `data` mesh of every device."""
    from bench.common import data_mesh_sampler
    from jaxrl_agents.models import hf_io
    from jaxrl_agents.rollout import Sampler

    if mode not in ("scan", "unrolled", "mesh"):
        raise SystemExit(f"--decode-layers: unknown layout {mode!r} (scan, unrolled, mesh)")
    model = hf_io.load(path, scan_layers=mode != "unrolled")[0]
    return data_mesh_sampler(model) if mode == "mesh" else Sampler(model)


def measure_decode(path: str, torch_model, repeats: int, layer_modes: list[str],
                   batches=BATCHES):
    """Greedy decode of ours against torch `generate`, timed in turns; one contestant per
    entry of `layer_modes` ("scan" / "unrolled": the same weights, layers under lax.scan
    or one after the other; "mesh": scanned, the batch split over a `data` mesh), so the
    layouts are compared in one run."""
    import torch

    from bench.common import best_seconds_interleaved, copy_bandwidth_gbs, table
    from jaxrl_agents.models import count_params
    from jaxrl_agents.rollout import SamplingParams

    samplers = {mode: _decode_sampler(path, mode) for mode in layer_modes}
    weight_bytes = 4 * count_params(next(iter(samplers.values())).model)
    rng = np.random.default_rng(0)
    rows, per_token, torch_seconds = [], {}, {}
    for b in batches:
        prompts = rng.integers(1, 49152, size=(b, PROMPT))

        def ours(sampler, p=prompts):
            out = sampler.generate(p.tolist(), NEW, SamplingParams())
            assert all(len(t) == NEW for t in out.tokens)

        def theirs(p=prompts):
            with torch.no_grad():
                ids = torch.tensor(p, dtype=torch.long)
                torch_model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                     max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)

        contestants = {mode: functools.partial(ours, sampler) for mode, sampler in samplers.items()
                       if sampler.mesh is None or b % sampler.mesh.shape["data"] == 0}
        best = best_seconds_interleaved({**contestants, "torch": theirs}, repeats=repeats,
                                        warmup=1)
        tokens = b * NEW
        torch_seconds[b] = best["torch"]
        for mode in contestants:
            rows.append([b, mode, f"{tokens / best[mode]:.1f}", f"{tokens / best['torch']:.1f}",
                         f"{best['torch'] / best[mode]:.2f}x"])
            if b == 1:
                per_token[mode] = best[mode] / NEW
    print(f"Decode: greedy, float32, prompt {PROMPT}, {NEW} new tokens, best of {repeats}, "
          f"torch {torch.__version__} at {torch.get_num_threads()} threads, jax "
          f"{jax.__version__}")
    print(table(rows, ["batch", "layers", "ours tok/s", "torch tok/s", "ratio"]))
    bandwidth = copy_bandwidth_gbs() * 1e9
    bound = bandwidth / weight_bytes
    for mode, seconds in per_token.items():
        print(f"Batch 1, {mode}, against the bandwidth bound: {1 / seconds:.1f} tok/s of at "
              f"most {bound:.1f} tok/s ({weight_bytes / 1e6:.0f} MB of weights read per "
              f"token): {1 / seconds / bound:.0%} of the bound")
    print_decode_floor(next(iter(samplers.values())).model, batches, torch_seconds, bandwidth)


# One decoder layer's seven weight matrices at SmolLM2's width, [out, in] as the model
# stores them: q, k, v, o, gate, up, down.
LAYER_MATRICES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576),
                  (576, 1536)]


def gemm_seconds(rows: int, repeats: int = 5) -> dict[str, float]:
    """Seconds for x [rows, in] @ W^T of one layer's seven matrices (`LAYER_MATRICES`,
    12 layers' worth so the weights come from memory, not cache), per layer: XLA's dot
    (as `transformer.matmul_wt`) and torch's `linear`, timed in turns."""
    import torch

    from bench.common import best_seconds_interleaved
    from jaxrl_agents.models.transformer import matmul_wt

    layers = 12
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(s, dtype=np.float32) for s in LAYER_MATRICES * layers]
    x = {i: rng.standard_normal((rows, i), dtype=np.float32) for i in (576, 1536)}
    ours_w, ours_x = [jax.numpy.asarray(w) for w in weights], jax.tree.map(jax.numpy.asarray, x)
    ours_fn = jax.jit(lambda xs, ws: [matmul_wt(xs[w.shape[1]], w) for w in ws])
    theirs_w, theirs_x = [torch.from_numpy(w) for w in weights], {
        k: torch.from_numpy(v) for k, v in x.items()}

    def theirs():
        with torch.no_grad():
            return [torch.nn.functional.linear(theirs_x[w.shape[1]], w) for w in theirs_w]

    best = best_seconds_interleaved(
        {"ours": lambda: jax.block_until_ready(ours_fn(ours_x, ours_w)), "torch": theirs},
        repeats=repeats, warmup=1)
    return {k: v / layers for k, v in best.items()}


def measure_gemm(rows_list=(1, 8, 32, 2048), bandwidth: float | None = None) -> float:
    """Prints one layer's matrix products at each row count (the decode batch, or a
    learner's tokens) against what memory and arithmetic allow; returns the best FLOP/s
    either library reached (the peak the decode floor uses). bandwidth: bytes/s, measured
    here when the caller has not."""
    from bench.common import copy_bandwidth_gbs, table

    layer_params = sum(o * i for o, i in LAYER_MATRICES)
    flops_per_row, weight_bytes = 2 * layer_params, 4 * layer_params
    bandwidth = bandwidth or copy_bandwidth_gbs() * 1e9
    rows_out, peak = [], 0.0
    for rows in rows_list:
        best = gemm_seconds(rows)
        peak = max(peak, rows * flops_per_row / min(best.values()))
        rows_out.append([rows, f"{best['ours'] * 1e3:.3f}", f"{best['torch'] * 1e3:.3f}",
                         f"{weight_bytes / bandwidth * 1e3:.3f}",
                         f"{rows * flops_per_row / best['ours'] / 1e9:.0f}",
                         f"{rows * flops_per_row / best['torch'] / 1e9:.0f}"])
    print(f"One layer's seven products x @ W^T (SmolLM2's width, float32; {weight_bytes / 1e6:.1f}"
          f" MB of weights), best of 5; weight reads alone at {bandwidth / 1e9:.1f} GB/s:")
    print(table(rows_out, ["rows", "ours ms", "torch ms", "weight reads ms", "ours GFLOP/s",
                           "torch GFLOP/s"]))
    print(f"Peak reached: {peak / 1e9:.0f} GFLOP/s")
    return peak


def print_decode_floor(model, batches, torch_seconds: dict, bandwidth: float):
    """For each batch, the least time any implementation could decode in here
    (bench/floor.py, at the best GEMM rate measured now and the copy bandwidth) and the
    largest ratio to torch's measured time that allows."""
    from bench.floor import decode_floor
    from jaxrl_agents.models import count_params

    peak = measure_gemm((2048,), bandwidth)
    cfg = model.config
    table_size = cfg.vocab_size * cfg.hidden_size  # the embedding table; the output layer too
    tables = 1 if cfg.tie_embeddings else 2
    total = count_params(model)
    for b in batches:
        # a step reads every weight but the input table's unused rows (when it is not tied)
        floor = decode_floor(batch=b, prompt=PROMPT, new=NEW,
                             layer_params=total - tables * table_size, vocab=cfg.vocab_size,
                             hidden=cfg.hidden_size,
                             weight_bytes=4 * (total - (tables - 1) * table_size),
                             peak_flops=peak, bandwidth=bandwidth)
        bound = "arithmetic" if floor.compute_bound else "weight reads"
        print(f"Batch {b}: at least {floor.total_s:.2f} s here (prefill {floor.prefill_s:.2f} s, "
              f"{floor.steps} steps of {floor.step_s * 1e3:.1f} ms, bound by {bound}); torch "
              f"took {torch_seconds[b]:.2f} s: no implementation can beat it by more than "
              f"{torch_seconds[b] / floor.total_s:.2f}x here")


def measure_memory(path: str, rows: int, context: int, scan: bool):
    """Peak resident memory of a rollout of `rows` episodes whose cache fills `context`
    slots (a 350-token prompt, then 60-90-token observations and 16-token actions), against
    what `jaxrl-plan` counts for it: parameters, the KV cache and its copy while compacting,
    and one prefill's scratch."""
    import resource

    import psutil

    from configs.base import get_config
    from jaxrl_agents import plan as planning
    from jaxrl_agents import sharding
    from jaxrl_agents.models import hf_io
    from jaxrl_agents.rollout import Sampler, SamplingParams

    before = psutil.Process().memory_info().rss
    model, mc = hf_io.load(path, scan_layers=scan)
    sampler = Sampler(model)
    rng = np.random.default_rng(0)
    state = sampler.new_state(rows, 512)
    turn = 0
    start = time.perf_counter()
    while state.cache_index < context - 128 - 16:
        length = 350 if turn == 0 else int(rng.integers(60, 90))
        chunks = [rng.integers(1, mc.vocab_size, length).tolist() for _ in range(rows)]
        state, _ = sampler.extend(state, chunks, 16, SamplingParams(temperature=1.0),
                                  jax.random.key(turn))
        turn += 1
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    cfg = get_config()
    cfg.rollout.episodes_per_batch, cfg.rollout.max_context = rows, context
    mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1})
    rows_planned = planning.make_plan(cfg, mc, mesh).rows
    parts = ("policy parameters", "KV cache (rollout)", "KV cache copy while compacting",
             "rollout scratch (one prefill)")
    planned = sum(rows_planned[k] for k in parts)
    gib = 2**30
    print(f"Memory: {rows} rows, {turn} turns, cache {state.slots} slots "
          f"(index {state.cache_index}), {wall:.0f} s")
    print(f"  process before the model {before / gib:.2f} GiB; peak RSS {peak / gib:.2f} GiB; "
          f"peak minus before {(peak - before) / gib:.2f} GiB")
    print("  jaxrl-plan: " + ", ".join(f"{k} {rows_planned[k] / gib:.2f}" for k in parts)
          + f"; sum {planned / gib:.2f} GiB")
    print(f"  measured / planned: {(peak - before) / planned:.2f}")


def measure_learner(path: str, torch_model, repeats: int, scan: bool, rows: int = 4,
                    length: int = 512):
    """Forward + backward tokens/s of the next-token loss over `rows` x `length` tokens:
    ours (jitted value_and_grad, logits at every position) against the torch model's
    forward and backward, the same weights, float32."""
    import torch
    from flax import nnx

    from bench.common import best_seconds_interleaved
    from jaxrl_agents import kernels
    from jaxrl_agents.models import hf_io

    model = hf_io.load(path, scan_layers=scan)[0]
    graphdef, params = nnx.split(model)
    ids = np.random.default_rng(0).integers(1, 49152, size=(rows, length)).astype(np.int32)

    @jax.jit
    def grad(params, ids):
        def loss(params):
            logits = nnx.merge(graphdef, params)(ids)
            return -kernels.next_token_logprobs(logits, ids)[:, 1:].mean()
        return jax.value_and_grad(loss)(params)

    def ours():
        jax.block_until_ready(grad(params, ids))

    torch_ids = torch.tensor(ids, dtype=torch.long)

    def theirs():
        torch_model.zero_grad()
        torch_model(input_ids=torch_ids, labels=torch_ids).loss.backward()

    torch_model.train()
    # settle=1: each side's timed step follows one of its own (see best_seconds_interleaved);
    # the first settle run also compiles ours.
    best = best_seconds_interleaved({"ours": ours, "torch": theirs}, repeats=repeats, warmup=0,
                                    settle=1)
    torch_model.eval()
    tokens = rows * length
    print(f"Learner: forward + backward of the next-token loss, {rows} x {length} tokens, "
          f"float32, scan_layers={scan}: ours {tokens / best['ours']:.0f} tok/s, torch "
          f"{tokens / best['torch']:.0f} tok/s, ratio {best['torch'] / best['ours']:.2f}x")


def rl_batch(rows: int, turns: int, vocab: int, choice_width: int, seed: int = 0):
    """`rows` episodes shaped like the real-model recipe's: a 350-token first prompt, then
    `turns` turns of a 150-250-token observation and a 4-8-token action played among 8
    offered commands (constrained decoding), reward at the end; random tokens."""
    from jaxrl_agents.data import ACTION, PROMPT, Trajectory, pack

    rng = np.random.default_rng(seed)
    trajs = []
    for row in range(rows):
        tokens, types, ends, choices = [], [], [], []
        for turn in range(turns):
            n_obs = 350 if turn == 0 else int(rng.integers(150, 250))
            offered = [rng.integers(1, vocab, rng.integers(4, 9)).tolist() for _ in range(8)]
            tokens += rng.integers(1, vocab, n_obs).tolist() + offered[0]
            types += [PROMPT] * n_obs + [ACTION] * len(offered[0])
            ends.append(len(tokens) - 1)
            choices.append(offered)
        rewards = np.zeros(len(tokens), np.float32)
        rewards[ends[-1]] = float(row % 2)
        logprobs = np.where(np.array(types) == ACTION, -1.0, 0.0)
        trajs.append(Trajectory(tokens, types, logprobs, rewards, ends, won=bool(row % 2),
                                group_id=row, info={"choices": choices}))
    return pack(trajs, length_buckets=(1024, 2048, 3072), choice_width=choice_width)


def measure_rl_update(path: str, rows: int, turns: int, frozen: list[int]):
    """One PPO update of the real-model recipe (configs/textworld_smollm2.py's learner:
    GAE, value head on the trunk, remat, scanned layers, its minibatches and epochs) on
    `rows` episodes, for each `rl.frozen_layers` in `frozen`: the update's wall time split
    into the old-values / reference pass and the gradient steps, compiles counted apart
    (the first update compiles; the second is timed)."""
    import jax

    from jaxrl_agents.config import load_config
    from jaxrl_agents.models import build_actor_critic, hf_io
    from jaxrl_agents.trainer.rl import make_learner

    for n in frozen:
        cfg = load_config("configs/textworld_smollm2.py", [f"--config.rl.frozen_layers={n}"])
        policy = hf_io.load(path, scan_layers=True, remat=cfg.model.remat)[0]
        ac = build_actor_critic(policy, cfg.model.critic)
        learner = make_learner(cfg, ac, total_updates=10, episodes_per_update=rows)
        learner.updates = learner.value_warmup_updates  # policy and critic both train
        batch = rl_batch(rows, turns, policy.config.vocab_size, cfg.rollout.choice_width)
        state = learner.init_state(ac)
        for attempt in ("first (compiles)", "second"):
            start = time.perf_counter()
            state, m = learner.update(state, batch, jax.random.key(0))
            print(f"RL update, {rows} episodes [{batch.shape[0]} x {batch.shape[1]}], "
                  f"{int(batch.valid.sum())} tokens, rl.frozen_layers={n}, {attempt}: "
                  f"{time.perf_counter() - start:.1f} s (reference / old values "
                  f"{m['perf/prepare_s']:.1f} s, gradient steps {m['perf/train_steps_s']:.1f} s,"
                  f" of which compiling {m['perf/learner_compile_s']:.1f} s)", flush=True)


class CallLog:
    """Times every `Sampler._run` call (one prefill and its decoding) while active and
    prints one line per call: rows with a chunk, the chunk's real tokens, its bucket, the
    cache's index and slots before and after, the longest row."""

    def __init__(self):
        from jaxrl_agents.rollout import sampler

        self.module, self.calls = sampler, []

    def __enter__(self):
        original = self.original = self.module.Sampler._run
        calls, module = self.calls, self.module

        def run(sampler, state, chunks, *args, **kwargs):
            start = time.perf_counter()
            new_state, out = original(sampler, state, chunks, *args, **kwargs)
            jax.block_until_ready(new_state.cache_mask)
            longest = max((len(c) for c in chunks), default=0)
            calls.append(dict(
                seconds=time.perf_counter() - start, rows=sum(1 for c in chunks if len(c)),
                tokens=sum(len(c) for c in chunks),
                bucket=module.bucket(max(longest, 1), sampler.prefill_buckets),
                index=(state.cache_index, new_state.cache_index),
                slots=(state.slots, new_state.slots), longest_row=int(new_state.lengths.max())))
            return new_state, out

        self.module.Sampler._run = run
        return self

    def __exit__(self, *exc):
        self.module.Sampler._run = self.original

    def print(self):
        print("    call  seconds  rows  tokens  chunk bucket  cache index     slots       "
              "longest row")
        for i, c in enumerate(self.calls):
            print(f"    {i:4d}  {c['seconds']:7.1f}  {c['rows']:4d}  {c['tokens']:6d}  "
                  f"{c['bucket']:12d}  {c['index'][0]:5d} -> {c['index'][1]:5d}  "
                  f"{c['slots'][0]:4d} -> {c['slots'][1]:4d}  {c['longest_row']:5d}")


def measure_textworld(episodes: int = 32, calls: bool = False):
    """One batch of `episodes` held-out games per way of playing, real weights (with
    `calls`, the sampled batch's sampler calls printed one by one)."""
    import contextlib
    import dataclasses
    import resource

    import configs.textworld_smollm2 as recipe
    from jaxrl_agents.trainer.loop import Trainer

    cfg = recipe.get_config()
    with cfg.unlocked():
        cfg.rollout.episodes_per_batch = episodes
        cfg.env.num_eval_tasks = episodes
        cfg.output_dir = tempfile.mkdtemp()
    trainer = Trainer(cfg)
    try:
        ids = trainer.layout.eval_ids[:episodes]
        budgets = trainer.schedule.eval_max_steps(ids)
        driver = trainer.eval_driver
        plays = {
            "sampled, T = 1": lambda: driver.run(ids, jax.random.key(0), max_steps=budgets,
                                                 temperature=1.0),
            "greedy by command": lambda: driver.run(ids, greedy=True, max_steps=budgets),
        }
        by_token = dataclasses.replace(driver.greedy, greedy_by_command=False)

        def greedy_by_token():
            saved, driver.greedy = driver.greedy, by_token
            try:
                return driver.run(ids, greedy=True, max_steps=budgets)
            finally:
                driver.greedy = saved

        plays["greedy by token"] = greedy_by_token
        print(f"textworld: {episodes} held-out {cfg.env.name} games, SmolLM2-135M-Instruct, "
              "constrained actions")
        for name, play in plays.items():
            log = CallLog() if calls and name.startswith("sampled") else None
            start = time.perf_counter()
            with CompileCounter() as counter, log or contextlib.nullcontext():
                trajs = play()  # one batch, its compiles counted apart
            wall = time.perf_counter() - start
            compiled = counter.seconds["lowering"] + counter.seconds["compiling"]
            tokens = sum(len(t) for t in trajs)
            actions = sum(t.num_action_tokens for t in trajs)
            won = sum(t.won for t in trajs)
            stats = driver.last_stats
            print(f"  {name:18s} {wall:7.1f} s, of which {compiled:.1f} s lowering and "
                  f"compiling {counter.programs} programs; {tokens} tokens ({actions} action "
                  f"tokens), {tokens / max(wall - compiled, 1e-9):6.1f} tok/s without the "
                  f"compiles, model {stats['rollout/model_s'] / wall:.0%} of wall, "
                  f"{sum(t.num_turns for t in trajs)} turns, won {won}/{len(trajs)}")
            if log:
                log.print()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"  peak resident memory of the process: {peak:.2f} GiB")
    finally:
        trainer.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--decode", action="store_true")
    parser.add_argument("--gemm", action="store_true",
                        help="one layer's matrix products at 1, 8, 32 and 2048 rows")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--learner", action="store_true")
    parser.add_argument("--textworld", action="store_true")
    parser.add_argument("--calls", action="store_true",
                        help="--textworld: print the sampled batch's sampler calls")
    parser.add_argument("--rl-update", action="store_true")
    parser.add_argument("--frozen", default="0,24", help="rl.frozen_layers values (--rl-update)")
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--unrolled", action="store_true", help="scan_layers=False")
    parser.add_argument("--decode-layers", default="scan,unrolled,mesh",
                        help="--decode: the layouts timed side by side (scan, unrolled, mesh)")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)),
                        help="--decode: batch sizes")
    args = parser.parse_args()
    if args.gemm:
        measure_gemm()
    if args.textworld:
        measure_textworld(args.episodes, args.calls)
    if args.gemm or args.textworld:
        if not (args.compile or args.decode or args.learner or args.memory or args.rl_update):
            return
    with tempfile.TemporaryDirectory() as tmp:
        torch_model = smollm2_shape(tmp, args.layers)
        if args.compile:
            measure_compile(tmp, args.episodes, args.rows, args.turns, not args.unrolled)
        if args.decode:
            measure_decode(tmp, torch_model, args.repeats, args.decode_layers.split(","),
                           [int(b) for b in args.batches.split(",")])
        if args.learner:
            measure_learner(tmp, torch_model, args.repeats, not args.unrolled)
        if args.memory:
            del torch_model
            measure_memory(tmp, 32, args.context, not args.unrolled)
        if args.rl_update:
            measure_rl_update(tmp, args.rows, args.turns,
                              [int(n) for n in args.frozen.split(",")])


if __name__ == "__main__":
    main()
