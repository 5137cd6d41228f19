"""Command-line entry points: jaxrl-train, jaxrl-eval and jaxrl-sweep.

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
checkpoints/, eval.json (held-out success after SFT and after RL), plots/*.png.
"""

EVAL_HELP = """Evaluate a trained run on its held-out tasks (greedy actions).

  jaxrl-eval --run runs/NAME            # the run's config.json and latest checkpoint
  jaxrl-eval --config X.py [--config.a=b ...] [--step N]

Prints held-out success with a 95% confidence interval and writes it to eval.json ("eval").
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
    from jaxrl_agents.trainer.loop import format_summary, train, write_summary

    summary = train(cfg, resume=args.resume)
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


def eval_main(argv=None) -> int:
    def extra(p):
        p.add_argument("--run", metavar="DIR", help="a run directory made by jaxrl-train")
        p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")

    try:
        args, cfg = _parse(sys.argv[1:] if argv is None else argv, EVAL_HELP, extra)
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
    from jaxrl_agents.trainer.loop import evaluate_checkpoint

    result = evaluate_checkpoint(cfg, step=args.step)
    print(
        f"held-out success: {result['mean']:.3f} (95% CI {result['ci_low']:.3f}-"
        f"{result['ci_high']:.3f}, {result['n']} games)"
    )
    return 0


SWEEP_HELP = """Run a sweep: one base config, many runs (see jaxrl_agents/sweep.py).

  jaxrl-sweep --sweep configs/sweeps/toy_lr.py [--parallel N] [--print-commands] [--dry-run]

Every run's config is checked before anything starts. Runs go to
<output_dir>/<sweep>/<run>/ (their output in train.log there); finished runs are skipped
and unfinished runs with checkpoints resumed. Ends with a table of held-out success per
run, also written to <output_dir>/<sweep>/summary.json; exits 1 if any run failed.
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
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.parallel < 1:
        parser.error("--parallel must be at least 1")
    from jaxrl_agents import sweep as sweep_lib

    try:
        sweep = sweep_lib.load_sweep(args.sweep)
        root = args.output_dir or sweep_lib.default_root(sweep)
        sweep_lib.validate(sweep, root)
    except ConfigError as err:
        print(f"jaxrl-sweep: {err}", file=sys.stderr)
        return 2
    if args.print_commands or args.dry_run:
        lines = (sweep_lib.command_lines if args.print_commands else sweep_lib.plan_lines)(
            sweep, root
        )
        print("\n".join(lines))
        return 0
    results = sweep_lib.run_sweep(sweep, root, parallel=args.parallel)
    summary = sweep_lib.summarize(sweep, results)
    path = sweep_lib.write_summary(summary, root)
    print(sweep_lib.format_table(summary))
    print(f"sweep summary: {path}")
    failed = [r for r in results if r["status"] == "failed"]
    for r in failed:
        print(
            f"jaxrl-sweep: run {r['name']} failed (exit code {r['exit_code']}); log: {r['log']}",
            file=sys.stderr,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(train_main())
