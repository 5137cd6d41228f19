"""Command-line entry points: jaxrl-train and jaxrl-eval.

Both take `--config path.py` and any number of `--config.a.b=value` overrides (see
jaxrl_agents.config); an unknown key or a bad value stops with a message naming it.
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


if __name__ == "__main__":
    sys.exit(train_main())
