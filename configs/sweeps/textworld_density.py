"""Sparse vs dense rewards on the TextWorld demo, three seeds each (six runs).

jaxrl-sweep --sweep configs/sweeps/textworld_density.py --parallel 2
"""


def get_sweep():
    return {
        "name": "textworld_density",
        "config": "configs/textworld_tiny.py",
        "grid": {"env.reward_density": ["sparse", "dense"], "seed": [0, 1, 2]},
    }
