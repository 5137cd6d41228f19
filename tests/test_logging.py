"""RunLogger outputs: metrics.jsonl, TensorBoard events, config/eval JSON, resume."""

import glob
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from jaxrl_agents.logging import RunLogger
from jaxrl_agents.run_records import CONFIG_FILE, EVAL_FILE, METRICS_FILE, WALL_TIME, read_metrics
from jaxrl_agents.stats import success_ci


def read_events(run_dir):
    """All TensorBoard events under run_dir (TFRecord framing: u64 length, u32 crc,
    payload, u32 crc), parsed with tensorboardX's own protobufs."""
    import struct

    from tensorboardX.proto import event_pb2

    events = []
    for path in sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))):
        with open(path, "rb") as f:
            data = f.read()
        pos = 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[pos + 12 : pos + 12 + length])
            events.append(event)
            pos += 12 + length + 4
    return events


def scalars(run_dir):
    """tag -> [(step, value)] from the TensorBoard events of run_dir."""
    out = {}
    for event in read_events(run_dir):
        for v in event.summary.value:
            out.setdefault(v.tag, []).append((event.step, v.simple_value))
    return out


def test_log_writes_jsonl_and_tensorboard(tmp_path):
    run = str(tmp_path / "run")
    with RunLogger(run, total=3, progress_bar=True) as log:
        log.log(1, {"charts/success": np.float32(0.25), "losses/kl": jnp.asarray(0.5),
                    "tokens_per_s": 100, "losses/pg": float("nan"), "stage": "w2-o3-q4"})
        log.log(2, {"charts/success": jnp.float32(0.5), "losses/pg": np.array([1.5])})
        with pytest.raises(TypeError, match="losses/pg"):
            log.log(3, {"losses/pg": np.zeros(3)})
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["charts/success"] == 0.25 and rows[0]["losses/kl"] == 0.5
    assert rows[0]["tokens_per_s"] == 100 and rows[0]["losses/pg"] is None
    assert rows[0]["stage"] == "w2-o3-q4" and WALL_TIME in rows[0]
    assert rows[1]["losses/pg"] == 1.5

    tb = scalars(run)
    assert set(tb) == {"charts/success", "losses/kl", "charts/tokens_per_s", "losses/pg"}
    assert tb["charts/success"] == [(1, 0.25), (2, 0.5)]
    assert tb["losses/pg"] == [(2, 1.5)]  # the NaN of step 1 stays in metrics.jsonl only


def test_progress_bar_postfix(tmp_path):
    log = RunLogger(str(tmp_path), tensorboard=False, jsonl=False, total=5)
    log.log(3, {"charts/success": 0.5, "losses/entropy": 1.25, "other": 7})
    assert log._bar.n == 3
    postfix = log._bar.postfix
    assert "succ=0.5" in postfix and "ent=1.25" in postfix and "other" not in postfix
    log.close()


def test_the_updates_rate_and_eta_leave_out_a_phase_before_them(tmp_path, monkeypatch):
    """An 800 s evaluation, a 400 s SFT that logs its rows at update 0, then two updates of
    100 s each, on a fake clock (tqdm's time patched; no real time is measured): the
    updates' bar reports 200 s and one update per 100 s."""
    clock = {"t": 0.0}
    monkeypatch.setattr("tqdm.std.time", lambda: clock["t"])
    log = RunLogger(str(tmp_path), tensorboard=False, jsonl=False, total=5)
    with log.phase("eval base", 8, "game") as advance:
        for _ in range(8):
            clock["t"] += 100.0
            advance()
    with log.phase("SFT", 4, "step") as advance:
        for _ in range(4):  # SFT writes its rows at update 0, inside its phase
            clock["t"] += 100.0
            log.log(0, {"sft/loss": 1.0})
            advance()
    for step in (1, 2):
        clock["t"] += 100.0
        log.log(step, {"charts/success": 0.5})
    shown = log._bar.format_dict
    assert shown["elapsed"] == pytest.approx(200.0) and shown["n"] == 2
    assert shown["rate"] == pytest.approx(1 / 100.0)
    log.close()


