"""Speedup intervals and the three-way decision at one load, from paired passes.

A pass of a speculative server is paired with a pass of the baseline run beside it in time (the
same round of the interleaved sweep; in the sequential design, the baseline interpolated to the
pass's time). Each pair gives a ratio of output tokens/s; the speedup is the geometric mean of the
ratios and its interval the Student-t interval of their logarithms (n - 1 degrees of freedom),
exponentiated. In the sequential design the baseline may drift between its passes before and after
the speculative servers: half the log of that drift widens the interval (`drift_log`).

Choosing k among m values is accounted for by Bonferroni: each k's interval is at confidence
1 - (1 - confidence) / m, so that all m hold together at `confidence` and the chosen one with them.

The rule for k, fixed before any pass runs: take the k with the highest speedup (the best) and
the ks whose intervals overlap the best one's (the sweep cannot tell them apart); among them, the
smallest k whose interval lies above 1 when one does (fewer wasted draft tokens under load), else
the smallest of them. The decision at the load is `yes` when that k's interval lies above 1, `no`
when every k's interval lies below 1, otherwise `undecided`, with the rounds of passes the observed
spread suggests would decide it.
"""

from __future__ import annotations

import math

from draftline.core.stats import t_quantile

METHOD = (
    "paired passes (each speculative pass over the baseline pass beside it): geometric mean of the "
    "ratios, Student-t interval of their logs, Bonferroni over the ks compared"
)
MAX_ROUNDS = 10_000  # passes_to_decide searches no further


def interval(ratios: list[float], confidence: float, family: int = 1, drift_log: float = 0.0):
    """{speedup, low, high, n, mean_log, sd_log, half_width_log} of paired ratios at `confidence`
    shared by `family` intervals; low/high None with fewer than two pairs (no spread to judge by)."""
    logs = [math.log(r) for r in ratios if r and r > 0]
    n = len(logs)
    if not n:
        return {"speedup": None, "low": None, "high": None, "n": 0}
    mean = sum(logs) / n
    out = {"speedup": round(math.exp(mean), 4), "n": n, "mean_log": round(mean, 6)}
    if n < 2:
        return {**out, "low": None, "high": None, "sd_log": None, "half_width_log": None}
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    level = 1 - (1 - confidence) / family
    half = t_quantile(1 - (1 - level) / 2, n - 1) * sd / math.sqrt(n) + abs(drift_log) / 2
    return {
        **out,
        "low": round(math.exp(mean - half), 4),
        "high": round(math.exp(mean + half), 4),
        "sd_log": round(sd, 6),
        "half_width_log": round(half, 6),
    }


def rounds_to_decide(
    iv: dict, confidence: float, family: int, drift_log: float = 0.0
) -> int | None:
    """The pairs at which an interval with this mean and spread would no longer hold 1; None when
    the mean is 1 itself, there is no spread to judge by, or the drift alone covers 1."""
    mean, sd = iv.get("mean_log"), iv.get("sd_log")
    if mean is None or sd is None or mean == 0 or abs(drift_log) / 2 >= abs(mean):
        return None
    level = 1 - (1 - confidence) / family
    for n in range(2, MAX_ROUNDS + 1):
        if t_quantile(1 - (1 - level) / 2, n - 1) * sd / math.sqrt(n) + abs(drift_log) / 2 < abs(
            mean
        ):
            return n
    return None


def above(iv: dict) -> bool:
    return iv.get("low") is not None and iv["low"] > 1


def below(iv: dict) -> bool:
    return iv.get("high") is not None and iv["high"] < 1


def overlaps(a: dict, b: dict) -> bool:
    if None in (a.get("low"), b.get("low")):
        return True  # without an interval nothing is told apart
    return a["low"] <= b["high"] and b["low"] <= a["high"]


def decide_load(pairs: dict, confidence: float, drift_log: dict | None = None) -> dict:
    """The decision at one load from {k: [paired ratios]} (drift_log: {k: log drift} of the
    sequential design): {decision, k, speedup, low, high, confidence, indistinguishable, by_k,
    rounds_to_decide}; k None where it decides no."""
    drift_log = drift_log or {}
    family = len(pairs)
    by_k = {k: interval(r, confidence, family, drift_log.get(k, 0.0)) for k, r in pairs.items()}
    measured = {k: iv for k, iv in by_k.items() if iv["speedup"] is not None}
    if not measured:
        return {
            "decision": "undecided",
            "k": None,
            "speedup": None,
            "low": None,
            "high": None,
            "confidence": confidence,
            "indistinguishable": [],
            "by_k": by_k,
            "rounds_to_decide": None,
            "why": "no pass completed",
        }
    best = max(sorted(measured), key=lambda k: measured[k]["speedup"])
    tied = sorted(k for k, iv in measured.items() if overlaps(iv, measured[best]))
    paying = [k for k in tied if above(measured[k])]
    k = paying[0] if paying else tied[0]
    chosen = measured[k]
    if above(chosen):
        decision = "yes"
    elif all(below(iv) for iv in measured.values()):
        decision = "no"
    else:
        decision = "undecided"
    out = {
        "decision": decision,
        "k": None if decision == "no" else k,
        "speedup": chosen["speedup"],
        "low": chosen["low"],
        "high": chosen["high"],
        "confidence": confidence,
        "indistinguishable": [o for o in tied if o != k],
        "best_k": best,
        "by_k": by_k,
        "rounds": chosen["n"],
        "rounds_to_decide": None,
    }
    if decision == "no":  # reported at the best k: even it loses
        out.update(
            speedup=measured[best]["speedup"],
            low=measured[best]["low"],
            high=measured[best]["high"],
        )
    if decision == "undecided":
        if chosen["low"] is None:
            out["why"] = "one pass per server: no spread to judge by"
        else:
            out["rounds_to_decide"] = rounds_to_decide(
                chosen, confidence, family, drift_log.get(k, 0.0)
            )
    return out
