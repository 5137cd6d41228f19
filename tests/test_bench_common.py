"""bench/common.py: which runs `best_seconds_interleaved` times, on a fake clock."""

from bench import common


class _Clock:
    """A clock that only the contestants move."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _contestants(clock, calls):
    """Two contestants whose run right after the other's costs 10 s, else 1 s (ours) or
    2 s (theirs): the slow runs are the ones a timed run must not be."""
    last = [None]

    def runner(name, seconds):
        def run():
            calls.append(name)
            clock.now += 10.0 if last[0] not in (None, name) else seconds
            last[0] = name
        return run

    return {"ours": runner("ours", 1.0), "theirs": runner("theirs", 2.0)}


def test_interleaved_turns_time_the_first_run_by_default(monkeypatch):
    clock, calls = _Clock(), []
    monkeypatch.setattr(common.time, "perf_counter", clock)
    best = common.best_seconds_interleaved(_contestants(clock, calls), repeats=2, warmup=1)
    assert calls == ["ours", "theirs"] * 3
    # every timed run follows the other contestant's, so each pays the switch
    assert best == {"ours": 10.0, "theirs": 10.0}


def test_settle_runs_each_turn_untimed_first(monkeypatch):
    clock, calls = _Clock(), []
    monkeypatch.setattr(common.time, "perf_counter", clock)
    best = common.best_seconds_interleaved(_contestants(clock, calls), repeats=2, warmup=0,
                                           settle=1)
    assert calls == ["ours", "ours", "theirs", "theirs"] * 2
    assert best == {"ours": 1.0, "theirs": 2.0}
