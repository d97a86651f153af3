"""The benchmark's decision: at each load the best k and its speedup, the break-even load, the
verdict at the user's load (benchmark.serve_concurrency) and, when the draft does not pay off
there, what would: the acceptance length each speedup goal needs and the training samples the
acceptance-vs-samples forecast says that takes. The step costs it reasons with are
draftline/benchmark/costs.py's, the forecast draftline/benchmark/forecast.py's, and its sentences
draftline/benchmark/verdict_words.py's.
"""

from __future__ import annotations

import math

from draftline.benchmark import intervals
from draftline.benchmark.costs import CostModel, cost_model, model_break_even, needs, step_costs
from draftline.benchmark.forecast import build_report
from draftline.benchmark.sweep import Level
from draftline.benchmark.verdict_words import verdict_words


def paired(spec: dict, base: dict) -> list[float]:
    """A speculative level's paired ratios; a level measured without pairs (one summary each) gives
    its one ratio."""
    if spec.get("paired_speedups"):
        return spec["paired_speedups"]
    b = base["output_tokens_per_s"]
    return [spec["output_tokens_per_s"] / b] if b else []


def speedups(levels: dict[int, Level]) -> dict[int, dict[int, float | None]]:
    """{c: {k: speedup}}: the geometric mean of the paired ratios (draftline/benchmark/intervals.py)."""
    out = {}
    for c, level in levels.items():
        out[c] = {}
        for k, spec in level.speculative.items():
            ratios = [r for r in paired(spec, level.baseline) if r > 0]
            out[c][k] = (
                round(math.exp(sum(math.log(r) for r in ratios) / len(ratios)), 4)
                if ratios
                else None
            )
    return out


def decisions(levels: dict[int, Level], confidence: float) -> dict[int, dict]:
    """{c: the decision at load c} (intervals.decide_load) over the ks of levels[c]."""
    out = {}
    for c, level in levels.items():
        by_k = level.speculative
        out[c] = intervals.decide_load(
            {k: paired(spec, level.baseline) for k, spec in sorted(by_k.items())},
            confidence,
            {k: spec["drift_log"] for k, spec in by_k.items() if spec.get("drift_log")},
        )
    return out


def break_even(decided: dict) -> dict:
    """Where the draft stops paying as the load grows: the loads decided yes, no and undecided,
    the last load that pays and the first that does not, and the load between them where the line
    between their speedups (in log2 load) crosses 1."""
    loads = sorted(decided)
    paying = [c for c in loads if decided[c]["decision"] == "yes"]
    losing = [c for c in loads if decided[c]["decision"] == "no"]
    out = {
        "pays_at": paying,
        "loses_at": losing,
        "undecided_at": [c for c in loads if decided[c]["decision"] == "undecided"],
        "last_paying_concurrency": max(paying) if paying else None,
        "first_losing_concurrency": min(losing) if losing else None,
        "break_even_concurrency": None,
    }
    if paying and losing and max(paying) < min(losing):
        lo, hi = max(paying), min(losing)
        s_lo, s_hi = decided[lo]["speedup"], decided[hi]["speedup"]
        if s_lo and s_hi and s_lo >= 1 > s_hi:
            x_lo, x_hi = math.log2(lo), math.log2(hi)
            x = x_lo + (s_lo - 1) / (s_lo - s_hi) * (x_hi - x_lo)
            out["break_even_concurrency"] = round(2**x, 1)
    return out


# ---- the forecast of samples ------------------------------------------------------------------


def samples_for(points: list[dict], tau: float, k: int) -> dict:
    """The training samples the acceptance-vs-samples forecast (draftline forecast) gives for an
    acceptance length tau at k, how far past the largest run that is, and how far it is trusted;
    or, with samples None, why it gives no number (`why_not`: too few runs, the points' k
    disagreeing, a curve that never reaches tau)."""
    try:
        report = build_report(points, [tau], k)
    except ValueError as err:  # its message says what to run or fix
        return {"samples": None, "why_not": str(err)}
    preferred = report["preferred"]
    f = report["forecasts"][str(tau)][preferred]
    out = {
        "samples": f.get("samples"),
        "interval_10_90": f.get("interval_10_90"),
        "extrapolation_factor": f.get("extrapolation_factor"),
        "trust": f.get("trust"),
        "fit": preferred,
        "measured_samples": report["measured_samples"],
    }
    if out["samples"] is None:
        out["why_not"] = f.get("why_not") or (
            f"the {preferred.replace('_', '-')} curve fitted to the runs never reaches {tau}"
        )
    return out


# ---- the decision -----------------------------------------------------------------------------


def k_schedule(decided: dict, undecided_k: int = 0) -> list[list[int]]:
    """vLLM's num_speculative_tokens_per_batch_size from the decisions at the measured loads: the
    rule's k where the decision is yes, 0 where it is no, benchmark.undecided_k where undecided;
    each load's range reaches half-way (in log2) to the next; the last ends at the largest load
    measured (vLLM carries it on past that)."""
    loads = sorted(decided)
    schedule = []
    for i, c in enumerate(loads):
        lo = 1 if i == 0 else schedule[-1][1] + 1
        hi = c if i == len(loads) - 1 else max(lo, math.floor(math.sqrt(c * loads[i + 1])))
        d = decided[c]
        k = d["k"] if d["decision"] == "yes" else undecided_k if d["decision"] == "undecided" else 0
        if schedule and schedule[-1][2] == k:
            schedule[-1][1] = hi
        else:
            schedule.append([lo, hi, k])
    return schedule


