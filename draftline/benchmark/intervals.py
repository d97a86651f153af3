"""Speedup intervals, k against k, and the settled decision at one load, from paired passes.

A pass of a speculative server is paired with a pass of the baseline run beside it in time (the
same round of the interleaved sweep; in the sequential design, the baseline interpolated to the
pass's time). Each pair gives a ratio of output tokens/s; the speedup is the geometric mean of the
ratios and its interval the Student-t interval of their logarithms (n - 1 degrees of freedom),
exponentiated. In the sequential design the baseline may drift between its passes before and after
the speculative servers: half the log of that drift widens the interval (`drift_log`).

ks are compared with each other on the passes of the same round, which share that round's
baseline pass: the log of k' over k is the difference of their paired log ratios, round by round
(`paired_difference`), so the baseline's noise cancels instead of widening both intervals.

The family (`Rule`): every statement the schedule rests on, at every load (each k's speedup
interval and each pair of ks), at every planned look of the rounds (draftline/benchmark/server.py
looks at the passes after benchmark.min_rounds rounds, then every benchmark.look_every, up to
benchmark.repeats). Bonferroni over all of them: each interval is at 1 - (1 - confidence) /
(statements x looks), so that at whichever look the rounds stop, every interval of the schedule
holds together with probability at least `confidence` (alpha split evenly over the looks: a
union bound, valid whatever the stopping rule; tests/benchmark/test_stopping.py measures it).

The rule for k, fixed before any pass runs: among the ks whose speedup interval lies above 1,
the smallest k that no larger one beats by a confident margin (the paired interval of log(k'/k)
above log(1 + benchmark.k_margin)). The decision at the load:
- `yes`: some k's interval lies above 1; the rule's k is deployed;
- `no`: every k's interval lies below 1; no speculation;
- `no_gain`: no k's interval lies above 1, and each lies below 1 or inside
  [1 / (1 + benchmark.margin), 1 + benchmark.margin]: no gain worth deploying (an equivalence
  test), deployed as benchmark.undecided_k; a load whose true speedup is 1 ends here instead of
  flipping between yes and undecided;
- `undecided`: anything else; deployed as benchmark.undecided_k, with the rounds of passes the
  observed spread suggests would settle it.
A load is `settled` when its decision is yes, no or no_gain, every k's interval is settled (above
1, below 1 or inside the margin) and, for yes, every larger k above 1 is confidently within the
k margin of the rule's k or confidently beyond it: more rounds would not change its k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from draftline.core.stats import t_quantile

METHOD = (
    "paired passes (each speculative pass over the baseline pass beside it): geometric mean of the "
    "ratios, Student-t interval of their logs; ks against each other on the passes of the same "
    "round; Bonferroni over every k and pair of ks at every load and every planned look"
)
K_RULE = (
    "among the ks whose speedup interval lies above 1, the smallest k that no larger k beats by "
    "more than benchmark.k_margin (paired interval of log(k'/k) above log(1 + k_margin))"
)
MAX_ROUNDS = 10_000  # rounds_to_decide searches no further


@dataclass(frozen=True)
class Rule:
    """What a decision is held to: the family's confidence, the two margins and the family's size
    (the loads of the schedule, the ks at each and the planned looks)."""

    confidence: float = 0.9
    k_margin: float = 0.05  # a larger k must beat a smaller one by more than this (ratio - 1)
    margin: float = 0.05  # an interval inside [1/(1+margin), 1+margin] is no gain worth deploying
    loads: int = 1
    ks: int = 1
    looks: int = 1
    # statements beside the schedule's, held in the same family: each benchmark.free method's
    # speedup and the draft over it, at each load (draftline/benchmark/verdict.py)
    extra: int = 0

    @property
    def statements(self) -> int:
        """Intervals a look rests on: each k's speedup and each pair of ks, at each load, and the
        extra ones."""
        return self.loads * (self.ks + self.ks * (self.ks - 1) // 2) + self.extra

    @property
    def family(self) -> int:
        return self.statements * self.looks

    @property
    def level(self) -> float:
        """Each interval's own confidence."""
        return 1 - (1 - self.confidence) / self.family


def t_interval(logs: list[float], level: float, drift_log: float = 0.0) -> dict:
    """{mean_log, sd_log, half_width_log, n} of a Student-t interval of `logs` at `level`; sd and
    half-width None with fewer than two values."""
    n = len(logs)
    mean = sum(logs) / n
    out = {"n": n, "mean_log": round(mean, 6), "sd_log": None, "half_width_log": None}
    if n < 2:
        return out
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    half = t_quantile(1 - (1 - level) / 2, n - 1) * sd / math.sqrt(n) + abs(drift_log) / 2
    return {**out, "sd_log": round(sd, 6), "half_width_log": round(half, 6)}


