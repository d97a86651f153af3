"""How many rounds the benchmark needs before its deployed schedule holds on a rerun: a bootstrap
over the rounds of recorded runs, decided by the benchmark's own rule at each budget.

    python -m devtools.benchmark_power a73fa57=a73fa57:reports/benchmark.detail.json ... \\
        --budgets 12 24 48 96 144 192 \\
        --pass-length 3s=reports/benchmark_design/pass_3s.detail.json \\
        --out reports/benchmark_design/power.json

Each LABEL=path is a benchmark.detail.json of the same draft and params (one group of servers side
by side): a file, or REV:path, the file as committed in REV (`git show`). A round at a load gives each k its paired ratio over that round's baseline pass; the
rounds of every run form the pool. A simulated run draws `budget` rounds from the pool (with
replacement, whole rounds: the ks of a round keep their shared baseline), looks at them where
benchmark.min_rounds and benchmark.look_every plan looks, stops at the first look where every load
is settled, and deploys the schedule draftline/benchmark/verdict.py builds from the decisions of
draftline/benchmark/intervals.py (the family counted as the benchmark counts it: every k, every
pair of ks and the free methods' statements, at every load and planned look). Reported per budget:
the most frequent schedule, the share of runs that deploy it (p) and the chance that at least four
of five independent runs deploy the same one (p^5 + 5 p^4 (1 - p), taking the most frequent as the
one they agree on), with the minutes of rounds the budget costs at the pool's seconds per round.
The pool's means stand in for the truth: a bootstrap from a few dozen rounds, an estimate, not a
guarantee.

`--pass-length LABEL=path`: a run at another benchmark.min_pass_s. Its paired log ratios' spread
times the square root of its median pass seconds, beside the pool's: where the two agree, the noise
falls as the square root of the time measured, and longer passes buy nothing that more rounds of
short ones do not.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from draftline.benchmark.intervals import Rule, decide_load
from draftline.benchmark.verdict import k_schedule
from draftline.core.io import write_json

FOUR_OF_FIVE = 0.8  # the share of five reruns that must deploy the same schedule


def rounds_of(detail: dict) -> list[dict[int, dict[int, float]]]:
    """[{load: {k: paired ratio}}] per round of a one-group side-by-side run."""
    v = detail["verdict"]
    design = v["design"]
    if design.get("layout") != "side_by_side" or len(design.get("groups") or [[]]) != 1:
        raise SystemExit("error: benchmark_power reads one-group side_by_side runs only")
    out: list[dict[int, dict[int, float]]] = []
    ks = [int(k) for k in detail["ks"]]
    for i in range(design["rounds"]):
        one = {}
        for c in detail["concurrency"]:
            level = detail["levels"][f"c{c}"]
            base = level["baseline"]["runs_tokens_per_s"][i]
            one[c] = {k: level[f"k{k}"]["runs_tokens_per_s"][i] / base for k in ks}
        out.append(one)
    return out


def rule_of(detail: dict, looks: int) -> Rule:
    """The run's rule with `looks` planned looks (the family as the run counted it otherwise)."""
    v = detail["verdict"]
    fam = v["family"]
    schedule = fam["loads"] * (fam["ks"] + fam["ks"] * (fam["ks"] - 1) // 2)
    return Rule(
        confidence=v["confidence"],
        k_margin=v["k_margin"],
        margin=v["margin"],
        loads=fam["loads"],
        ks=fam["ks"],
        looks=looks,
        extra=fam["statements_per_look"] - schedule,
    )


def looks_for(budget: int, min_rounds: int, look_every: int) -> list[int]:
    """The rounds a budget looks after (BenchmarkConfig.looks)."""
    first = min(min_rounds, budget)
    return sorted({*range(first, budget, look_every), budget})


def simulate(pool, rule_at, looks: list[int], undecided_k: int, max_batch: int, rng) -> tuple:
    """One run drawn from the pool: (its schedule as a string, {load: (decision, k)}, rounds)."""
    rounds = [rng.choice(pool) for _ in range(looks[-1])]
    rule = rule_at(len(looks))
    loads = sorted(pool[0])
    for n in looks:
        decided = {
            c: decide_load({k: [r[c][k] for r in rounds[:n]] for k in pool[0][c]}, rule)
            for c in loads
        }
        if all(d["settled"] for d in decided.values()):
            break
    schedule = json.dumps(k_schedule(decided, undecided_k, max_batch))
    return schedule, {c: (d["decision"], d["k"]) for c, d in decided.items()}, n


@dataclass(frozen=True)
class Budget:
    """What a simulated run may spend, how it looks, and what it deploys where undecided."""

    rounds: int
    min_rounds: int = 8
    look_every: int = 4
    undecided_k: int = 0
    max_batch: int = 1024


def power(pool, rule_at, budget: Budget, runs: int, seed: int) -> dict:
    """The schedules `runs` simulated runs at this budget deploy (seeded)."""
    rng = random.Random(seed)
    looks = looks_for(budget.rounds, budget.min_rounds, budget.look_every)
    schedules: Counter = Counter()
    by_load: dict[int, Counter] = {c: Counter() for c in pool[0]}
    stopped: Counter = Counter()
    for _ in range(runs):
        schedule, decided, n = simulate(
            pool, rule_at, looks, budget.undecided_k, budget.max_batch, rng
        )
        schedules[schedule] += 1
        stopped[n] += 1
        for c, (decision, k) in decided.items():
            by_load[c][f"{decision} k={k}" if decision == "yes" else decision] += 1
    top, count = schedules.most_common(1)[0]
    p = count / runs
    return {
        "looks_at": looks,
        "modal_schedule": json.loads(top),
        "p_modal": round(p, 4),
        "p_four_of_five": round(p**5 + 5 * p**4 * (1 - p), 4),
        "distinct_schedules": len(schedules),
        "stopped_at": {str(n): stopped[n] for n in sorted(stopped)},
        "by_load": {
            str(c): {what: round(n / runs, 4) for what, n in counts.most_common()}
            for c, counts in by_load.items()
        },
    }


def spread(detail: dict) -> dict:
    """The pooled sd of the paired log ratios, the median pass seconds, and their product with the
    square root of those seconds (the spread of one second's worth of passes)."""
    logs = {}
    for r in rounds_of(detail):
        for c, by_k in r.items():
            for k, ratio in by_k.items():
                logs.setdefault((c, k), []).append(math.log(ratio))
    var = [
        sum((x - sum(v) / len(v)) ** 2 for x in v) / (len(v) - 1)
        for v in logs.values()
        if len(v) > 1
    ]
    sd = math.sqrt(sum(var) / len(var))
    pass_s = detail["verdict"]["design"]["pass_s_median"]
    return {
        "rounds": detail["verdict"]["design"]["rounds"],
        "pass_s_median": pass_s,
        "pooled_sd_log": round(sd, 4),
        "sd_log_per_second": round(sd * math.sqrt(pass_s), 4),
    }


def read_detail(path: str) -> dict:
    """A detail file, or REV:path as committed in REV."""
    if Path(path).is_file():
        return json.loads(Path(path).read_text())
    shown = subprocess.run(["git", "show", path], capture_output=True, text=True)
    if shown.returncode != 0:
        raise SystemExit(
            f"error: {path}: no such file, nor a REV:path git knows ({shown.stderr.strip()})"
        )
    return json.loads(shown.stdout)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="LABEL=benchmark.detail.json of the same draft")
    ap.add_argument("--budgets", type=int, nargs="+", default=[12, 24, 48, 96])
    ap.add_argument("--min-rounds", type=int, default=8)
    ap.add_argument("--look-every", type=int, default=4)
    ap.add_argument("--simulated", type=int, default=1000, help="simulated runs per budget")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--undecided-k", type=int, default=0)
    ap.add_argument("--max-batch-size", type=int, default=1024)
    ap.add_argument("--pass-length", nargs="*", default=[], help="LABEL=detail at another length")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    details = {}
    for arg in args.runs:
        label, _, path = arg.partition("=")
        details[label] = read_detail(path)
    first = next(iter(details.values()))
    pool = [r for d in details.values() for r in rounds_of(d)]
    seconds = [d["verdict"]["design"]["stops"][-1]["seconds"] for d in details.values()]
    rounds = [d["verdict"]["design"]["rounds"] for d in details.values()]
    round_s = sum(seconds) / sum(rounds)

    def rule_at(looks: int) -> Rule:
        return rule_of(first, looks)

    budgets = {}
    for budget in args.budgets:
        plan = Budget(
            budget, args.min_rounds, args.look_every, args.undecided_k, args.max_batch_size
        )
        out = power(pool, rule_at, plan, args.simulated, args.seed)
        budgets[str(budget)] = {**out, "minutes_of_rounds": round(budget * round_s / 60, 1)}
    enough = [b for b, o in budgets.items() if o["p_four_of_five"] >= FOUR_OF_FIVE]
    pooled = {
        str(c): {
            str(k): round(math.exp(sum(math.log(r[c][k]) for r in pool) / len(pool)), 4)
            for k in pool[0][c]
        }
        for c in pool[0]
    }
    report = {
        "runs": list(details),
        "pool_rounds": len(pool),
        "round_s": round(round_s, 1),
        "pooled_speedup": pooled,
        "rule": {
            "k_margin": first["verdict"]["k_margin"],
            "margin": first["verdict"]["margin"],
            "confidence": first["verdict"]["confidence"],
            "statements_per_look": first["verdict"]["family"]["statements_per_look"],
        },
        "min_rounds": args.min_rounds,
        "look_every": args.look_every,
        "simulated": args.simulated,
        "budgets": budgets,
        "smallest_budget_four_of_five": min((int(b) for b in enough), default=None),
        "pass_length": {
            "pool": spread_pool(details),
            **{
                label: spread(read_detail(path))
                for label, _, path in (a.partition("=") for a in args.pass_length)
            },
        },
    }
    write_json(args.out, report)
    for b, o in budgets.items():
        print(
            f"{b} rounds ({o['minutes_of_rounds']} min): p {o['p_modal']:.2f}, "
            f"4 of 5 {o['p_four_of_five']:.2f}, {o['modal_schedule']}"
        )


def spread_pool(details: dict) -> dict:
    """spread() over every run of the pool (their pooled variances together)."""
    parts = [spread(d) for d in details.values()]
    sd = math.sqrt(sum(p["pooled_sd_log"] ** 2 for p in parts) / len(parts))
    pass_s = sorted(p["pass_s_median"] for p in parts)[len(parts) // 2]
    return {
        "rounds": sum(p["rounds"] for p in parts),
        "pass_s_median": pass_s,
        "pooled_sd_log": round(sd, 4),
        "sd_log_per_second": round(sd * math.sqrt(pass_s), 4),
    }


if __name__ == "__main__":
    main()
