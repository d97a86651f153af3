"""The benchmark's stopping rule on simulated passes: how often the intervals it stops on miss the
truth, against naive peeking (the same looks, each judged as if it were the only one).

    python -m devtools.stopping_rule --runs 2000 --out reports/benchmark_design/stopping.json

A simulated sweep is the benchmark's own shape: at each load, each round, one baseline pass and
one pass per k; the log of a k's paired ratio is its true log speedup, plus that pass's noise,
minus the baseline pass's noise, which every k of the round shares (so ks compared round by round
see it cancel). Rounds run as draftline/benchmark/server.py runs them: a look after each planned
round (benchmark.looks), a stop at the first look where every load is settled
(draftline/benchmark/intervals.py), else at the budget. An error is a run whose intervals at its
stop do not all hold their true values (each k's speedup, each pair of ks, at every load): the
family the stated confidence covers. Three scenarios:
- `one_interval_null`: one load, one k, true speedup 1, a look after every round from 2 to 20:
  the textbook case of peeking;
- `schedule_null`: the default's schedule (3 loads x 3 ks, looks after 8 and 12 rounds),
  every true speedup 1;
- `schedule_mixed`: the same, true speedups like the default's reruns (clear at 1 and 4 requests in
  flight, near 1 at 16).
The noise's spread (BASELINE_SD, PASS_SD, in the report) is of the order of the recorded default
sweep's (tests/benchmark/sweeps/default_vllm_cpu.json: the paired log ratios' standard deviation
per k and load, and the baseline passes').
"""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass

from draftline.benchmark.intervals import Rule, decide_load
from draftline.core.io import write_json

BASELINE_SD = 0.12  # log sd of a baseline pass
PASS_SD = 0.1  # log sd of a speculative pass


@dataclass(frozen=True)
class Scenario:
    name: str
    speedups: dict[int, dict[int, float]]  # {load: {k: true speedup}}
    looks: tuple[int, ...]


SCENARIOS = [
    Scenario("one_interval_null", {1: {1: 1.0}}, tuple(range(2, 21))),
    Scenario(
        "schedule_null",
        {c: {k: 1.0 for k in (1, 2, 3)} for c in (1, 4, 16)},
        (8, 12),
    ),
    Scenario(
        "schedule_mixed",
        {
            1: {1: 1.15, 2: 1.3, 3: 1.35},
            4: {1: 1.22, 2: 1.28, 3: 1.28},
            16: {1: 1.0, 2: 1.05, 3: 1.1},
        },
        (8, 12),
    ),
]


def rule_for(s: Scenario, naive: bool, confidence: float) -> Rule:
    ks = max(len(by_k) for by_k in s.speedups.values())
    return Rule(confidence, 0.05, 0.05, len(s.speedups), ks, 1 if naive else len(s.looks))


def covers(d: dict, truth: dict[int, float]) -> bool:
    """Whether every interval of a load's decision holds its true value."""
    for k, iv in d["by_k"].items():
        if iv["low"] is not None and not iv["low"] <= truth[k] <= iv["high"]:
            return False
    for name, v in d["versus"].items():
        hi, lo = (int(x[1:]) for x in name.split("/"))
        if v["low"] is not None and not v["low"] <= truth[hi] / truth[lo] <= v["high"]:
            return False
    return True


def one_run(s: Scenario, rule: Rule, rng: random.Random) -> tuple[bool, int]:
    """(error, rounds) of one simulated sweep stopped by `rule`."""
    pairs = {c: {k: [] for k in by_k} for c, by_k in s.speedups.items()}
    for rnd in range(1, max(s.looks) + 1):
        for c, by_k in s.speedups.items():
            base = rng.gauss(0, BASELINE_SD)
            for k, speedup in by_k.items():
                pairs[c][k].append(math.exp(math.log(speedup) + rng.gauss(0, PASS_SD) - base))
        if rnd not in s.looks:
            continue
        decided = {c: decide_load(pairs[c], rule) for c in pairs}
        if rnd == max(s.looks) or all(d["settled"] for d in decided.values()):
            error = not all(covers(decided[c], s.speedups[c]) for c in decided)
            return error, rnd
    raise AssertionError("unreachable: the last look stops")


def simulate(s: Scenario, naive: bool, runs: int, seed: int = 0, confidence: float = 0.9) -> dict:
    """The error rate of `runs` simulated sweeps (with its 95% Wilson interval) and their mean
    rounds."""
    rng = random.Random(seed)
    rule = rule_for(s, naive, confidence)
    errors, rounds = 0, 0
    for _ in range(runs):
        error, n = one_run(s, rule, rng)
        errors += error
        rounds += n
    return {
        "error_rate": round(errors / runs, 4),
        "error_rate_95": [round(x, 4) for x in wilson(errors, runs)],
        "mean_rounds": round(rounds / runs, 2),
        "each_interval_level": round(rule.level, 6),
    }


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def report(runs: int, seed: int = 0, confidence: float = 0.9) -> dict:
    return {
        "stated_error_rate": round(1 - confidence, 4),
        "runs": runs,
        "seed": seed,
        "noise": {"baseline_pass_log_sd": BASELINE_SD, "speculative_pass_log_sd": PASS_SD},
        "scenarios": {
            s.name: {
                "loads": sorted(s.speedups),
                "true_speedups": {str(c): by_k for c, by_k in s.speedups.items()},
                "looks": list(s.looks),
                "rule": simulate(s, False, runs, seed, confidence),
                "naive_peeking": simulate(s, True, runs, seed, confidence),
            }
            for s in SCENARIOS
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="reports/benchmark_design/stopping.json")
    args = parser.parse_args()
    out = report(args.runs, args.seed)
    write_json(args.out, out)
    for name, s in out["scenarios"].items():
        print(
            f"{name}: rule {s['rule']['error_rate']:.3f} in {s['rule']['mean_rounds']} rounds, "
            f"naive peeking {s['naive_peeking']['error_rate']:.3f} "
            f"(stated {out['stated_error_rate']})"
        )


if __name__ == "__main__":
    main()
