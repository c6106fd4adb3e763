"""Timing shared by the benchmark scripts (run as ``python benchmarks/<script>.py``, so this folder is on
``sys.path``)."""

import time
from collections.abc import Callable, Mapping
from typing import TypeVar

T = TypeVar("T")


def best_of(repeats: int, fn: Callable[[], T]) -> tuple[float, T]:
    """(fastest wall time, result of the last call) of ``repeats`` (at least one) calls."""
    times: list[float] = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def best_of_each(repeats: int, fns: Mapping[str, Callable[[], T]]) -> tuple[dict[str, float], dict[str, T]]:
    """({name: fastest wall time}, {name: result of its last call}) of the callables ``fns``, which take turns
    in every round, so load that drifts on a shared machine falls on each of them alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    results: dict[str, T] = {}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - start)
    return {name: min(seconds) for name, seconds in times.items()}, results


def timed(fn: Callable[[], object]) -> float:
    """Wall time of one call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
