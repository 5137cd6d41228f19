"""The fastest a greedy decode, or an RL update, can run on a machine, from its shapes and
two measured rates: a GEMM's FLOP rate and the memory's copy bandwidth. The floors import
no JAX; the command line (an update's floor against a run's measured times) reads the
model's shape through `jaxrl_agents`:

    python bench/floor.py RUN_DIR [--peak-gflops 253] [--step N]

A decoder of P non-embedding parameters and a V x D output layer does, per token, 2P FLOPs
in its layers and 2VD in the output layer where logits are needed; a decode step also
reads every weight once (a model larger than the caches cannot keep them between steps).
Attention over the cache is left out: the floor is a lower bound on the time, so the
ratio `reference_seconds / floor` it gives is the most any implementation can reach.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecodeFloor:
    prefill_s: float  # the prompt's tokens through the layers, one row of logits each
    step_s: float  # one decode step: max(its FLOPs at the peak, its weight bytes at bandwidth)
    steps: int  # decode steps after the prefill (new tokens - 1)
    compute_bound: bool  # whether a step's FLOPs take longer than its weight reads

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.steps * self.step_s


def decode_floor(*, batch: int, prompt: int, new: int, layer_params: int, vocab: int,
                 hidden: int, weight_bytes: int, peak_flops: float,
                 bandwidth: float) -> DecodeFloor:
    """The least time for `batch` rows of `prompt` tokens to decode `new` tokens greedily.

    layer_params: parameters outside the embedding table (P); vocab, hidden: the output
    layer's V and D; weight_bytes: every weight's bytes (read once per decode step);
    peak_flops: FLOP/s; bandwidth: bytes/s. The first new token comes from the prefill's
    logits, each further one from a decode step of `batch` tokens.
    """
    per_token_layers = 2 * layer_params
    per_token_logits = 2 * vocab * hidden
    prefill = batch * (prompt * per_token_layers + per_token_logits) / peak_flops
    step_compute = batch * (per_token_layers + per_token_logits) / peak_flops
    step_memory = weight_bytes / bandwidth
    return DecodeFloor(prefill_s=prefill, step_s=max(step_compute, step_memory),
                       steps=max(new - 1, 0), compute_bound=step_compute >= step_memory)


@dataclass(frozen=True)
class UpdateFloor:
    """Seconds of each part of an RL update at the peak FLOP rate (matmul work only)."""

    rollout_s: float  # every token through the whole model once (sampling)
    prepare_s: float  # old values and reference log-probs (`RLLearner.update`'s `prepare`)
    train_s: float  # the gradient steps of every PPO epoch

    @property
    def total_s(self) -> float:
        return self.rollout_s + self.prepare_s + self.train_s


def forward_flops(*, tokens: int, mean_context: float, layer_params: int, layers: int,
                  attention_width: int) -> float:
    """FLOPs of one pass of `tokens` tokens through the layers: 2P for the weights (P
    non-embedding parameters) and, per layer, 4 * N * H FLOPs per earlier token attended
    (scores and the product with the values; attention_width = N * H), `mean_context`
    tokens attended on average. The output layer is left out (an update needs logits only
    at its few action tokens)."""
    per_token = 2 * layer_params + 4 * attention_width * mean_context * layers
    return tokens * per_token


def update_floor(*, tokens: int, mean_context: float, layer_params: int, layers: int,
                 attention_width: int, frozen_layers: int, ppo_epochs: int,
                 recompute: bool, peak_flops: float,
                 frozen_reused: bool = False) -> UpdateFloor:
    """The least time of one PPO update over `tokens` tokens (`forward_flops`' arguments).

    The rollout runs the whole model once. `prepare` runs the frozen layers once (not at
    all when the rollout's output of them is `frozen_reused`) and the trained layers twice
    (the critic's values and the reference's log-probs; without frozen layers the whole
    model twice). Each PPO epoch runs the trained layers forward (and again
    in the backward pass with `recompute`, i.e. remat) and backward (twice a forward's
    FLOPs: the gradients of the inputs and of the weights).
    """
    whole = forward_flops(tokens=tokens, mean_context=mean_context, layer_params=layer_params,
                          layers=layers, attention_width=attention_width)
    trained = (layers - frozen_layers) / layers
    prepare = (0 if frozen_reused else frozen_layers / layers) + 2 * trained
    train = ppo_epochs * trained * (3 + (1 if recompute else 0))
    return UpdateFloor(rollout_s=whole / peak_flops, prepare_s=prepare * whole / peak_flops,
                       train_s=train * whole / peak_flops)


def layer_params_of(cfg) -> int:
    """Non-embedding parameters of a decoder's layers (a `ModelConfig`): attention's four
    projections and the gated MLP's three (norms and biases are too few to count)."""
    d, h = cfg.hidden_size, cfg.head_dim
    attention = 2 * d * cfg.num_heads * h + 2 * d * cfg.num_kv_heads * h
    return cfg.num_layers * (attention + 3 * d * cfg.intermediate_size)


def _update_record(run_dir: str, step: int | None) -> dict:
    """The metrics row of update `step` (the first with timings when None)."""
    from jaxrl_agents.run_records import read_metrics

    rows = [r for r in read_metrics(run_dir)
            if "perf/rollout_s" in r and (step is None or r["step"] == step)]
    if not rows:
        raise SystemExit(f"{run_dir}/metrics.jsonl: no update with perf/* timings"
                         + ("" if step is None else f" at step {step}"))
    return rows[0]


def main(argv=None) -> None:
    import argparse
    import json
    import os

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--peak-gflops", type=float, default=253.0,
                        help="the machine's best GEMM rate (bench/real_model.py --gemm)")
    parser.add_argument("--step", type=int, default=None, help="the update (default: first)")
    args = parser.parse_args(argv)

    from jaxrl_agents.models import hf_io

    row = _update_record(args.run_dir, args.step)
    with open(os.path.join(args.run_dir, "config.json")) as f:
        cfg = json.load(f)
    model = hf_io.read_config(hf_io.checkpoint_directory(cfg["model"]["hf_path"]))
    # Older runs have no token count: the rate over the update's wall time gives it.
    tokens = row.get("perf/tokens") or round(
        row["perf/tokens_per_s"] * (row["perf/rollout_s"] + row["perf/update_s"]))
    episodes = row["rollout/episodes"]
    # Episodes of equal length attend least on average (half their length), so this mean
    # keeps the floor a lower bound whatever the real lengths.
    mean_context = tokens / episodes / 2
    floor = update_floor(
        tokens=tokens, mean_context=mean_context, layer_params=layer_params_of(model),
        layers=model.num_layers, attention_width=model.num_heads * model.head_dim,
        frozen_layers=cfg["rl"]["frozen_layers"], ppo_epochs=cfg["rl"]["ppo_epochs"],
        recompute=cfg["model"]["remat"] != "none", peak_flops=args.peak_gflops * 1e9,
        frozen_reused=bool(row.get("perf/frozen_output_reused", 0)))
    parts = [("rollout", row["perf/rollout_s"], floor.rollout_s),
             ("prepare", row["perf/prepare_s"], floor.prepare_s),
             ("gradient steps", row["perf/train_steps_s"], floor.train_s)]
    parts.append(("update", sum(measured for _, measured, _ in parts), floor.total_s))
    print(f"{args.run_dir}, update {row['step']}: {episodes} episodes, {tokens} tokens "
          f"(mean context >= {mean_context:.0f}), floor at {args.peak_gflops:.0f} GFLOP/s")
    print(f"{'part':16s} {'measured s':>10s} {'floor s':>8s} {'ratio':>6s}")
    for part, measured, least in parts:
        print(f"{part:16s} {measured:10.1f} {least:8.1f} {measured / least:6.2f}")


if __name__ == "__main__":
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
