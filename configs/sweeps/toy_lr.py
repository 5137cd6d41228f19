"""Two RL learning rates on the toy counting game (a minute-scale example sweep).

jaxrl-sweep --sweep configs/sweeps/toy_lr.py     # runs/toy_lr/rl.learning_rate=.../
"""


def get_sweep():
    return {
        "name": "toy_lr",
        "config": "configs/toy_tiny.py",
        "grid": {"rl.learning_rate": [3e-4, 1e-3]},
    }
