"""bench/floor.py: the decode floor against a hand calculation."""

import pytest

from bench.floor import decode_floor


def test_floor_is_prefill_plus_the_slower_of_compute_and_weight_reads_per_step():
    # 1e6 layer parameters, a 100 x 10 output layer, 4 MB of weights; 1 GFLOP/s, 1 GB/s
    common = dict(prompt=10, new=5, layer_params=10**6, vocab=100, hidden=10,
                  weight_bytes=4 * 10**6, peak_flops=1e9, bandwidth=1e9)
    one = decode_floor(batch=1, **common)
    # prefill: 10 tokens x 2e6 + one row of logits 2e3 FLOPs = 20.002e6 FLOPs at 1e9 FLOP/s
    assert one.prefill_s == pytest.approx(20.002e-3)
    # a step at batch 1: 2.002e6 FLOPs (2.002 ms) against 4 MB read (4 ms): memory-bound
    assert one.step_s == pytest.approx(4e-3) and not one.compute_bound
    assert one.steps == 4 and one.total_s == pytest.approx(20.002e-3 + 4 * 4e-3)
    # at batch 4 a step's FLOPs (8.008 ms) outweigh its weight reads
    four = decode_floor(batch=4, **common)
    assert four.step_s == pytest.approx(8.008e-3) and four.compute_bound
    assert four.prefill_s == pytest.approx(4 * 20.002e-3)
