"""The memory check at the start of a run (jaxrl_agents/preflight.py).

A config whose planned peak is clearly over the machine's memory is refused with a message
naming the phase, the biggest term and the setting that reduces it; a config that fits
starts; `memory_check = False` turns the check off. Plans come from `jax.eval_shape`:
nothing here allocates what it plans (the refused config plans about 50,000 GiB).
"""

import os

import pytest

from jaxrl_agents import cli, plan, preflight
from jaxrl_agents.config import load_config
from tests import test_plan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = os.path.join(ROOT, "configs", "base.py")
TINY = {
    **test_plan.TINY,  # the planner tests' tiny model and batch
    "tokenizer.vocab_size": 256,
    "sft.batch_size": 4,  # the training step peaks, not SFT
}
# 2^24 episodes in one minibatch: the training step's activations alone plan ~50,000 GiB.
HUGE = {"rollout.episodes_per_batch": 2**24, "rl.minibatch_size": 2**24}


def overrides(**extra) -> list[str]:
    return [f"{k}={v}" for k, v in dict(TINY, **extra).items()]


def config(**extra):
    return load_config(BASE, overrides(**extra))


@pytest.fixture(scope="module")
def tiny_plan():
    cfg = config()
    return plan.make_plan(cfg, preflight.planned_model(cfg), preflight.run_mesh(cfg))


def test_a_config_no_machine_holds_is_refused_naming_its_biggest_term_and_setting():
    with pytest.raises(preflight.MemoryCheckError) as caught:
        preflight.check_memory(config(**HUGE))  # this machine's own capacity
    message = str(caught.value)
    assert message.startswith("memory check: planned peak ")
    assert "(training step)" in message
    assert "biggest term: activations (saved for backward)" in message
    assert 'model.remat="full"' in message and "rl.grad_accum" in message
    assert "--config.memory_check=false" in message


