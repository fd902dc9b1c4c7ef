"""Shared timing helper for the benchmarks: best of a few repeats, wall-clock seconds."""

import time


def best_time(func, repeats=3):
    """Return (best seconds, last result) over ``repeats`` calls of ``func()``."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = func()
        best = min(best, time.perf_counter() - start)
    return best, result
