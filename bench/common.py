"""Small timing helpers shared by the benchmarks."""

import statistics
import time


def _times(fn, repeats, warmup, min_time):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                break
        times.append(elapsed / calls)
    return times


def median_seconds(fn, *, repeats=5, warmup=1, min_time=0.0):
    """Median wall time of `fn()` over `repeats` runs (after `warmup` untimed runs).

    With `min_time`, each timed run loops `fn` until that much time has passed and
    reports the time per call.
    """
    return statistics.median(_times(fn, repeats, warmup, min_time))


def best_seconds(fn, *, repeats=5, warmup=1, min_time=0.0):
    """Like `median_seconds`, but the fastest run: on a shared, noisy machine the least
    disturbed run is the steadiest estimate of what the code itself costs."""
    return min(_times(fn, repeats, warmup, min_time))


def copy_bandwidth_gbs(megabytes=256):
    """Measured memory bandwidth of a large NumPy copy (read + write), in GB/s."""
    import numpy as np

    src = np.ones(megabytes * 2**20 // 8)
    dst = np.empty_like(src)
    seconds = median_seconds(lambda: np.copyto(dst, src), repeats=5)
    return 2 * src.nbytes / seconds / 1e9


def table(rows, headers):
    """Formats rows (lists of str) as an aligned plain-text table."""
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    line = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([line.format(*headers)] + [line.format(*map(str, r)) for r in rows])