def interval(ratios: list[float], level: float, drift_log: float = 0.0) -> dict:
    """{speedup, low, high, n, mean_log, sd_log, half_width_log} of paired ratios, the interval at
    `level` (Rule.level); low/high None with fewer than two pairs (no spread to judge by)."""
    logs = [math.log(r) for r in ratios if r and r > 0]
    if not logs:
        return {"speedup": None, "low": None, "high": None, "n": 0}
    iv = t_interval(logs, level, drift_log)
    out = {"speedup": round(math.exp(iv["mean_log"]), 4), **iv}
    if iv["half_width_log"] is None:
        return {**out, "low": None, "high": None}
    mean, half = iv["mean_log"], iv["half_width_log"]
    return {**out, "low": round(math.exp(mean - half), 4), "high": round(math.exp(mean + half), 4)}


def paired_difference(a: list[float], b: list[float], level: float, drift_log: float = 0.0) -> dict:
    """a over b, round by round: the interval of log(a_i / b_i) where a and b are the paired ratios
    of two servers measured in the same rounds (they share each round's baseline pass, which
    cancels). {ratio, low, high, n, mean_log, sd_log, half_width_log, paired}; where the rounds do
    not line up (other counts: other groups or designs) the two are compared unpaired (Welch)."""
    la = [math.log(r) for r in a if r and r > 0]
    lb = [math.log(r) for r in b if r and r > 0]
    if not la or not lb:
        return {"ratio": None, "low": None, "high": None, "n": 0, "paired": False}
    if len(la) == len(lb):
        iv = t_interval([x - y for x, y in zip(la, lb, strict=True)], level, drift_log)
        out = {"ratio": round(math.exp(iv["mean_log"]), 4), **iv, "paired": True}
    else:
        out = _welch(la, lb, level, drift_log)
    if out.get("half_width_log") is None:
        return {**out, "low": None, "high": None}
    mean, half = out["mean_log"], out["half_width_log"]
    return {**out, "low": round(math.exp(mean - half), 4), "high": round(math.exp(mean + half), 4)}


def _welch(la: list[float], lb: list[float], level: float, drift_log: float) -> dict:
    na, nb = len(la), len(lb)
    ma, mb = sum(la) / na, sum(lb) / nb
    out = {"ratio": round(math.exp(ma - mb), 4), "n": min(na, nb), "mean_log": round(ma - mb, 6)}
    if na < 2 or nb < 2:
        return {**out, "sd_log": None, "half_width_log": None, "paired": False}
    va = sum((x - ma) ** 2 for x in la) / (na - 1) / na
    vb = sum((x - mb) ** 2 for x in lb) / (nb - 1) / nb
    se = math.sqrt(va + vb)
    dof = (va + vb) ** 2 / ((va**2) / (na - 1) + (vb**2) / (nb - 1)) if se > 0 else na + nb - 2
    half = t_quantile(1 - (1 - level) / 2, max(1, int(dof))) * se + abs(drift_log) / 2
    return {
        **out,
        "sd_log": round(se * math.sqrt(min(na, nb)), 6),
        "half_width_log": round(half, 6),
        "paired": False,
    }


def rounds_to_decide(iv: dict, level: float, target_log: float = 0.0, drift_log: float = 0.0):
    """The pairs at which an interval with this mean and spread would no longer hold
    exp(target_log); None when the mean is the target itself, there is no spread to judge by, or
    the drift alone covers it."""
    mean, sd = iv.get("mean_log"), iv.get("sd_log")
    if mean is None or sd is None:
        return None
    gap = abs(mean - target_log)
    if gap == 0 or abs(drift_log) / 2 >= gap:
        return None

    def decides(n: int) -> bool:  # the half-width falls with n: a bisection finds the first n
        return t_quantile(1 - (1 - level) / 2, n - 1) * sd / math.sqrt(n) + abs(drift_log) / 2 < gap

    if not decides(MAX_ROUNDS):
        return None
    lo, hi = 2, MAX_ROUNDS
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if decides(mid) else (mid + 1, hi)
    return lo


def above(iv: dict) -> bool:
    return iv.get("low") is not None and iv["low"] > 1


def below(iv: dict) -> bool:
    return iv.get("high") is not None and iv["high"] < 1


def inside(iv: dict, margin: float) -> bool:
    """The interval lies within margin of 1 (equivalence: no gain worth deploying)."""
    return iv.get("low") is not None and 1 / (1 + margin) <= iv["low"] and iv["high"] <= 1 + margin


def settled_interval(iv: dict, margin: float) -> bool:
    return above(iv) or below(iv) or inside(iv, margin)