def test_a_phase_has_its_own_bar_under_the_updates_one(tmp_path, capsys):
    log = RunLogger(str(tmp_path), tensorboard=False, jsonl=False, total=5)
    with log.phase("SFT", 4, "epoch") as advance:
        advance()
        advance(2)
    err = capsys.readouterr().err
    assert "SFT" in err and "3/4" in err and log._bar.n == 0
    log.close()
    capsys.readouterr()
    quiet = RunLogger(str(tmp_path), tensorboard=False, jsonl=False, progress_bar=False)
    with quiet.phase("SFT", 4, "epoch") as advance:
        advance()  # no bar: nothing to move, nothing printed
    assert capsys.readouterr().err == ""
    quiet.close()
    alone = RunLogger(str(tmp_path), tensorboard=False, jsonl=False, progress_bar=False,
                      phase_bars=True)  # jaxrl-eval: the phase's bar without the updates'
    with alone.phase("eval base", 8, "game") as advance:
        advance(4)
    assert "eval base" in capsys.readouterr().err and alone._bar is None
    alone.close()
    hidden = RunLogger(str(tmp_path), tensorboard=False, jsonl=False, progress_bar=False,
                       phase_bars=True, is_main=False)
    with hidden.phase("eval base", 8, "game") as advance:
        advance(4)
    assert capsys.readouterr().err == ""


def test_save_config_and_write_eval(tmp_path):
    log = RunLogger(str(tmp_path), tensorboard=False, progress_bar=False)
    cfg = base.get_config()
    log.save_config(cfg)
    with open(tmp_path / CONFIG_FILE) as f:
        saved = json.load(f)
    assert saved["rollout"]["stop_strings"] == ["\n"]
    assert saved["rl"]["learning_rate"] == cfg.rl.learning_rate

    log.write_eval("sft", success_ci([1, 0, 0, 0]))
    log.write_eval("rl", {"mean": np.float64(0.5), "n": np.int64(4)}, step=10)
    log.write_eval("rl", success_ci([1, 1, 1, 0]), step=20)
    with open(tmp_path / EVAL_FILE) as f:
        evals = json.load(f)
    assert evals["sft"]["mean"] == 0.25 and evals["rl"]["mean"] == 0.75
    assert evals["per_update"]["10"]["rl"] == {"mean": 0.5, "n": 4}
    assert set(evals["per_update"]) == {"10", "20"}
    log.close()


def test_truncate_on_resume_equals_uninterrupted(tmp_path):
    def metrics(step):
        return {"charts/success": step / 10, "losses/pg": 1.0 / step}

    full = str(tmp_path / "full")
    with RunLogger(full, progress_bar=False) as log:
        for s in range(1, 9):
            log.log(s, metrics(s))

    run = str(tmp_path / "killed")
    with RunLogger(run, progress_bar=False) as log:
        for s in range(1, 7):  # checkpoint at 4, killed after logging 6
            log.log(s, metrics(s))
            if s == 4:
                log.write_eval("rl", {"mean": 0.4}, step=4)
            if s == 6:
                log.write_eval("rl", {"mean": 0.6}, step=6)
    with open(os.path.join(run, METRICS_FILE), "a") as f:
        f.write('{"step": 7, "charts/succ')  # a torn line, as SIGKILL leaves
    with RunLogger(run, progress_bar=False, resume_step=4) as log:
        for s in range(5, 9):
            log.log(s, metrics(s))

    def strip(rows):
        return [{k: v for k, v in r.items() if k != WALL_TIME} for r in rows]

    assert strip(read_metrics(run)) == strip(read_metrics(full))
    # TensorBoard is told to drop the killed run's events after step 4.
    starts = [e.step for e in read_events(run) if e.session_log.status == 1]  # START
    assert starts == [5]
    with open(os.path.join(run, EVAL_FILE)) as f:
        assert set(json.load(f)["per_update"]) == {"4"}


def test_non_main_process_writes_nothing(tmp_path):
    run = str(tmp_path / "run")
    with RunLogger(run, is_main=False, total=3) as log:
        assert log.log(1, {"charts/success": 1.0}) == {}
        log.save_config(base.get_config())
        log.write_eval("rl", {"mean": 1.0})
        assert log.plot() == []
    assert os.listdir(tmp_path) == []


def test_eval_episode_files_are_named_by_stage_and_update():
    from jaxrl_agents.logging import eval_episodes_name

    assert eval_episodes_name("rl") == "rl.jsonl"
    assert eval_episodes_name("rl", step=20) == "rl-update20.jsonl"
    assert eval_episodes_name("stage:toy:count-2", step=3) == "stage_toy_count-2-update3.jsonl"
