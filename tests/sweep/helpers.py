"""Shared by the sweep tests: the toy base config, a sweep file written from a spec, and a
held-out score as eval.json holds it."""

TOY = "configs/toy_tiny.py"


def write_sweep(tmp_path, spec, filename="sweep.py"):
    """A sweep file at tmp_path/filename whose get_sweep() returns `spec`; its path."""
    path = tmp_path / filename
    path.write_text(f"def get_sweep():\n    return {spec!r}\n")
    return str(path)


def score(mean):
    """A held-out score as eval.json holds it: mean, a +-0.1 interval, 100 games."""
    return {"mean": mean, "ci_low": mean - 0.1, "ci_high": mean + 0.1, "n": 100}
