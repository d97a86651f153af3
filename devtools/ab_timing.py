"""Interleaved A/B measurement for the overhead scripts (overhead/*.py), and the machine load beside it.

Our side and its baseline run in alternating rounds in one process, each round in the reverse order
of the one before (A B, B A, A B, ...), so that a drift in machine load (other jobs on a shared
machine, a warming cache) hits every side alike instead of the side that happened to run second.
Each side is summarised by its median round. The load averages at the start and at the end and the
CPU count go into the report beside the result: on a shared 2-core machine a ratio is only as
good as the load it ran under.

    at_start = loadavg()
    rounds = alternate({"ours": timed(ours), "bare": timed(bare)}, 5)
    result = {"ratio": median(rounds["ours"]) / median(rounds["bare"]), **machine_load(at_start)}
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def round_order(sides: list[str], rounds: int) -> list[list[str]]:
    """The order of each round: the sides as given in even rounds, reversed in odd ones."""
    return [list(sides) if r % 2 == 0 else list(reversed(sides)) for r in range(rounds)]


def alternate(sides: dict[str, Callable[[], T]], rounds: int) -> dict[str, list[T]]:
    """Call every side once per round, in round_order; each side's results in round order."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    results: dict[str, list[T]] = {name: [] for name in sides}
    for order in round_order(list(sides), rounds):
        for name in order:
            results[name].append(sides[name]())
    return results


def timed(fn: Callable[[], object]) -> Callable[[], float]:
    """fn as a side whose result is the wall seconds of one call."""

    def run() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    return run


def medians(results: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in results.items()}


def median_run(runs: list[dict], key: str) -> dict:
    """The run whose `key` is the median (the lower one of an even count): one real round's whole
    record, for reports that keep a run's details beside its figure."""
    return sorted(runs, key=lambda run: run[key])[(len(runs) - 1) // 2]


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded."""
    return [round(x, 2) for x in os.getloadavg()]


def machine_load(at_start: list[float]) -> dict:
    """The report's load keys: CPU count (and those this process may use), load averages at the
    start (given) and now."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    return {
        "cpus": os.cpu_count(),
        "cpus_usable": usable,
        "loadavg_at_start": at_start,
        "loadavg_at_end": loadavg(),
    }


def drop_page_cache(paths) -> None:
    """Evict the files' clean pages (written back: fsync first), so the next read goes to the
    device (a VM's host may still cache the disk)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
