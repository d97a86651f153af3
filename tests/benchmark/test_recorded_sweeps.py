"""The decision on a sweep recorded by a real benchmark run (tests/benchmark/sweeps/: the default's
vLLM CPU servers side by side, ten rounds): a load clearly above 1 decides yes, ks inside each
other's intervals give the k the rule names, one k straddling 1 stays undecided with the rounds
that would decide it, and the same passes read the other way round (the plain server against
the draft's) decide no. The numbers below are the recorded pairs' own, recomputed by hand."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from scipy import stats

from draftline.benchmark import intervals, verdict
from draftline.benchmark.sweep import Level, levels_from
from draftline.core.io import read_json

SWEEPS = Path(__file__).parent / "sweeps"


@pytest.fixture(scope="module")
def levels() -> dict:
    return levels_from(read_json(SWEEPS / "default_vllm_cpu.json"))


def decide(levels: dict, serve: int = 4) -> dict:
    cfg = SimpleNamespace(
        serve_concurrency=serve, speedup_goals=[1.0], confidence=0.9, undecided_k=0
    )
    return verdict.decide(levels, cfg, "vllm", [])


def by_hand(ratios: list[float], family: int, confidence: float = 0.9) -> tuple[float, float]:
    """The paired Student-t interval, from scipy directly."""
    logs = [math.log(r) for r in ratios]
    n, mean = len(logs), sum(logs) / len(logs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    q = stats.t.ppf(1 - (1 - confidence) / family / 2, n - 1)
    return math.exp(mean - q * sd / math.sqrt(n)), math.exp(mean + q * sd / math.sqrt(n))


def test_the_recorded_sweep_has_ten_pairs_per_k_and_load(levels):
    assert sorted(levels) == [1, 4, 16]
    for level in levels.values():
        assert sorted(level.speculative) == [1, 2, 3]
        assert all(len(s["paired_speedups"]) == 10 for s in level.speculative.values())


def test_clearly_above_one_decides_yes(levels):
    d = decide(levels)["decisions"]["1"]
    pairs = levels[1].speculative[d["k"]]["paired_speedups"]
    low, high = by_hand(pairs, family=3)
    assert d["decision"] == "yes" and (d["low"], d["high"]) == (round(low, 4), round(high, 4))
    assert d["low"] > 1.1


def test_ks_inside_each_others_interval_give_the_rules_k(levels):
    """At 4 in flight k=3 measures best, but k=1's and k=2's intervals reach into its: the rule
    takes the smallest k whose interval lies above 1."""
    d = decide(levels)["decisions"]["4"]
    best = d["by_k"][d["best_k"]]
    assert d["best_k"] == 3 and d["k"] == 1 and d["decision"] == "yes"
    assert d["indistinguishable"] == [2, 3]
    for k in (1, 2):
        assert d["by_k"][k]["low"] <= best["high"] and best["low"] <= d["by_k"][k]["high"]
        assert d["by_k"][k]["speedup"] < best["speedup"]


def test_one_k_straddling_one_stays_undecided_with_the_rounds_that_would_decide(levels):
    """k=1 alone at 16 in flight: its interval holds 1, so no decision; the spread observed says
    how many rounds would decide it."""
    alone = {16: Level(levels[16].baseline, {1: levels[16].speculative[1]})}
    v = decide(alone, serve=16)
    d = v["decisions"]["16"]
    low, high = by_hand(levels[16].speculative[1]["paired_speedups"], family=1)
    assert d["decision"] == "undecided" and low < 1 < high and v["pays_off"] is None
    assert d["rounds_to_decide"] > 10
    iv = d["by_k"][1]
    q = stats.t.ppf(0.95, d["rounds_to_decide"] - 1)
    assert q * iv["sd_log"] / math.sqrt(d["rounds_to_decide"]) < abs(iv["mean_log"])
    assert v["k_per_batch_size"] == [[1, 16, 0]]  # undecided: benchmark.undecided_k (0)
    assert "at 16 requests in flight it cannot be told" in v["words"]
    assert f"about {d['rounds_to_decide']} rounds of passes" in v["words"]


def test_the_same_passes_read_the_other_way_round_decide_no(levels):
    """The plain server against the draft's (each pair inverted): every k's interval lies below
    1 at four requests in flight: no, with no k to deploy."""
    inverted = {
        4: Level(
            levels[4].baseline,
            {
                k: {**s, "paired_speedups": [1 / r for r in s["paired_speedups"]]}
                for k, s in levels[4].speculative.items()
            },
        )
    }
    v = decide(inverted)
    d = v["decisions"]["4"]
    assert d["decision"] == "no" and d["k"] is None and v["pays_off"] is False
    assert all(iv["high"] < 1 for iv in d["by_k"].values())
    assert v["k_per_batch_size"] == [[1, 4, 0]]


def test_fewer_rounds_of_the_same_passes_widen_the_interval(levels):
    """The first three rounds alone: the same mean spread over fewer pairs, a wider interval."""
    pairs = levels[1].speculative[2]["paired_speedups"]
    ten = intervals.interval(pairs, 0.9, 3)
    three = intervals.interval(pairs[:3], 0.9, 3)
    assert three["high"] - three["low"] > ten["high"] - ten["low"]