def decide(
    levels: dict[int, Level], cfg, engine: str, forecast_points: list[dict], design=None, bound=None
) -> dict:
    """The verdict (_decide) with its words; `bound`: run.engine_bound's note on the target."""
    v = _decide(levels, cfg, engine, forecast_points, design)
    if bound:
        v["engine_bound"] = bound["words"]
        v["baseline_step_growth"] = bound["baseline_step_growth"]
    v["words"] = verdict_words(v)
    return v


def _decide(
    levels: dict[int, Level], cfg, engine: str, forecast_points: list[dict], design: dict | None
) -> dict:
    """The verdict at benchmark.serve_concurrency (engine hf: 1 request in flight) from the
    sweep's levels."""
    decided = decisions(levels, cfg.confidence)
    serve = cfg.serve_concurrency if cfg.serve_concurrency in decided else min(decided)
    chosen = decided[serve]
    k_shown = chosen["k"] if chosen["k"] is not None else chosen["best_k"]
    measured = levels[serve].speculative[k_shown]
    v = {
        "engine": engine,
        "design": design,
        "serve_concurrency": serve,
        "decision": chosen["decision"],
        "k": chosen["k"],
        "speedup": chosen["speedup"],
        "speedup_low": chosen["low"],
        "speedup_high": chosen["high"],
        "confidence": cfg.confidence,
        "method": intervals.METHOD,
        "k_rule": "the smallest k whose interval overlaps the best k's (one lying above 1 when one "
        "does); the interval Bonferroni-adjusted for the ks compared",
        "pays_off": {"yes": True, "no": False}.get(chosen["decision"]),
        "undecided_k": cfg.undecided_k,
        "baseline_tokens_per_s": levels[serve].baseline["output_tokens_per_s"],
        "speculative_tokens_per_s": measured["output_tokens_per_s"],
        "acceptance_length": measured.get("acceptance_length"),
        "decisions": {str(c): d for c, d in sorted(decided.items())},
        "break_even": break_even(decided),
        "k_per_batch_size": k_schedule(decided, cfg.undecided_k),
    }
    if any(level.compare for level in levels.values()):
        v["compare"] = compare_decisions(levels, cfg.confidence)
    if serve != cfg.serve_concurrency:
        v["note"] = (
            f"engine {engine} decodes one request at a time: the verdict is for 1 request in "
            f"flight, not serve_concurrency {cfg.serve_concurrency}"
        )
    model = cost_model(step_costs(levels))
    if model is None:
        v["cost_model"] = None
        return v
    v["cost_model"] = model.report
    v["break_even"]["model_estimate"] = model_break_even(model, levels)
    ks = sorted(levels[serve].speculative)
    per_goal = needs(model, serve, ks, cfg.speedup_goals)
    v["needs"] = {}
    for goal, by_k in per_goal.items():
        feasible = {k: tau for k, tau in by_k.items() if tau is not None}
        entry = {
            "by_k": {str(k): tau for k, tau in by_k.items()},
            "max_k": max(ks),
            # met where the interval at the serve load lies above the goal
            "met": chosen["low"] is not None and chosen["low"] >= goal,
        }
        if feasible:
            # the k of the verdict when it can reach the goal, else the k needing least over k + 1
            k = (
                k_shown
                if k_shown in feasible
                else min(feasible, key=lambda k: feasible[k] / (k + 1))
            )
            entry.update(
                k=k,
                acceptance_length=feasible[k],
                measured_acceptance_length=levels[serve].speculative[k].get("acceptance_length"),
            )
            if feasible[k] > (entry["measured_acceptance_length"] or 0):
                entry["forecast"] = forecast_need(model, serve, goal, forecast_points, k)
        else:
            entry["acceptance_length"] = None
        v["needs"][str(goal)] = entry
    return v


def compare_decisions(levels: dict[int, Level], confidence: float) -> dict:
    """{name: {c: decision}} of each benchmark.compare draft against the same baseline passes."""
    names = sorted({n for level in levels.values() for n in level.compare})
    out = {}
    for name in names:
        sub = {
            c: Level(level.baseline, level.compare[name])
            for c, level in levels.items()
            if name in level.compare
        }
        out[name] = {str(c): d for c, d in sorted(decisions(sub, confidence).items())}
    return out


def forecast_need(model: CostModel, c: int, goal: float, points: list[dict], k: int) -> dict:
    """The samples a goal needs at load c, by the forecast over points: at the k the points were
    measured at (their `k`; else k), the acceptance the goal needs there."""
    if not points:
        return {
            "samples": None,
            "why_not": "no acceptance-vs-samples points were given",
        }
    at_k = int(points[0].get("k") or k)
    tau = round(goal * model.r(c, at_k), 3)
    if tau > at_k + 1:
        return {
            "k": at_k,
            "acceptance_length": tau,
            "samples": None,
            "why_not": f"beyond k + 1 at k={at_k}",
        }
    return {"k": at_k, "acceptance_length": tau, **samples_for(points, tau, at_k)}