def test_the_message_gives_peak_capacity_term_setting_and_the_plan_command(tiny_plan):
    message = preflight.refusal(tiny_plan, plan.GIB // 1024, "a test's capacity")
    phase, peak, term, size = preflight.biggest_term(tiny_plan)
    assert phase == "training step" and term == "activations (saved for backward)"
    lines = message.splitlines()
    assert lines[0] == (f"memory check: planned peak {peak / plan.GIB:.2f} GiB per device "
                        "(training step), over 1.1 x the 0.00 GiB this machine has (a test's "
                        "capacity).")
    assert lines[1] == f"  biggest term: {term}, {size / plan.GIB:.2f} GiB"
    assert lines[2].startswith('  reduce it with: model.remat="full"')
    assert lines[-2] == ("  every term: jaxrl-plan --config FILE [same overrides] --mesh "
                         f"data=1,fsdp=1,tensor=1 --device {plan.GIB // 1024}")


def test_playing_games_is_judged_by_its_own_peak_and_rollout_settings(tiny_plan):
    _, peak, term, _ = preflight.biggest_term(tiny_plan, ("evaluation",))
    assert peak < tiny_plan.peak  # no learner state, no training step
    assert term in ("KV cache (rollout)", "rollout scratch (one prefill)")
    message = preflight.refusal(tiny_plan, peak // 2, "a test's capacity", ("evaluation",))
    assert "(evaluation)" in message and "rollout.episodes_per_batch" in message
    # Over the training step's peak but under the evaluation's: an evaluation starts.
    assert preflight.refusal(tiny_plan, peak, "a test's capacity", ("evaluation",)) is None
    assert preflight.refusal(tiny_plan, peak, "a test's capacity") is not None


def test_a_supervised_phase_names_its_own_settings():
    phases = {"training step": {"optimizer state": 1},
              "SFT": {"optimizer state": 5 * plan.GIB, "activations (saved for backward)": 1}}
    result = plan.Plan({}, 1, 1, {"mesh": {"data": 1}}, {"SFT": 5 * plan.GIB + 1}, phases)
    message = preflight.refusal(result, plan.GIB, "a test's capacity")
    assert "(SFT)" in message and "biggest term: optimizer state" in message
    assert 'sft.optimizer_state="int8"' in message


def test_every_term_of_the_plan_has_a_setting_that_reduces_it(tiny_plan):
    cfg = config(**{"pretrain.episodes_per_task": 1})  # adds the language-model pretraining
    result = plan.make_plan(cfg, preflight.planned_model(cfg), preflight.run_mesh(cfg))
    assert set(result.phases) == {"training step", "rollout", "evaluation",
                                  "language-model pretraining", "SFT"}
    for phase, terms in result.phases.items():
        for term in terms:
            assert (phase, term) in preflight.PHASE_SETTINGS or term in preflight.SETTINGS
    assert result.train_peak == sum(result.phases["training step"].values())
    assert result.rollout_peak == sum(result.phases["rollout"].values())
    assert result.supervised_peaks["SFT"] == sum(result.phases["SFT"].values())


def test_a_config_that_fits_starts_and_one_near_the_limit_warns(tiny_plan, capsys):
    cfg = config()
    assert preflight.check_memory(cfg) is not None  # this machine: well under its memory
    assert preflight.check_memory(cfg, capacity=(2 * tiny_plan.peak, "test")) is not None
    assert capsys.readouterr().err == ""
    # Within the margin: starts, with a warning.
    assert preflight.refusal(tiny_plan, int(tiny_plan.peak / 1.05), "test") is None
    preflight.check_memory(cfg, capacity=(int(tiny_plan.peak / 1.05), "test"))
    assert "the run may run out of memory" in capsys.readouterr().err
    with pytest.raises(preflight.MemoryCheckError):
        preflight.check_memory(cfg, capacity=(int(tiny_plan.peak / 1.2), "test"))


def test_memory_check_false_skips_the_check():
    assert preflight.check_memory(config(memory_check=False, **HUGE)) is None


def test_the_commands_print_the_refusal_without_a_traceback(tmp_path, capsys):
    args = ["--config", BASE, *(f"--config.{o}" for o in overrides(**HUGE)),
            f"--config.output_dir={tmp_path}"]
    assert cli.train_main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxrl-train: memory check: planned peak ") and "Traceback" not in err
    assert os.listdir(tmp_path) == []  # stopped before the run directory was made
    assert cli.eval_main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxrl-eval: memory check: planned peak ") and "(evaluation)" in err


def test_an_evaluation_restoring_a_checkpoint_counts_the_learner_state(tmp_path):
    cfg = config(output_dir=str(tmp_path), name="run")
    assert preflight.eval_phases(cfg, None, False) == ("evaluation",)  # pretrained weights
    os.makedirs(tmp_path / "run" / "checkpoints" / "0")
    assert preflight.eval_phases(cfg, None, False) == ("rollout",)
    assert preflight.eval_phases(cfg, None, True) == ("evaluation",)


def test_capacity_is_read_from_meminfo_and_the_cgroup_limit(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683664 kB\nMemAvailable:   17967188 kB\n")
    assert preflight.host_available_bytes(str(meminfo)) == 17967188 * 1024
    assert preflight.host_available_bytes(str(tmp_path / "absent")) is None
    v2 = tmp_path / "v2"
    (v2 / "job").mkdir(parents=True)
    (v2 / "job" / "memory.max").write_text("8000\n")
    (v2 / "job" / "memory.current").write_text("3000\n")
    (tmp_path / "cgroup").write_text("0::/job\n")
    assert preflight.cgroup_room_bytes(str(tmp_path / "cgroup"), str(v2)) == 5000
    (v2 / "job" / "memory.max").write_text("max\n")
    assert preflight.cgroup_room_bytes(str(tmp_path / "cgroup"), str(v2)) is None
    v1 = tmp_path / "v1" / "memory" / "job"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # unlimited
    (v1 / "memory.usage_in_bytes").write_text("3000\n")
    (tmp_path / "cgroup").write_text("4:memory:/job\n1:cpu:/\n")
    assert preflight.cgroup_room_bytes(str(tmp_path / "cgroup"), str(tmp_path / "v1")) is None
    (v1 / "memory.limit_in_bytes").write_text("10000\n")
    assert preflight.cgroup_room_bytes(str(tmp_path / "cgroup"), str(tmp_path / "v1")) == 7000


def test_an_accelerators_capacity_is_xlas_bytes_limit(monkeypatch):
    class FakeGPU:
        platform = "gpu"
        device_kind = "NVIDIA H100 80GB HBM3"

        def memory_stats(self):
            return {"bytes_limit": 60 * plan.GIB, "bytes_in_use": 0}

    monkeypatch.setattr(preflight.jax, "local_devices", lambda: [FakeGPU()])
    assert preflight.device_capacity() == (60 * plan.GIB,
                                           "NVIDIA H100 80GB HBM3, XLA's bytes_limit")
    monkeypatch.setattr(FakeGPU, "memory_stats", lambda self: None)
    assert preflight.device_capacity() is None  # unknown: no check
