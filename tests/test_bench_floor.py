"""bench/floor.py: the decode floor against a hand calculation."""

import json
from types import SimpleNamespace

import pytest

from bench.floor import decode_floor, forward_flops, layer_params_of, main, update_floor


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


def test_update_floor_counts_each_part_of_a_ppo_update_by_hand():
    # 10 layers of 1e6 parameters, attention width 100, 1,000 tokens attending 50 earlier
    # ones on average: per token 2e6 + 4 * 100 * 50 * 10 = 2.2e6 FLOPs, 2.2e9 for the pass
    shape = dict(tokens=1000, mean_context=50, layer_params=10**6, layers=10,
                 attention_width=100)
    assert forward_flops(**shape) == pytest.approx(2.2e9)
    # 4 of 10 layers frozen, 2 PPO epochs, remat: at 1 GFLOP/s a pass takes 2.2 s
    floor = update_floor(**shape, frozen_layers=4, ppo_epochs=2, recompute=True,
                         peak_flops=1e9)
    assert floor.rollout_s == pytest.approx(2.2)
    assert floor.prepare_s == pytest.approx(2.2 * (0.4 + 2 * 0.6))  # frozen once, the rest twice
    assert floor.train_s == pytest.approx(2.2 * 2 * 0.6 * 4)  # forward, again, backward (2x)
    assert floor.total_s == pytest.approx(2.2 * (1 + 1.6 + 4.8))
    # nothing frozen and no remat: `prepare` is two whole passes, an epoch three
    plain = update_floor(**shape, frozen_layers=0, ppo_epochs=1, recompute=False,
                         peak_flops=1e9)
    assert (plain.prepare_s, plain.train_s) == (pytest.approx(4.4), pytest.approx(6.6))
    # the rollout's output of the frozen layers reused: `prepare` runs the rest twice only
    reused = update_floor(**shape, frozen_layers=4, ppo_epochs=2, recompute=True,
                          peak_flops=1e9, frozen_reused=True)
    assert reused.prepare_s == pytest.approx(2.2 * 2 * 0.6)


def test_layer_params_of_smollm2_135m():
    # 30 layers of D=576, 9 query / 3 kv heads of 64, F=1536: 106.2M outside the embedding
    shape = SimpleNamespace(hidden_size=576, head_dim=64, num_heads=9, num_kv_heads=3,
                            intermediate_size=1536, num_layers=30)
    assert layer_params_of(shape) == 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536)
    assert layer_params_of(shape) == 106_168_320


def test_command_line_sets_a_runs_timings_against_its_floor(tmp_path, capsys):
    """`python bench/floor.py RUN_DIR`: the model's shape from its checkpoint, the update's
    tokens, episodes and timings from metrics.jsonl, the RL settings from config.json."""
    from tests.models.hf_helpers import make_hf_model

    checkpoint = tmp_path / "model"
    make_hf_model("llama", hidden=32, layers=2, heads=4, kv_heads=2).save_pretrained(checkpoint)
    run = tmp_path / "run"
    run.mkdir()
    config = {"model": {"hf_path": str(checkpoint), "remat": "full"},
              "rl": {"frozen_layers": 1, "ppo_epochs": 2}}
    (run / "config.json").write_text(json.dumps(config))
    rows = [{"step": 0, "sft/train_loss": 1.0},
            {"step": 1, "perf/tokens": 4000, "perf/tokens_per_s": 1.0, "rollout/episodes": 4,
             "perf/rollout_s": 3.0, "perf/update_s": 9.0, "perf/prepare_s": 4.0,
             "perf/train_steps_s": 5.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    main([str(run), "--peak-gflops", "1"])
    out = capsys.readouterr().out
    # 2 layers: attention 2 * 32 * 32 * 2 (4 heads and 2 kv heads of 8), MLP 3 * 32 * 72
    layer = 2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 72
    floor = update_floor(tokens=4000, mean_context=500, layer_params=2 * layer, layers=2,
                         attention_width=32, frozen_layers=1, ppo_epochs=2, recompute=True,
                         peak_flops=1e9)
    assert "update 1: 4 episodes, 4000 tokens (mean context >= 500)" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines()[2:]}
    assert float(lines["rollout"][2]) == pytest.approx(floor.rollout_s, abs=0.05)
    assert float(lines["prepare"][2]) == pytest.approx(floor.prepare_s, abs=0.05)
    assert float(lines["gradient"][3]) == pytest.approx(floor.train_s, abs=0.05)
    assert float(lines["update"][1]) == pytest.approx(12.0)


def test_command_line_names_a_run_without_timings(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "sft/train_loss": 1.0}))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match="no update with perf/"):
        main([str(tmp_path)])
