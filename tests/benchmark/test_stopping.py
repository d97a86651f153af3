"""Rounds until the evidence decides: the stopping rule keeps its stated error rate on simulated
passes where naive peeking does not (devtools/stopping_rule.py), and the sweep's rounds stop at
the first look where every decision is settled, or at the budget, saying which loads it left
unsettled. The servers here are stand-ins that return timed passes at a known speedup; the loop,
the pairing and the decisions are the benchmark's own."""

from __future__ import annotations

import itertools
import math
import random
from types import SimpleNamespace

import pytest

from devtools import stopping_rule
from draftline.benchmark import server
from draftline.benchmark.config import BenchmarkConfig
from draftline.benchmark.rounds import Pass

SCENARIOS = {s.name: s for s in stopping_rule.SCENARIOS}


def test_peeking_after_every_round_breaks_the_confidence_and_the_rule_keeps_it():
    """One k at true speedup 1, a look after every round from 2 to 20, stopping at the first
    settled interval: judged as if each look were the only one, 1,000 runs err far above the
    stated 10%; with the confidence split over the planned looks, below it (95% Wilson)."""
    s = SCENARIOS["one_interval_null"]
    rule = stopping_rule.simulate(s, naive=False, runs=1000, seed=1)
    naive = stopping_rule.simulate(s, naive=True, runs=1000, seed=1)
    assert naive["error_rate_95"][0] > 0.1
    assert rule["error_rate_95"][1] < 0.1


def test_the_schedules_family_holds_at_its_stop():
    """The default's schedule (3 loads x 3 ks, two looks) with speedups like the default's: the
    intervals it stops on all hold their truth in at least 90% of the runs."""
    out = stopping_rule.simulate(SCENARIOS["schedule_mixed"], naive=False, runs=300, seed=2)
    assert out["error_rate_95"][1] < 0.1


class Stand_in:
    """A served engine's passes without a server: tokens/s at a known speedup over the baseline,
    with a log-normal spread; the baseline's noise shared by the round."""

    def __init__(self, speedups: dict[str, float], sd: float, seed: int = 0):
        self.speedups, self.sd, self.rng = speedups, sd, random.Random(seed)
        self.clock = itertools.count(0, 10)  # every time.time() call: 10 s later

    def pass_of(self, sweeper, run, c, rnd, idle):
        base = 100 * math.exp(self.rng.gauss(0, self.sd))
        tps = base * self.speedups.get(run.mode.name, 1.0) * math.exp(self.rng.gauss(0, self.sd))
        result = SimpleNamespace(ok=True, output_tokens=tps)
        start = float(next(self.clock))
        p = Pass(run.mode.name, c, rnd, start, start + 1, [result], 1.0, {})
        sweeper.passes.append(p)


def sweeper(monkeypatch, stand_in: Stand_in, **params) -> tuple[server.Sweeper, dict]:
    cfg = BenchmarkConfig(concurrency=[1, 4], serve_concurrency=4, k=[1, 2], **params)
    monkeypatch.setattr(server.Sweeper, "timed_pass", lambda self, *a: stand_in.pass_of(self, *a))
    monkeypatch.setattr(server.time, "time", lambda: float(next(stand_in.clock)))
    sweep = server.Sweeper(SimpleNamespace(cfg=cfg), "side_by_side")
    running = {
        name: server.Running(server.Mode(name, None if k is None else "d", k), "", None, "")
        for name, k in (("baseline", None), ("k1", 1), ("k2", 2))
    }
    return sweep, running


def test_rounds_stop_at_the_first_look_where_every_load_is_settled(monkeypatch):
    """k=1 and k=2 both 1.5x, 0.5% spread: at the first look (min_rounds) both lie above 1 and
    within the k margin of each other: settled, no more rounds."""
    stand_in = Stand_in({"k1": 1.5, "k2": 1.5}, sd=0.005)
    sweep, running = sweeper(monkeypatch, stand_in, repeats=20, min_rounds=6, look_every=4)
    sweep.rounds(running)
    assert [look["round"] for look in sweep.looks] == [6]
    assert sweep.stops == [sweep.looks[0]] and sweep.looks[0]["stop"] == "settled"
    assert max(p.round for p in sweep.passes) + 1 == 6


def test_a_sweep_the_budget_cannot_decide_stops_at_the_budget_and_says_so(monkeypatch):
    """k=1 at 1.02x with a 10% spread never settles inside 12 rounds: the rounds stop at the
    budget, each look names the loads still unsettled; with budget_s the next look that would
    pass it is not run."""
    stand_in = Stand_in({"k1": 1.02, "k2": 1.02}, sd=0.1)
    sweep, running = sweeper(monkeypatch, stand_in, repeats=12, min_rounds=4, look_every=4)
    sweep.rounds(running)
    assert [look["round"] for look in sweep.looks] == [4, 8, 12]
    assert sweep.stops[-1]["stop"] == "repeats" and sweep.stops[-1]["unsettled"]
    assert set(sweep.stops[-1]["unsettled"]) <= {"draft@c1", "draft@c4"}

    stand_in = Stand_in({"k1": 1.02, "k2": 1.02}, sd=0.1)
    # each pass and each clock read advance the stand-in's clock 10 s: 4 rounds take ~250 s
    sweep, running = sweeper(
        monkeypatch, stand_in, repeats=12, min_rounds=4, look_every=4, budget_s=400
    )
    sweep.rounds(running)
    assert [look["round"] for look in sweep.looks] == [4]
    assert sweep.stops[-1]["stop"] == "budget_s"


@pytest.mark.parametrize(
    "repeats, min_rounds, look_every, looks",
    [(20, 8, 4, [8, 12, 16, 20]), (10, 8, 4, [8, 10]), (3, 8, 4, [3]), (16, 8, 4, [8, 12, 16])],
)
def test_the_planned_looks(repeats, min_rounds, look_every, looks):
    cfg = BenchmarkConfig(repeats=repeats, min_rounds=min_rounds, look_every=look_every)
    assert cfg.looks == looks