def choose_k(candidates: list[int], versus: dict, k_margin: float) -> tuple[int, dict]:
    """The rule's k among `candidates` (ks decided above 1, ascending): the smallest that no larger
    candidate beats by a confident margin; {k': why it was passed over}."""
    passed = {}
    for k in candidates:
        beaten_by = [
            o
            for o in candidates
            if o > k and versus[(o, k)]["low"] is not None and versus[(o, k)]["low"] > 1 + k_margin
        ]
        if not beaten_by:
            return k, passed
        passed[k] = f"k={beaten_by[0]} beats it by more than {k_margin:.0%}"
    return candidates[-1], passed  # unreachable: the largest candidate has no larger one


def decide_load(pairs: dict, rule: Rule, drift_log: dict | None = None) -> dict:
    """The decision at one load from {k: [paired ratios]} (drift_log: {k: log drift} of the
    sequential design): {decision, k, speedup, low, high, settled, by_k, versus, best_k,
    rounds_to_decide, ...}; k None where it decides no."""
    drift_log = drift_log or {}
    level = rule.level
    by_k = {k: interval(r, level, drift_log.get(k, 0.0)) for k, r in sorted(pairs.items())}
    measured = {k: iv for k, iv in by_k.items() if iv["speedup"] is not None}
    base = {
        "confidence": rule.confidence,
        "level": round(level, 6),
        "k_margin": rule.k_margin,
        "margin": rule.margin,
        "by_k": by_k,
    }
    if not measured:
        return {
            **base,
            "decision": "undecided",
            "k": None,
            "speedup": None,
            "low": None,
            "high": None,
            "settled": False,
            "versus": {},
            "best_k": None,
            "rounds": 0,
            "rounds_to_decide": None,
            "why": "no pass completed",
        }
    ks = sorted(measured)
    versus = {
        (o, k): paired_difference(
            pairs[o], pairs[k], level, max(abs(drift_log.get(o, 0.0)), abs(drift_log.get(k, 0.0)))
        )
        for k in ks
        for o in ks
        if o > k
    }
    best = max(ks, key=lambda k: measured[k]["speedup"])
    candidates = [k for k in ks if above(measured[k])]
    passed: dict = {}
    if candidates:
        decision = "yes"
        k, passed = choose_k(candidates, versus, rule.k_margin)
    elif all(below(iv) for iv in measured.values()):
        decision, k = "no", None
    elif all(below(iv) or inside(iv, rule.margin) for iv in measured.values()):
        decision, k = "no_gain", None
    else:
        decision, k = "undecided", best
    shown = measured[k if k is not None else best]
    settled = decision != "undecided" and all(
        settled_interval(iv, rule.margin) for iv in measured.values()
    )
    unsettled_versus = []
    if decision == "yes":
        for o in candidates:
            if o > k:
                v = versus[(o, k)]
                if v["low"] is None or not (
                    v["low"] > 1 + rule.k_margin or v["high"] < 1 + rule.k_margin
                ):
                    unsettled_versus.append(o)
        settled = settled and not unsettled_versus
    out = {
        **base,
        "decision": decision,
        "k": k,
        "speedup": shown["speedup"],
        "low": shown["low"],
        "high": shown["high"],
        "settled": settled,
        "best_k": best,
        "passed_over": passed,
        "versus": {f"k{o}/k{k_}": v for (o, k_), v in versus.items()},
        "not_settled_against": unsettled_versus,
        "rounds": shown["n"],
        "rounds_to_decide": None,
    }
    if not settled:
        if shown.get("low") is None:
            out["why"] = "one pass per server: no spread to judge by"
        else:
            out["rounds_to_decide"] = _rounds_to_settle(
                measured, versus, k, unsettled_versus, rule, drift_log
            )
    return out


def _rounds_to_settle(measured, versus, k, unsettled_versus, rule, drift_log) -> int | None:
    """The rounds at which, at the observed means and spreads, every unsettled interval of the load
    would settle (the largest of them); None where one never would (a mean on its line)."""
    need = []
    for o, iv in measured.items():
        if not settled_interval(iv, rule.margin):
            drift = drift_log.get(o, 0.0)
            away = rounds_to_decide(iv, rule.level, 0.0, drift)  # the interval leaves 1
            # or it closes inside the margin: its half-width under log(1 + margin) - |mean|
            room = math.log(1 + rule.margin) - abs(iv["mean_log"])
            within = (
                rounds_to_decide({**iv, "mean_log": room}, rule.level, 0.0, drift)
                if room > 0
                else None
            )
            need.append(min((n for n in (away, within) if n is not None), default=None))
    for o in unsettled_versus:
        need.append(rounds_to_decide(versus[(o, k)], rule.level, math.log(1 + rule.k_margin)))
    if not need or any(n is None for n in need):
        return None
    return max(need)
