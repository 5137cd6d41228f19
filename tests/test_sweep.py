"""jaxrl-sweep: grid expansion and run names, validation, printed commands, and a real
local sweep of two tiny toy runs (plus one that fails) that a second invocation skips
or resumes."""

import json
import os
import shlex
import subprocess
import sys

import pytest

from jaxrl_agents import sweep as sweep_lib
from jaxrl_agents.cli import sweep_main
from jaxrl_agents.config import load_config, split_config_args
from jaxrl_agents.sweep import SweepError, build_sweep, run_name

TOY = "configs/toy_tiny.py"
# The toy config made as small as tests/trainer/test_loop.py makes it, one RL update.
TINY = {
    "env.size": 2,
    "env.num_train_tasks": 4,
    "env.num_eval_tasks": 4,
    "rollout.episodes_per_batch": 4,
    "rl.episodes_per_epoch": 4,
    "rl.epochs": 1,
    "rl.minibatch_size": 4,
    "rl.ppo_epochs": 1,
    "sft.num_trajectories": 4,
    "sft.epochs": 1,
    "sft.batch_size": 4,
    "logging.progress_bar": False,
    "logging.tensorboard": False,
    "logging.plots": False,
}


def _write_sweep(tmp_path, spec, filename="sweep.py"):
    path = tmp_path / filename
    path.write_text(f"def get_sweep():\n    return {spec!r}\n")
    return str(path)


# --- pure: expansion and names -----------------------------------------------------------


def test_grid_expands_to_the_cartesian_product_in_written_order():
    sweep = build_sweep(
        {
            "name": "s",
            "config": TOY,
            "overrides": {"rl.epochs": 2},
            "grid": {"rl.learning_rate": [1e-4, 3e-4], "seed": [0, 1, 2]},
        }
    )
    want = [(lr, seed) for lr in (1e-4, 3e-4) for seed in (0, 1, 2)]
    assert [(r.overrides["rl.learning_rate"], r.overrides["seed"]) for r in sweep.runs] == want
    assert all(r.overrides["rl.epochs"] == 2 for r in sweep.runs)
    assert [r.name for r in sweep.runs] == [
        f"rl.learning_rate={lr},seed={seed}" for lr in ("1e-4", "3e-4") for seed in (0, 1, 2)
    ]
    assert (sweep.name, sweep.config) == ("s", TOY)


def test_run_names_are_readable_file_safe_and_distinct():
    assert run_name({"rl.learning_rate": 1e-4, "seed": 1}) == "rl.learning_rate=1e-4,seed=1"
    assert run_name({"kl.coef": 0.05, "model.qkv_bias": True}) == "kl.coef=0.05,model.qkv_bias=True"
    assert run_name({"rollout.length_buckets": (256, 512)}) == "rollout.length_buckets=256_512"
    assert run_name({"env.name": "a/b c"}) == "env.name=a_b_c"
    long_a = run_name({"model.hf_path": "x" * 200 + "a"})
    long_b = run_name({"model.hf_path": "x" * 200 + "b"})
    assert long_a != long_b
    assert len(long_a) == len(long_b) == sweep_lib.MAX_NAME_LEN
    for name in (long_a, "rl.learning_rate=1e-4,seed=1"):
        assert "/" not in name and sweep_lib.safe_name(name) == name


def test_a_run_list_takes_given_names_or_derives_them():
    sweep = build_sweep(
        {
            "name": "s",
            "config": TOY,
            "runs": [{"name": "low", "rl.learning_rate": 1e-5}, {"rl.learning_rate": 1e-3}],
        }
    )
    assert [r.name for r in sweep.runs] == ["low", "rl.learning_rate=1e-3"]
    assert [r.overrides for r in sweep.runs] == [
        {"rl.learning_rate": 1e-5},
        {"rl.learning_rate": 1e-3},
    ]


