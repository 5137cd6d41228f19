"""Object complexity vs spatial complexity (the paper's claim 2): the demo recipe trained
and tested on w2-o12-q4 (many objects) and on w8-o3-q4 (many rooms), three seeds each.

jaxrl-sweep --sweep configs/sweeps/textworld_complexity.py

(one run at a time: each needs about 12 GB.)
"""


def get_sweep():
    return {
        "name": "textworld_complexity",
        "config": "configs/textworld_tiny.py",
        "grid": {"env.name": ["w2-o12-q4", "w8-o3-q4"], "seed": [0, 1, 2]},
    }
