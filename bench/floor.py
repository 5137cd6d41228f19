"""The fastest a greedy decode can run on a machine, from its shapes and two measured
rates: a GEMM's FLOP rate and the memory's copy bandwidth. This module imports no JAX.

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
