"""Sweeps: one base config, many runs that differ by a few overrides.

A sweep file (configs/sweeps/*.py) defines `get_sweep()` returning a plain dict:

    def get_sweep():
        return {
            "name": "toy_lr",                       # runs go to <output_dir>/toy_lr/<run>/
            "config": "configs/toy_tiny.py",        # the base config
            "overrides": {"rl.epochs": 2},          # optional: set in every run
            "grid": {"rl.learning_rate": [3e-4, 1e-3], "seed": [0, 1]},
            "report_task": "toy:count-2",           # optional: see report.py
        }

The package follows a sweep's three jobs, in the order `jaxrl-sweep` (cli.sweep_main)
calls them:

- expand.py: the sweep file read and expanded into named runs (`load_sweep`), each run's
  config checked with the project's own loader before anything starts (`validate`).
- launch.py: `jaxrl-train` launched for each run, one at a time or N in parallel, finished
  runs skipped and unfinished ones resumed (`run_sweep`); the runs already on disk
  (`existing_results`, for `--report`); launch lines for elsewhere (`command_lines`).
- report.py: summary.json with held-out success per run (of the pretrained model where a
  run starts from one, after SFT, after RL), the arms over their seeds (`over_seeds`,
  statistics from `jaxrl_agents/stats.py`) and the printed tables; chart.py draws them
  (success.png).
"""
