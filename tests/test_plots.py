"""PNG learning curves of a run (`plots.plot_metrics`, `RunLogger.plot`)."""

import os

from jaxrl_agents.logging import RunLogger
from jaxrl_agents.plots import plot_metrics


def test_plot_writes_pngs_skipping_nan(tmp_path):
    run = str(tmp_path)
    with RunLogger(run, tensorboard=False, progress_bar=False) as log:
        for s in range(1, 6):
            log.log(s, {"charts/success": s / 5, "losses/pg": float("nan") if s == 3 else -s,
                        "losses/kl": 0.1 * s, "return_mean": s})
        paths = log.plot()
    names = sorted(os.path.basename(p) for p in paths)
    assert names == ["charts.png", "losses.png"]
    for p in paths:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    only = plot_metrics(run, keys=["losses/kl"])
    assert [os.path.basename(p) for p in only] == ["losses.png"]
