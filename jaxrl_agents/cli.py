"""Command-line entry points: jaxrl-train, jaxrl-eval, jaxrl-sweep and jaxrl-plan.

jaxrl-train and jaxrl-eval take `--config path.py` and any number of `--config.a.b=value`
overrides (see jaxrl_agents.config); an unknown key or a bad value stops with a message
naming it. jaxrl-sweep takes a sweep file (see jaxrl_agents.sweep).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from jaxrl_agents.config import ConfigError, load_config, split_config_args

TRAIN_HELP = """Train an agent: SFT on golden trajectories (if sft.enabled), then RL.

  jaxrl-train --config configs/textworld_tiny.py [--config.rl.learning_rate=1e-5 ...] [--resume]

Outputs go to <output_dir>/<name>/: config.json, metrics.jsonl, TensorBoard events,
checkpoints/, eval.json (held-out success after SFT and after RL; first "base", before any
training, when model.hf_path names pretrained weights), plots/*.png.
"""

EVAL_HELP = """Evaluate a run on its held-out tasks (greedy actions, or sampled ones).

  jaxrl-eval --run runs/NAME            # the run's config.json and latest checkpoint
  jaxrl-eval --config X.py [--config.a=b ...] [--step N]
  jaxrl-eval --run runs/NAME --temperature 1 --samples 4   # sampled play, 4 per game
  jaxrl-eval --config configs/textworld_smollm2.py          # no checkpoint yet: zero-shot
  jaxrl-eval --run runs/NAME --read sft --read rl   # how games were lost; plays nothing
  jaxrl-eval --pair runs/A:sft runs/B:rl   # two runs' stages, game by game; plays nothing

Prints held-out success with a 95% confidence interval and writes it to eval.json ("eval";
"eval_T<temperature>" for sampled play; "eval-step<N>" with --step N). A run without a
checkpoint (or with --base) plays its pretrained weights (model.hf_path) instead: "base" /
"base_T<temperature>". Every evaluation's games are written to
eval_episodes/<stage>.jsonl; --read sorts them by how they ended (won, lost, loop, out of
steps, invalid action, env failure). --pair compares two recorded stages of any runs
(RUN_DIR:STAGE or path/to/eval.json:STAGE) on the held-out games both played: each one's
success with its interval, the difference, the games only one won and McNemar's exact test.
"""


def _parse(argv, help_text: str, extra) -> tuple[argparse.Namespace, object | None]:
    path, overrides, rest = split_config_args(argv)
    parser = argparse.ArgumentParser(
        description=help_text, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", metavar="PATH", help="experiment config file (Python)")
    extra(parser)
    args = parser.parse_args(rest + (["--config", path] if path else []))
    cfg = load_config(path, overrides) if path else None
    return args, cfg


def train_main(argv=None) -> int:
    def extra(p):
        p.add_argument(
            "--resume", action="store_true", help="continue the run from its latest checkpoint"
        )

    try:
        args, cfg = _parse(sys.argv[1:] if argv is None else argv, TRAIN_HELP, extra)
        if cfg is None:
            raise ConfigError("jaxrl-train needs --config PATH")
    except ConfigError as err:
        print(f"jaxrl-train: {err}", file=sys.stderr)
        return 2
    from jaxrl_agents import distributed

    distributed.maybe_initialize(cfg)  # multi-host: before any other JAX call
    from jaxrl_agents.preflight import MemoryCheckError
    from jaxrl_agents.trainer.loop import train
    from jaxrl_agents.trainer.summary import format_summary, write_summary

    try:
        summary = train(cfg, resume=args.resume)
    except MemoryCheckError as err:
        print(f"jaxrl-train: {err}", file=sys.stderr)
        return 2
    if distributed.is_main_process():  # multi-host: one summary.json, one report
        write_summary(summary)
        print(format_summary(summary))
    return 0


def _overrides_from_json(run_dir: str) -> list[str]:
    """config.json as a list of `key=value` overrides of the base config."""
    with open(os.path.join(run_dir, "config.json")) as f:
        stored = json.load(f)

    def walk(prefix, node):
        for key, value in node.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                yield from walk(name + ".", value)
            else:
                text = (
                    value
                    if isinstance(value, str)
                    else repr(tuple(value) if isinstance(value, list) else value)
                )
                yield f"{name}={text}"

    return list(walk("", stored))


def _print_comparison(cfg, args, result: dict) -> int:
    """jaxrl-eval --compare STAGE: this evaluation minus STAGE of the run's eval.json, game
    by game (`stats.paired_games`); 2 when the stage or its games are not there."""
    from jaxrl_agents import stats
    from jaxrl_agents.run_records import EVAL_FILE, run_dir_of

    path = os.path.join(run_dir_of(cfg), EVAL_FILE)
    with open(path) as f:
        other = json.load(f).get(args.compare) or {}
    pair = stats.paired_games(other.get("per_game") or {}, result.get("per_game") or {})
    if pair is None:
        found = "no per-game outcomes" if other else "no such stage"
        print(f"jaxrl-eval: --compare {args.compare}: {path} has {found} for it on these "
              "games", file=sys.stderr)
        return 2
    print(stats.format_paired_games(pair, args.compare, "this evaluation"))
    return 0


def _load_stage(ref: str) -> dict:
    """A recorded evaluation: "RUN_DIR:STAGE" or "path/eval.json:STAGE" -> that stage of the
    eval.json, with its per-game outcomes. Raises ValueError naming the file or stage."""
    from jaxrl_agents.run_records import EVAL_FILE

    path, sep, stage = ref.rpartition(":")
    if not sep or not path or not stage:
        raise ValueError(f"{ref!r} is not RUN_DIR:STAGE (e.g. runs/demo:rl)")
    if os.path.isdir(path):
        path = os.path.join(path, EVAL_FILE)
    try:
        with open(path) as f:
            stages = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"{ref}: no such file {path}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{ref}: {path} is not JSON ({err})") from None
    entry = stages.get(stage) if isinstance(stages, dict) else None
    if not isinstance(entry, dict):
        known = sorted(stages) if isinstance(stages, dict) else []
        raise ValueError(f"{ref}: {path} has no stage {stage!r}; its stages: {known}")
    if not entry.get("per_game"):
        raise ValueError(f"{ref}: stage {stage!r} of {path} kept no per-game outcomes")
    return entry


def _print_pair(refs: list[str]) -> int:
    """jaxrl-eval --pair A B: two recorded stages (of one run or two) on the games both
    played: each one's success and interval, then B - A with McNemar's exact test
    (`stats.paired_games`); 2 when a stage is missing or no game is shared."""
    from jaxrl_agents import stats

    try:
        entries = [_load_stage(ref) for ref in refs]
    except ValueError as err:
        print(f"jaxrl-eval: --pair: {err}", file=sys.stderr)
        return 2
    for ref, entry in zip(refs, entries, strict=True):
        if entry.get("ci_low") is None:  # older records: the interval from the games
            entry = {**entry, **stats.success_ci(entry["per_game"].values())}
        print(f"{ref}: {entry['mean']:.3f} (95% CI {entry['ci_low']:.3f}-"
              f"{entry['ci_high']:.3f}, {len(entry['per_game'])} games)")
    pair = stats.paired_games(entries[0]["per_game"], entries[1]["per_game"])
    if pair is None:
        print(f"jaxrl-eval: --pair: {refs[0]} and {refs[1]} share no game", file=sys.stderr)
        return 2
    print(stats.format_paired_games(pair, refs[0], refs[1]))
    return 0


def _print_readings(cfg, stages: list[str]) -> int:
    """jaxrl-eval --read STAGE [--read STAGE2]: each stage's games by how they ended
    (`failures.reading`), and with two stages the games whose ending changed; 2 when an
    episodes file is missing or unreadable, or more than two stages are given."""
    from jaxrl_agents import failures
    from jaxrl_agents.run_records import run_dir_of

    if len(stages) > 2:
        print(f"jaxrl-eval: --read takes one or two stages, got {len(stages)}", file=sys.stderr)
        return 2
    run_dir = run_dir_of(cfg)
    try:
        episodes = [failures.read_episodes(failures.stage_path(run_dir, s)) for s in stages]
    except (FileNotFoundError, ValueError) as err:
        print(f"jaxrl-eval: --read: {err}", file=sys.stderr)
        return 2
    for stage, eps in zip(stages, episodes, strict=True):
        print(failures.format_reading(failures.reading(eps), stage))
    if len(stages) == 2:
        print(failures.format_transitions(failures.transitions(*episodes), *stages))
    return 0


def eval_main(argv=None) -> int:
    def extra(p):
        p.add_argument("--run", metavar="DIR", help="a run directory made by jaxrl-train")
        p.add_argument("--step", type=int, default=None,
                       help="checkpoint step (default: latest); written as stage "
                            "eval-step<STEP>")
        p.add_argument("--temperature", type=float, default=0.0,
                       help="sample actions at this temperature instead of greedy play "
                            "(written to eval.json as eval_T<temperature>)")
        p.add_argument("--samples", type=int, default=1,
                       help="with --temperature: play each held-out game this many times "
                            "(the interval is then over games)")
        p.add_argument("--seed", type=int, default=0, help="with --temperature: sampling seed")
        p.add_argument("--compare", metavar="STAGE", default=None,
                       help="also compare with STAGE of the run's eval.json (e.g. sft, base), "
                            "game by game on the games both played, with McNemar's test")
        p.add_argument("--base", action="store_true",
                       help="play the pretrained weights (model.hf_path), not a checkpoint "
                            "(the default when the run has none)")
        p.add_argument("--read", metavar="STAGE", action="append", default=[],
                       help="play nothing: how the games of the run's evaluation STAGE (sft, "
                            "rl, eval, rl-update5, ...) were lost, from eval_episodes/; twice "
                            "to compare two stages game by game")
        p.add_argument("--pair", metavar="RUN:STAGE", nargs=2, default=None,
                       help="play nothing: compare two recorded stages (of one run or two, "
                            "e.g. runs/a:sft runs/b:rl) game by game, with McNemar's test")

    try:
        args, cfg = _parse(sys.argv[1:] if argv is None else argv, EVAL_HELP, extra)
        if args.pair:  # plays nothing: needs no run, no config and no JAX
            return _print_pair(args.pair)
        if not args.read:  # --read plays nothing (and imports no JAX)
            from jaxrl_agents.trainer.evaluation import check_eval_sampling

            try:
                check_eval_sampling(args.temperature, args.samples)
            except ValueError as err:
                raise ConfigError(f"--temperature / --samples: {err}") from None
        if args.base and args.step is not None:
            raise ConfigError("--base plays the pretrained weights: give it no --step")
        if cfg is None:
            if not args.run:
                raise ConfigError("jaxrl-eval needs --run DIR or --config PATH")
            import configs.base

            cfg = load_config(configs.base.__file__, _overrides_from_json(args.run))
            with cfg.unlocked():
                cfg.output_dir = os.path.dirname(os.path.abspath(args.run))
                cfg.name = os.path.basename(os.path.abspath(args.run))
    except ConfigError as err:
        print(f"jaxrl-eval: {err}", file=sys.stderr)
        return 2
    if args.read:
        return _print_readings(cfg, args.read)
    from jaxrl_agents.preflight import MemoryCheckError
    from jaxrl_agents.trainer.loop import evaluate_checkpoint

    try:
        result = evaluate_checkpoint(cfg, step=args.step, temperature=args.temperature,
                                     samples=args.samples, seed=args.seed, base=args.base)
    except (FileNotFoundError, MemoryCheckError) as err:
        print(f"jaxrl-eval: {err}", file=sys.stderr)
        return 2
    how = "greedy" if args.temperature == 0 else (
        f"sampled at temperature {args.temperature:g}, {args.samples} per game")
    print(
        f"held-out success ({how}): {result['mean']:.3f} (95% CI {result['ci_low']:.3f}-"
        f"{result['ci_high']:.3f}, {result.get('games', result['n'])} games"
        + (f", {result['n']} episodes)" if "games" in result else ")")
        + (f"; invalid actions: {result['invalid_action_share']:.3f}"
           if result.get("invalid_action_share") is not None else "")
    )
    if args.compare:
        return _print_comparison(cfg, args, result)
    return 0


SWEEP_HELP = """Run a sweep: one base config, many runs (see jaxrl_agents/sweep/).

  jaxrl-sweep --sweep configs/sweeps/toy_lr.py [--parallel N] [--print-commands] [--dry-run]
  jaxrl-sweep --sweep configs/sweeps/toy_lr.py --report   # summarize the runs on disk
  jaxrl-sweep --sweep FILE --report --earlier OLD/summary.json  # runs not here from OLD

Every run's config is checked before anything starts. Runs go to
<output_dir>/<sweep>/<run>/ (their output in train.log there); finished runs are skipped
and unfinished runs with checkpoints resumed. Ends with a table of held-out success per
run and one per arm over its seeds (runs named alike but for "seed=N"), also written to
<output_dir>/<sweep>/summary.json, and a bar chart of the runs (success.png there);
exits 1 if any run failed.
"""


def sweep_main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="jaxrl-sweep",
        description=SWEEP_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sweep", required=True, metavar="PATH", help="sweep file (Python)")
    parser.add_argument("--parallel", type=int, default=1, metavar="N", help="runs at a time")
    parser.add_argument(
        "--output-dir", metavar="DIR", help="parent of the sweep folder (default: config's)"
    )
    parser.add_argument(
        "--print-commands", action="store_true", help="print one jaxrl-train line per run, run none"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="check the sweep, show what each run would do"
    )
    parser.add_argument(
        "--report", action="store_true",
        help="run nothing: summarize (table, summary.json, success.png) the runs on disk",
    )
    parser.add_argument(
        "--earlier", metavar="SUMMARY",
        help="a summary.json of this sweep made elsewhere: runs missing here are taken from it",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.parallel < 1:
        parser.error("--parallel must be at least 1")
    from jaxrl_agents.sweep import chart, expand, launch, report

    try:
        sweep = expand.load_sweep(args.sweep)
        root = args.output_dir or expand.default_root(sweep)
        expand.validate(sweep, root)
        earlier = report.load_earlier(args.earlier, sweep) if args.earlier else None
    except ConfigError as err:
        print(f"jaxrl-sweep: {err}", file=sys.stderr)
        return 2
    if args.print_commands or args.dry_run:
        lines = (launch.command_lines if args.print_commands else launch.plan_lines)(sweep, root)
        print("\n".join(lines))
        return 0
    if args.report:
        results = launch.existing_results(sweep, root)
    else:
        results = launch.run_sweep(sweep, root, parallel=args.parallel)
    summary = report.summarize(sweep, results)
    if earlier:
        summary = report.with_earlier_runs(summary, earlier)
    summary["over_seeds"] = report.over_seeds(summary)
    path = report.write_summary(summary, root)
    print(report.format_table(summary))
    print(report.format_seed_table(summary["over_seeds"]))
    for line in report.paired_game_lines(summary):
        print(line)
    print(f"sweep summary: {path}")
    plot = chart.plot_summary(summary, os.path.join(os.path.dirname(path), chart.PLOT_FILE))
    if plot:
        print(f"plot: {plot}")
    failed = [r for r in results if r["status"] == "failed"]
    for r in failed:
        print(
            f"jaxrl-sweep: run {r['name']} failed (exit code {r['exit_code']}); log: {r['log']}",
            file=sys.stderr,
        )
    return 1 if failed else 0


PLAN_HELP = """Plan memory: per-device bytes of a run on a mesh, and whether it fits a device.

  jaxrl-plan --config configs/qwen2_5_7b_textworld.py [--config.a=b ...]
             [--mesh data=1,fsdp=8,tensor=1] [--device v4-8|v5e-8|a100-80gb|h100-80gb|BYTES]
             [--model-config qwen2.5-7b|DIR|config.json] [--headroom 0.1]

Shapes come from jax.eval_shape of the trainer's own model, critic and optimizer
construction; placement from the sharding rules table on an abstract mesh (no devices or
weights needed). `model.hf_path` names the architecture: a checkpoint directory, a
Qwen2.5 hub id known to the planner (see jaxrl_agents/plan.py PRESETS), or a GGUF file or
preset (jaxrl_agents/models/gguf_import.py; converted once into its cache).
"""


def plan_main(argv=None) -> int:
    def extra(p):
        p.add_argument("--mesh", metavar="AXIS=N,...", help="mesh sizes (default: the config's)")
        p.add_argument("--device", default="v5e-8",
                       help="v4-8 | v5e-8 | a100-80gb | h100-80gb | bytes per device")
        p.add_argument("--num-devices", type=int, default=0,
                       help="devices in the slice (default: the device kind's, else the mesh's)")
        p.add_argument("--model-config", metavar="NAME|PATH",
                       help="architecture: a preset, checkpoint dir or config.json "
                            "(default: model.hf_path, else the config's sizes)")
        p.add_argument("--headroom", type=float, default=0.1,
                       help="share of device memory kept free (default 0.1)")

    from jaxrl_agents import plan

    try:
        args, cfg = _parse(sys.argv[1:] if argv is None else argv, PLAN_HELP, extra)
        if cfg is None:
            raise ConfigError("jaxrl-plan needs --config PATH")
        if args.device in plan.DEVICES:
            device = plan.DEVICES[args.device]
        elif args.device.isdigit():
            device = plan.Device(f"{int(args.device) / plan.GIB:.2f} GiB per device",
                                 int(args.device), None)
        else:
            raise ConfigError(f"--device {args.device!r}; allowed: {sorted(plan.DEVICES)} "
                              "or a number of bytes")
        mesh_cfg = plan.parse_mesh(args.mesh) if args.mesh else dict(cfg.mesh)
        explicit = 1
        for size in mesh_cfg.values():
            explicit *= max(size, 1)
        num_devices = args.num_devices or device.num_devices or explicit
        mesh = plan.abstract_mesh(mesh_cfg, num_devices)
        mc = plan.model_config(cfg, args.model_config)
    except (ConfigError, ValueError) as err:
        print(f"jaxrl-plan: {err}", file=sys.stderr)
        return 2
    result = plan.make_plan(cfg, mc, mesh)
    print(plan.format_plan(result, device.name, device.bytes_per_device, args.headroom))
    return 0


if __name__ == "__main__":
    sys.exit(train_main())