def test_overrides_become_the_values_jaxrl_train_parses(tmp_path):
    sweep = build_sweep(
        {
            "name": "s",
            "config": TOY,
            "runs": [
                {
                    "rl.learning_rate": 1.2345678901234e-4,
                    "rollout.length_buckets": (128, 512),
                    "env.reward_density": "sparse",
                    "model.tie_embeddings": False,
                    "seed": 7,
                }
            ],
        }
    )
    (run,) = sweep.runs
    path, overrides, rest = split_config_args(sweep_lib.train_args(sweep, run, str(tmp_path)))
    cfg = load_config(path, overrides)
    assert rest == []
    assert cfg.rl.learning_rate == 1.2345678901234e-4
    assert cfg.rollout.length_buckets == (128, 512)
    assert cfg.env.reward_density == "sparse" and cfg.model.tie_embeddings is False
    assert cfg.seed == 7 and cfg.name == run.name
    assert cfg.output_dir == os.path.join(str(tmp_path), "s")


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"config": TOY, "grid": {"seed": [0]}}, "'name'"),
        ({"name": "s", "grid": {"seed": [0]}}, "'config'"),
        ({"name": "s", "config": TOY}, "exactly one of"),
        ({"name": "s", "config": TOY, "grid": {"seed": [0]}, "runs": [{}]}, "exactly one of"),
        ({"name": "s", "config": TOY, "grid": {"seed": []}}, "'seed'"),
        ({"name": "s", "config": TOY, "grid": {"env.name": "count"}}, "'env.name'"),
        ({"name": "s", "config": TOY, "grid": {"output_dir": ["a"]}}, "'output_dir'"),
        ({"name": "s", "config": TOY, "grid": {"name": ["a", "b"]}}, "'name'"),
        ({"name": "s", "config": TOY, "runs": [{"seed": 0}, {"seed": 0}]}, "'seed=0'"),
        ({"name": "s", "config": TOY, "runs": [{"name": "a/b", "seed": 0}]}, "'a/b'"),
        ({"name": "s", "config": TOY, "runs": [{"seed": 0}], "gird": {}}, "'gird'"),
        ({"name": "a b", "config": TOY, "grid": {"seed": [0]}}, "'a b'"),
        ({"name": "s", "config": TOY, "runs": [{"name": "summary.json"}]}, "summary file"),
        ({"name": "s", "config": TOY, "overrides": [1], "grid": {"seed": [0]}}, "'overrides'"),
    ],
)
def test_malformed_sweeps_are_rejected(spec, message):
    with pytest.raises(SweepError, match=message):
        build_sweep(spec)


# --- validation and printed commands (nothing runs) ---------------------------------------


