"""Timing shared by the benchmark scripts (run as ``python benchmarks/<script>.py``, so this folder is on
``sys.path``)."""

import time


def best_of(repeats: int, fn):
    """(fastest wall time, result of the last call)."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def timed(fn) -> float:
    """Wall time of one call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
