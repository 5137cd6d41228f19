"""Token-level GAE: our jitted kernel against per-token loops like the peers use.

`ours` is `kernels.gae` as the trainer calls it: on CPU the C++ kernel of
`kernels.native` when it built, else the pure-JAX scan; the scan is timed as well
(`ours, scan`), so both paths of the kernel are on record.

Peers, measured in the same run on the same inputs:
  numpy-loop: the paper's style: per episode, a Python loop over its tokens on NumPy
              scalars (made correct: masked, and the last action token included);
  numpy-batch: a stronger NumPy peer, one loop over tokens with NumPy ops over the batch;
  torch-loop: verl's `compute_gae_advantage_return` loop over tokens in PyTorch, in its
              multi-turn form that skips observation tokens.
All three compute the same masked GAE (checked below). Prints tokens/s, the ratios, and
how close our kernel is to the memory-bandwidth bound (20 bytes per token: rewards,
values, mask in; advantages, returns out; float32).
"""

import os
import sys

import jax
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import copy_bandwidth_gbs, median_seconds, table  # noqa: E402
from jaxrl_agents.kernels import gae, native  # noqa: E402
from jaxrl_agents.kernels.gae import _gae_scan  # noqa: E402

GAMMA, LAM, BATCH = 0.99, 0.95, 64
BYTES_PER_TOKEN = 5 * 4


def numpy_loop(rewards, values, mask):
    adv = np.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        r, v, m = rewards[b], values[b], mask[b]
        next_value, last_gae = 0.0, 0.0
        for t in reversed(range(len(r))):
            if m[t]:
                last_gae = r[t] + GAMMA * next_value - v[t] + GAMMA * LAM * last_gae
                adv[b, t] = last_gae
                next_value = v[t]
    return adv, (adv + values) * mask


def numpy_batch_loop(rewards, values, mask):
    batch, length = rewards.shape
    next_value = np.zeros(batch, np.float32)
    last_gae = np.zeros(batch, np.float32)
    adv = np.zeros_like(rewards)
    for t in reversed(range(length)):
        m = mask[:, t]
        delta = rewards[:, t] + GAMMA * next_value - values[:, t]
        new_gae = delta + GAMMA * LAM * last_gae
        next_value = values[:, t] * m + (1 - m) * next_value
        last_gae = new_gae * m + (1 - m) * last_gae
        adv[:, t] = last_gae * m
    return adv, (adv + values) * mask


def torch_loop(rewards, values, mask):
    with torch.no_grad():
        batch, length = rewards.shape
        next_value = torch.zeros(batch)
        last_gae = torch.zeros(batch)
        reversed_adv = []
        for t in reversed(range(length)):
            m = mask[:, t]
            delta = rewards[:, t] + GAMMA * next_value - values[:, t]
            new_gae = delta + GAMMA * LAM * last_gae
            next_value = values[:, t] * m + (1 - m) * next_value
            last_gae = new_gae * m + (1 - m) * last_gae
            reversed_adv.append(last_gae)
        adv = torch.stack(reversed_adv[::-1], dim=1) * mask
        return adv, (adv + values) * mask


def make_inputs(length, seed=0):
    rng = np.random.default_rng(seed)
    # Multi-turn layout: runs of 8-40 observation tokens, then 4-16 action tokens.
    mask = np.zeros((BATCH, length), np.float32)
    for b in range(BATCH):
        t = 0
        while t < length:
            t += rng.integers(8, 41)
            run = rng.integers(4, 17)
            mask[b, t : t + run] = 1.0
            t += run
    rewards = (rng.random((BATCH, length)) < 0.01).astype(np.float32)
    values = rng.normal(size=(BATCH, length)).astype(np.float32)
    return rewards, values, mask


def main():
    print(
        f"jax {jax.__version__} ({jax.devices()[0].platform}), torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs, batch {BATCH}"
    )
    bandwidth = copy_bandwidth_gbs()
    print(
        f"measured copy bandwidth: {bandwidth:.1f} GB/s -> bound "
        f"{bandwidth * 1e9 / BYTES_PER_TOKEN / 1e6:.0f} M tokens/s at {BYTES_PER_TOKEN} B/token"
    )
    print(f"ours = {'C++ kernel (kernels.native)' if native.available() else 'lax.scan'}")
    scan = jax.jit(lambda r, v, m: _gae_scan(r, v, m, jax.numpy.zeros(r.shape[0]), GAMMA, LAM))
    rows = []
    for length in (1024, 4096, 16384):
        r, v, m = make_inputs(length)
        rj, vj, mj = (jax.device_put(x) for x in (r, v, m))
        rt, vt, mt = (torch.from_numpy(x) for x in (r, v, m))

        ours = lambda: jax.block_until_ready(gae(rj, vj, mj, GAMMA, LAM))  # noqa: B023
        ours_scan = lambda: jax.block_until_ready(scan(rj, vj, mj))  # noqa: B023
        adv_ours, _ = ours()
        np.testing.assert_allclose(ours_scan()[0], adv_ours, rtol=1e-4, atol=1e-4)
        adv_np, _ = numpy_loop(r, v, m)
        adv_pt, _ = torch_loop(rt, vt, mt)
        adv_nb, _ = numpy_batch_loop(r, v, m)
        np.testing.assert_allclose(adv_ours, adv_np, rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(adv_nb, adv_np, rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(adv_pt.numpy(), adv_np, rtol=1e-3, atol=1e-3)

        tokens = BATCH * length
        t_ours = median_seconds(ours, repeats=7, min_time=0.2)
        t_scan = median_seconds(ours_scan, repeats=7, min_time=0.2)
        reps = 3 if length <= 4096 else 1
        t_np = median_seconds(lambda: numpy_loop(r, v, m), repeats=1, warmup=0)  # noqa: B023
        t_nb = median_seconds(lambda: numpy_batch_loop(r, v, m), repeats=reps, warmup=0)  # noqa: B023
        t_pt = median_seconds(lambda: torch_loop(rt, vt, mt), repeats=reps, warmup=0)  # noqa: B023
        bound = tokens * BYTES_PER_TOKEN / (bandwidth * 1e9)
        rows.append(
            [
                length,
                f"{tokens / t_ours / 1e6:.1f}M",
                f"{tokens / t_scan / 1e6:.1f}M",
                f"{tokens / t_np / 1e6:.2f}M",
                f"{tokens / t_nb / 1e6:.2f}M",
                f"{tokens / t_pt / 1e6:.2f}M",
                f"{t_np / t_ours:.0f}x",
                f"{t_nb / t_ours:.0f}x",
                f"{t_pt / t_ours:.0f}x",
                f"{bound / t_ours:.0%}",
            ]
        )
    headers = [
        "T",
        "ours tok/s",
        "ours, scan",
        "numpy-loop",
        "numpy-batch",
        "torch-loop",
        "vs numpy",
        "vs numpy-batch",
        "vs torch",
        "of bw bound",
    ]
    print(table(rows, headers))


if __name__ == "__main__":
    main()
