"""The overhead scripts' A/B rounds alternate (each round the reverse of the last), summarise each
side by its median, and record the machine load."""

import pytest

from devtools import ab_timing
from devtools.ab_timing import (
    alternate,
    machine_load,
    median_run,
    medians,
    round_order,
    timed,
)


def test_sides_alternate_round_by_round():
    calls = []

    def side(name, results):
        values = iter(results)

        def run():
            calls.append(name)
            return next(values)

        return run

    runs = alternate({"ours": side("ours", [3, 1, 2, 9]), "bare": side("bare", [5, 4, 6, 7])}, 4)
    assert calls == ["ours", "bare", "bare", "ours", "ours", "bare", "bare", "ours"]
    assert runs == {"ours": [3, 1, 2, 9], "bare": [5, 4, 6, 7]}  # each side's in its round order
    assert medians(runs) == {"ours": 2.5, "bare": 5.5}


def test_three_sides_reverse_too():
    assert round_order(["a", "b", "c"], 3) == [["a", "b", "c"], ["c", "b", "a"], ["a", "b", "c"]]


def test_no_rounds_is_refused():
    with pytest.raises(ValueError, match="rounds"):
        alternate({"ours": lambda: 1}, 0)


def test_timed_returns_the_seconds_of_one_call(monkeypatch):
    clock = iter([10.0, 12.5])
    monkeypatch.setattr(ab_timing.time, "perf_counter", lambda: next(clock))
    calls = []
    assert timed(lambda: calls.append(1))() == 2.5 and calls == [1]


def test_median_run_is_one_real_round():
    runs = [{"ratio": 0.9, "id": 0}, {"ratio": 0.7, "id": 1}, {"ratio": 0.8, "id": 2}]
    assert median_run(runs, "ratio")["id"] == 2
    assert median_run(runs[:2], "ratio")["id"] == 1  # even count: the lower one


def test_the_machine_load_is_recorded(monkeypatch):
    loads = iter([(2.123, 1.0, 0.5), (3.0, 1.5, 0.75)])
    monkeypatch.setattr(ab_timing.os, "getloadavg", lambda: next(loads))
    monkeypatch.setattr(ab_timing.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(ab_timing.os, "sched_getaffinity", lambda _pid: {0, 1})
    at_start = ab_timing.loadavg()
    assert machine_load(at_start) == {
        "cpus": 16,
        "cpus_usable": 2,
        "loadavg_at_start": [2.12, 1.0, 0.5],
        "loadavg_at_end": [3.0, 1.5, 0.75],
    }
