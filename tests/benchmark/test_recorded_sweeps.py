"""The decision on a sweep recorded by a real benchmark run (tests/benchmark/sweeps/: the default's
vLLM CPU servers side by side, ten rounds): a load clearly above 1 decides yes at the family's
level, two ks whose intervals overlap but which the paired test separates give the rule's k, one k
straddling 1 stays undecided with the rounds that would decide it, passes centred on 1 settle as
no gain worth deploying, and the same passes read the other way round (the plain server against
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
        serve_concurrency=serve,
        speedup_goals=[1.0],
        confidence=0.9,
        undecided_k=0,
        k_margin=0.05,
        margin=0.05,
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


# 3 loads x (3 ks + 3 pairs of ks), one look: 18 intervals share the 90%
FAMILY = 18


def test_clearly_above_one_decides_yes(levels):
    v = decide(levels)
    d = v["decisions"]["1"]
    pairs = levels[1].speculative[d["k"]]["paired_speedups"]
    low, high = by_hand(pairs, family=FAMILY)
    assert d["decision"] == "yes" and (d["low"], d["high"]) == (round(low, 4), round(high, 4))
    assert d["low"] > 1.05
    assert v["family"]["intervals"] == FAMILY and v["family"]["statements_per_look"] == FAMILY


def test_the_paired_k_against_k_interval_is_the_difference_of_logs_round_by_round(levels):
    pairs = {k: s["paired_speedups"] for k, s in levels[4].speculative.items()}
    d = decide(levels)["decisions"]["4"]
    diffs = [b / a for a, b in zip(pairs[1], pairs[3], strict=True)]
    low, high = by_hand(diffs, family=FAMILY)
    v = d["versus"]["k3/k1"]
    assert v["paired"] and (v["low"], v["high"]) == (round(low, 4), round(high, 4))
    # the shared baseline pass cancels: the paired interval is narrower than either k's own
    width = math.log(v["high"] / v["low"])
    for k in (1, 3):
        assert width < math.log(d["by_k"][k]["high"] / d["by_k"][k]["low"])


def with_k3(level: Level, factor: float) -> Level:
    """The level with k=3's passes replaced by k=1's, each `factor` times faster with a small
    jitter: the same rounds, the same baseline passes."""
    k1 = level.speculative[1]["paired_speedups"]
    jitter = [1.0, 1.01, 0.99, 1.02, 0.98, 1.0, 1.015, 0.985, 1.0, 1.005]
    k3 = [round(r * factor * j, 4) for r, j in zip(k1, jitter, strict=True)]
    return Level(
        level.baseline,
        {1: level.speculative[1], 3: {**level.speculative[3], "paired_speedups": k3}},
    )


def test_two_ks_told_apart_by_the_paired_test_but_not_by_their_intervals_give_the_rules_k(levels):
    """At 4 in flight: k=3 runs 20% faster than k=1 in every round of the recorded sweep. Their
    own intervals overlap (the baseline's round-to-round noise is in both), so an overlap rule
    would call them tied and deploy k=1; the paired test sees k=3 beat k=1 by more than the k
    margin, and the rule deploys k=3."""
    level = with_k3(levels[4], 1.2)
    v = decide({4: level})
    d = v["decisions"]["4"]
    one, three = d["by_k"][1], d["by_k"][3]
    assert one["low"] > 1 and three["low"] > 1  # both pay
    assert one["low"] <= three["high"] and three["low"] <= one["high"]  # overlapping intervals
    diffs = [b / a for a, b in zip(*(level.speculative[k]["paired_speedups"] for k in (1, 3)))]
    low, _ = by_hand(diffs, family=3)  # one load, 2 ks and their pair
    assert d["versus"]["k3/k1"]["low"] == round(low, 4) > 1.05
    assert (
        d["decision"] == "yes"
        and d["k"] == 3
        and d["passed_over"] == {1: "k=3 beats it by more than 5%"}
    )
    assert v["k_per_batch_size"] == [[1, 4, 3]]


def test_a_larger_k_within_the_margin_leaves_the_smaller_k(levels):
    """k=3 only 2% faster in every round: not a confident margin, k=1 stays; and with the paired
    interval inside the margin the load is settled (more rounds would not move k)."""
    d = decide({4: with_k3(levels[4], 1.02)})["decisions"]["4"]
    assert d["decision"] == "yes" and d["k"] == 1
    assert d["versus"]["k3/k1"]["high"] < 1.05 and d["settled"]


def test_one_k_straddling_one_stays_undecided_with_the_rounds_that_would_decide(levels):
    """k=1 alone at 16 in flight: its interval holds 1, so no decision; the spread observed says
    how many rounds would settle it: the interval leaving 1, or closing inside the 5% margin,
    whichever comes first (here the margin: its mean sits 1.6% above 1)."""
    alone = {16: Level(levels[16].baseline, {1: levels[16].speculative[1]})}
    v = decide(alone, serve=16)
    d = v["decisions"]["16"]
    low, high = by_hand(levels[16].speculative[1]["paired_speedups"], family=1)
    assert d["decision"] == "undecided" and low < 1 < high and v["pays_off"] is None
    assert not d["settled"] and d["rounds_to_decide"] > 10
    iv, n = d["by_k"][1], d["rounds_to_decide"]
    gap = max(abs(iv["mean_log"]), math.log(1.05) - abs(iv["mean_log"]))
    assert stats.t.ppf(0.95, n - 1) * iv["sd_log"] / math.sqrt(n) < gap
    assert stats.t.ppf(0.95, n - 2) * iv["sd_log"] / math.sqrt(n - 1) >= gap
    assert v["k_per_batch_size"] == [[1, 16, 0]]  # undecided: benchmark.undecided_k (0)
    assert "at 16 requests in flight it cannot be told" in v["words"]
    assert f"about {d['rounds_to_decide']} rounds of passes" in v["words"]


def test_passes_centred_on_one_settle_as_no_gain_worth_deploying(levels):
    """k=1 at 16 in flight divided by its own geometric mean, its spread shrunk to a tenth: the
    interval lies inside 5% of 1, which no number of rounds would move out of it: no gain worth
    deploying, settled, deployed as benchmark.undecided_k."""
    pairs = levels[16].speculative[1]["paired_speedups"]
    mean = sum(math.log(r) for r in pairs) / len(pairs)
    centred = [round(math.exp((math.log(r) - mean) / 10), 4) for r in pairs]
    level = Level(
        levels[16].baseline, {1: {**levels[16].speculative[1], "paired_speedups": centred}}
    )
    v = decide({16: level}, serve=16)
    d = v["decisions"]["16"]
    assert d["decision"] == "no_gain" and d["settled"] and d["k"] is None
    assert 1 / 1.05 <= d["low"] < 1 < d["high"] <= 1.05
    assert v["pays_off"] is False and v["k_per_batch_size"] == [[1, 16, 0]]
    assert "no gain worth deploying" in v["words"]


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
    level = intervals.Rule(loads=3, ks=3).level
    ten = intervals.interval(pairs, level)
    three = intervals.interval(pairs[:3], level)
    assert three["high"] - three["low"] > ten["high"] - ten["low"]


def test_more_looks_planned_widen_every_interval(levels):
    """The confidence is split over the looks: the same passes judged as one of four looks give
    wider intervals than as the only one."""
    one = verdict.decisions(levels, intervals.Rule(loads=3, ks=3, looks=1))
    four = verdict.decisions(levels, intervals.Rule(loads=3, ks=3, looks=4))
    for c in levels:
        for k in (1, 2, 3):
            a, b = one[c]["by_k"][k], four[c]["by_k"][k]
            assert b["low"] < a["low"] and b["high"] > a["high"]