@pytest.mark.parametrize(
    "grid, key",
    [
        ({"seed": [0], "rl.learnin_rate": [1e-4, 1e-3]}, "rl.learnin_rate"),
        ({"rl.epochs": ["two"]}, "rl.epochs"),
        ({"env.reward_density": ["dense", "often"]}, "env.reward_density"),
    ],
)
def test_bad_grid_keys_stop_the_sweep_before_anything_runs(tmp_path, capsys, grid, key):
    path = _write_sweep(tmp_path, {"name": "bad", "config": TOY, "grid": grid})
    out = tmp_path / "out"
    assert sweep_main(["--sweep", path, "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert key in err and err.startswith("jaxrl-sweep: ")
    assert not out.exists()


def test_print_commands_gives_one_train_line_per_run(tmp_path, capsys):
    spec = {"name": "lr", "config": TOY, "grid": {"rl.learning_rate": [1e-4, 1e-3]}}
    path = _write_sweep(tmp_path, spec)
    out = tmp_path / "out"
    assert sweep_main(["--sweep", path, "--output-dir", str(out), "--print-commands"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    for line, lr in zip(lines, (1e-4, 1e-3)):
        argv = shlex.split(line)
        assert argv[0] == "jaxrl-train"
        config_path, overrides, rest = split_config_args(argv[1:])
        cfg = load_config(config_path, overrides)
        assert rest == [] and cfg.rl.learning_rate == lr
        assert cfg.output_dir == str(out / "lr")
        assert cfg.name == run_name({"rl.learning_rate": lr})
    assert not out.exists()


def test_the_console_script_prints_the_repo_sweeps(tmp_path):
    script = os.path.join(os.path.dirname(sys.executable), "jaxrl-sweep")
    for name, runs in (("toy_lr", 2), ("textworld_density", 6)):
        done = subprocess.run(
            [script, "--sweep", f"configs/sweeps/{name}.py", "--print-commands"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert len(lines) == runs and len(set(lines)) == runs
        assert all(f"--config.output_dir=runs/{name} " in line for line in lines)
    density = sweep_lib.load_sweep("configs/sweeps/textworld_density.py")
    assert {(r.overrides["env.reward_density"], r.overrides["seed"]) for r in density.runs} == {
        ("sparse", 0),
        ("sparse", 1),
        ("sparse", 2),
        ("dense", 0),
        ("dense", 1),
        ("dense", 2),
    }


def _run_configs(path, tmp_path):
    """(run, its loaded config) for every run of the repo sweep at `path`, after the
    sweep's own validation, built from the exact arguments `jaxrl-train` would get."""
    sweep = sweep_lib.load_sweep(path)
    sweep_lib.validate(sweep, str(tmp_path))
    for run in sweep.runs:
        _, overrides, _ = split_config_args(sweep_lib.train_args(sweep, run, str(tmp_path)))
        yield run, load_config(sweep.config, overrides)


def test_the_alfworld_mix_sweep_tests_both_arms_on_every_type(tmp_path):
    """Single type vs a mix of the six, three seeds each; every run's layout holds the 50
    held-out games of all six types, and trains on one type or on all six."""
    from jaxrl_agents.trainer.setup import EnvLayout

    arms = {}
    for run, cfg in _run_configs("configs/sweeps/alfworld_mix.py", tmp_path):
        layout = EnvLayout(cfg)
        assert len(layout.groups) == 6, run.name
        assert all(len(g.eval_ids) == 50 for g in layout.groups.values()), run.name
        trained = sorted(k for k, g in layout.groups.items() if g.train_tasks)
        arms.setdefault(run.name.split(",")[0], []).append((cfg.seed, trained, layout.num_train))
    single, mix = arms.pop("single"), arms.pop("mix")
    assert not arms and [s[0] for s in single] == [s[0] for s in mix] == [0, 1, 2]
    assert all(t == ["alfworld:pick_and_place_simple-3"] and n == 64 for _, t, n in single)
    assert all(len(t) == 6 and n == 66 for _, t, n in mix)


def test_the_complexity_sweep_trains_and_tests_each_config_alone(tmp_path):
    """Claim 2: w2-o12-q4 (objects) and w8-o3-q4 (rooms), three seeds each; every run
    trains and is tested on its own config's 100 held-out games."""
    from jaxrl_agents.trainer.setup import EnvLayout

    seeds = {}
    for run, cfg in _run_configs("configs/sweeps/textworld_complexity.py", tmp_path):
        groups = EnvLayout(cfg).groups
        assert list(groups) == [f"textworld:{cfg.env.name}"], run.name
        assert len(groups[f"textworld:{cfg.env.name}"].eval_ids) == 100, run.name
        seeds.setdefault(cfg.env.name, []).append(cfg.seed)
    assert seeds == {"w2-o12-q4": [0, 1, 2], "w8-o3-q4": [0, 1, 2]}


def test_the_curriculum_sweep_tests_both_arms_on_w4_o6_q8(tmp_path):
    """Claim 1: direct training on w4-o6-q8 vs a curriculum from w2-o3-q4, three seeds each;
    both arms hold the 100 held-out w4-o6-q8 games, fit 16-step episodes in the context and
    split each minibatch into micro-batches."""
    from jaxrl_agents.trainer.setup import EnvLayout

    arms = {}
    for run, cfg in _run_configs("configs/sweeps/textworld_curriculum.py", tmp_path):
        groups = EnvLayout(cfg).groups
        target = "textworld:w4-o6-q8"
        assert target in groups and len(groups[target].eval_ids) == 100, run.name
        assert cfg.env.max_steps == 16 and cfg.rollout.max_context == 4096, run.name
        assert max(cfg.rollout.length_buckets) == cfg.rollout.max_context, run.name
        assert cfg.rl.minibatch_size // cfg.rl.grad_accum == 4, run.name
        assert cfg.rl.epochs * cfg.rl.episodes_per_epoch // cfg.rollout.episodes_per_batch == 12
        arms.setdefault(run.name.split(",")[0], []).append((cfg.seed, sorted(groups)))
    direct, curriculum = arms.pop("direct"), arms.pop("curriculum")
    assert not arms and [d[0] for d in direct] == [c[0] for c in curriculum] == [0, 1, 2]
    assert all(g == ["textworld:w4-o6-q8"] for _, g in direct)
    assert all(g == ["textworld:w2-o3-q4", "textworld:w4-o6-q8"] for _, g in curriculum)


def test_dry_run_tells_what_each_run_would_do(tmp_path, capsys):
    spec = {"name": "s", "config": TOY, "runs": [{"name": n} for n in ("a", "b", "c")]}
    path = _write_sweep(tmp_path, spec)
    out = tmp_path / "out"
    (out / "s" / "a").mkdir(parents=True)
    (out / "s" / "a" / "summary.json").write_text("{}")
    (out / "s" / "b" / "checkpoints" / "3").mkdir(parents=True)
    (out / "s" / "c" / "checkpoints" / "3.orbax-checkpoint-tmp-1").mkdir(parents=True)
    assert sweep_main(["--sweep", path, "--output-dir", str(out), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["skip", "resume", "start"]
    assert [line.split()[1] for line in lines] == [str(out / "s" / n) for n in "abc"]


def test_report_summarizes_the_runs_on_disk_and_runs_none(tmp_path, capsys):
    spec = {"name": "s", "config": TOY, "runs": [{"name": n} for n in ("a", "b", "c")]}
    path = _write_sweep(tmp_path, spec)
    out = tmp_path / "out"
    score = {"mean": 0.6, "ci_low": 0.5, "ci_high": 0.7, "n": 100}
    (out / "s" / "a").mkdir(parents=True)
    (out / "s" / "a" / "eval.json").write_text(json.dumps({"sft": score, "rl": score}))
    (out / "s" / "a" / "summary.json").write_text("{}")
    (out / "s" / "b" / "checkpoints" / "3").mkdir(parents=True)
    assert sweep_main(["--sweep", path, "--output-dir", str(out), "--report"]) == 0
    printed = capsys.readouterr().out
    rows = {r["name"]: r for r in json.loads((out / "s" / "summary.json").read_text())["runs"]}
    assert {n: r["status"] for n, r in rows.items()} == {
        "a": "done", "b": "unfinished", "c": "missing"}
    assert rows["a"]["rl"] == score and "rl" not in rows["b"]
    assert not (out / "s" / "c").exists()  # nothing was started
    assert "0.600 (0.500-0.700, n=100)" in printed
    assert (out / "s" / "success.png").read_bytes()[:4] == b"\x89PNG"


def _score(mean):
    """A held-out score as eval.json holds it: mean, a +-0.1 interval, 100 games."""
    return {"mean": mean, "ci_low": mean - 0.1, "ci_high": mean + 0.1, "n": 100}


def test_a_report_takes_runs_missing_here_from_an_earlier_summary(tmp_path, capsys):
    """Runs made on other machines come from --earlier; a run with a score here keeps its
    own, and a summary of another sweep is refused before anything is written."""
    spec = {"name": "s", "config": TOY, "runs": [{"name": n} for n in ("a", "b", "c")]}
    path = _write_sweep(tmp_path, spec)
    out = tmp_path / "out"
    (out / "s" / "a").mkdir(parents=True)
    (out / "s" / "a" / "eval.json").write_text(json.dumps({"sft": _score(0.6), "rl": _score(0.7)}))
    (out / "s" / "a" / "summary.json").write_text("{}")
    old = {"sweep": "s", "runs": [
        {"name": "a", "status": "done", "sft": _score(0.1), "rl": _score(0.1)},
        {"name": "b", "status": "done", "sft": _score(0.4), "rl": _score(0.5)},
        {"name": "gone", "status": "done", "sft": _score(0.9)}]}  # fmt: skip
    (tmp_path / "old.json").write_text(json.dumps(old))
    args = ["--sweep", path, "--output-dir", str(out), "--report"]
    assert sweep_main([*args, "--earlier", str(tmp_path / "old.json")]) == 0
    summary = json.loads((out / "s" / "summary.json").read_text())
    rows = {r["name"]: r for r in summary["runs"]}
    assert list(rows) == ["a", "b", "c"]
    assert summary["over_seeds"]["arms"]["b"]["rl"]["mean"] == 0.5  # earlier rows count
    assert rows["a"]["status"] == "done" and rows["a"]["rl"] == _score(0.7)
    assert rows["b"]["status"] == "earlier" and rows["b"]["rl"] == _score(0.5)
    assert rows["c"]["status"] == "missing" and "rl" not in rows["c"]
    assert "0.500 (0.400-0.600, n=100)" in capsys.readouterr().out

    (tmp_path / "other.json").write_text(json.dumps({**old, "sweep": "t"}))
    (out / "s" / "summary.json").unlink()
    assert sweep_main([*args, "--earlier", str(tmp_path / "other.json")]) == 2
    assert "not 's'" in capsys.readouterr().err
    assert sweep_main([*args, "--earlier", str(tmp_path / "none.json")]) == 2
    assert not (out / "s" / "summary.json").exists()


def test_a_report_keeps_the_per_task_scores(tmp_path):
    score = {"mean": 0.5, "ci_low": 0.3, "ci_high": 0.7, "n": 20, "by_task": {}}
    kept = {k: score[k] for k in ("mean", "ci_low", "ci_high", "n")}
    evals = {"sft": score, "rl": score, "rl:toy:count-2": score, "sft:toy:guess-2": score,
             "sft_epoch": score, "stage:toy:count-2": score, "per_update": {}}  # fmt: skip
    (tmp_path / "eval.json").write_text(json.dumps(evals))
    scores = sweep_lib.run_scores(str(tmp_path))
    assert scores == dict.fromkeys(("sft", "rl", "rl:toy:count-2", "sft:toy:guess-2"), kept)


def test_a_report_task_compares_runs_on_that_task(tmp_path, capsys):
    """With report_task, a run that played several tasks is shown by that task's entry and
    a run that played only that task by its overall score."""
    spec = {"name": "s", "config": TOY, "runs": [{"name": "one"}, {"name": "two"}],
            "report_task": "toy:count-4"}  # fmt: skip
    path = _write_sweep(tmp_path, spec)
    out = tmp_path / "out"
    evals = {"one": {"sft": _score(0.2), "rl": _score(0.3)},
             "two": {"sft": _score(0.5), "rl": _score(0.6), "sft:toy:count-2": _score(0.8),
                     "sft:toy:count-4": _score(0.25), "rl:toy:count-4": _score(0.35)}}  # fmt: skip
    for name, e in evals.items():
        (out / "s" / name).mkdir(parents=True)
        (out / "s" / name / "eval.json").write_text(json.dumps(e))
        (out / "s" / name / "summary.json").write_text("{}")
    assert sweep_main(["--sweep", path, "--output-dir", str(out), "--report"]) == 0
    printed = capsys.readouterr().out
    assert "after RL on toy:count-4" in printed
    rows = [line for line in printed.splitlines() if line.startswith(("one", "two"))]
    lines = {}
    for line in rows:  # the per-run table comes first, then the table over seeds
        lines.setdefault(line.split()[0], line)
    assert "0.300 (0.200-0.400" in lines["one"] and "0.350 (0.250-0.450" in lines["two"]
    assert "0.600" not in lines["two"]
    summary = json.loads((out / "s" / "summary.json").read_text())
    assert summary["report_task"] == "toy:count-4"
    assert (out / "s" / "success.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(sweep_lib.SweepError, match="report_task"):
        sweep_lib.build_sweep({**spec, "report_task": 3})


# --- a real local sweep ------------------------------------------------------------------


@pytest.mark.slow
def test_local_sweep_runs_reports_and_skips_or_resumes_on_restart(tmp_path, capsys):
    spec = {
        "name": "tiny",
        "config": TOY,
        "overrides": TINY,
        "runs": [
            {"name": "broken", "env.name": "no_such_game"},  # fails inside jaxrl-train
            {"rl.learning_rate": 1e-3},
            {"rl.learning_rate": 3e-4},
        ],
    }
    path = _write_sweep(tmp_path, spec)
    out = tmp_path / "out"
    good = ["rl.learning_rate=1e-3", "rl.learning_rate=3e-4"]

    assert sweep_main(["--sweep", path, "--output-dir", str(out)]) == 1
    first = capsys.readouterr()
    for name in good:
        run = out / "tiny" / name
        assert (run / "summary.json").exists() and (run / "eval.json").exists()
        assert json.loads((run / "config.json").read_text())["rl"]["learning_rate"] == float(
            name.split("=")[1]
        )
    broken_log = out / "tiny" / "broken" / "train.log"
    assert "no_such_game" in broken_log.read_text()
    assert f"run broken failed (exit code 1); log: {broken_log}" in first.err

    summary = json.loads((out / "tiny" / "summary.json").read_text())
    assert (out / "tiny" / "success.png").exists()
    rows = {r["name"]: r for r in summary["runs"]}
    assert [r["name"] for r in summary["runs"]] == ["broken", *good]
    assert rows["broken"]["status"] == "failed" and rows["broken"]["exit_code"] == 1
    assert "sft" not in rows["broken"] and "rl" not in rows["broken"]
    for name in good:
        evals = json.loads((out / "tiny" / name / "eval.json").read_text())
        assert rows[name]["status"] == "done" and rows[name]["exit_code"] == 0
        for stage in ("sft", "rl"):
            assert rows[name][stage] == {
                k: evals[stage][k] for k in ("mean", "ci_low", "ci_high", "n", "per_game")
            }
            assert rows[name][stage]["n"] == 4 and len(rows[name][stage]["per_game"]) == 4
        # each run's RL and SFT compared on the same games, with McNemar's test
        assert any(line.startswith(f"{name}: rl - sft on the same 4 games:")
                   and "McNemar p = " in line for line in first.out.splitlines())
    table = first.out.splitlines()
    header = next(i for i, line in enumerate(table) if line.startswith("run "))
    assert "success after SFT (95% CI)" in table[header]
    assert "success after RL (95% CI)" in table[header]
    body = [line.split() for line in table[header + 1 : header + 4]]
    assert [row[0] for row in body] == ["broken", *good]
    assert body[0][1:] == ["failed", "(1)", "-", "-"]
    for row, name in zip(body[1:], good):
        sft, rl = rows[name]["sft"], rows[name]["rl"]
        assert row[1] == "done"
        assert row[2:4] == [f"{sft['mean']:.3f}", f"({sft['ci_low']:.3f}-{sft['ci_high']:.3f},"]
        assert row[5:7] == [f"{rl['mean']:.3f}", f"({rl['ci_low']:.3f}-{rl['ci_high']:.3f},"]

    # Restart: a finished run is skipped; one whose summary is gone resumes from its
    # checkpoints (no SFT again); the broken one is tried again.
    skipped, resumed = (out / "tiny" / name for name in good)
    skipped_log = (skipped / "train.log").read_text()
    (resumed / "summary.json").unlink()
    sft_rows = (resumed / "metrics.jsonl").read_text().count("sft/train_loss")
    assert sweep_main(["--sweep", path, "--output-dir", str(out)]) == 1
    second = capsys.readouterr()
    assert f"{good[0]}: finished before, skipped" in second.out
    assert (skipped / "train.log").read_text() == skipped_log
    resume_log = (resumed / "train.log").read_text().split("\n$ ")[-1]
    assert resume_log.split("\n")[0].endswith("--resume")
    assert (resumed / "summary.json").exists()
    assert (resumed / "metrics.jsonl").read_text().count("sft/train_loss") == sft_rows
    statuses = [
        r["status"] for r in json.loads((out / "tiny" / "summary.json").read_text())["runs"]
    ]
    assert statuses == ["failed", "skipped", "done"]
