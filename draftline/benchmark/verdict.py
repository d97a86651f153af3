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
from draftline.draft.free import free_method


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


def rule_of(cfg, levels: dict[int, Level], looks: int | None = None) -> intervals.Rule:
    """The family every interval of the verdict is held to: the loads of the sweep, the ks at each,
    the looks the design planned (its `looks_planned`; one where it records none)."""
    ks = max((len(level.speculative) for level in levels.values()), default=1)
    planned = looks or 1  # a design that records no looks looked once, at its end
    free = {name for level in levels.values() for name in level.free}
    return intervals.Rule(
        confidence=cfg.confidence,
        k_margin=getattr(cfg, "k_margin", 0.05),
        margin=getattr(cfg, "margin", 0.05),
        loads=len(levels),
        ks=max(ks, 1),
        looks=planned,
        extra=free_statements(len(free), len(levels)),
    )


def free_statements(methods: int, loads: int) -> int:
    """Two intervals per benchmark.free method and load: its speedup and the draft over it."""
    return 2 * methods * loads


def decisions(levels: dict[int, Level], rule: intervals.Rule) -> dict[int, dict]:
    """{c: the decision at load c} (intervals.decide_load) over the ks of levels[c]."""
    out = {}
    for c, level in levels.items():
        by_k = level.speculative
        out[c] = intervals.decide_load(
            {k: paired(spec, level.baseline) for k, spec in sorted(by_k.items())},
            rule,
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
        "no_gain_at": [c for c in loads if decided[c]["decision"] == "no_gain"],
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


DEPLOYED = {"yes": None, "no": 0, "no_gain": "undecided_k", "undecided": "undecided_k"}


def deployed_k(d: dict, undecided_k: int) -> int:
    """The k a load's decision deploys: the rule's k where yes, 0 where no, benchmark.undecided_k
    where there is no gain worth deploying or it is undecided."""
    if d["decision"] == "yes":
        return d["k"]
    return 0 if d["decision"] == "no" else undecided_k


def k_schedule(
    decided: dict, undecided_k: int = 0, max_batch: int | None = None
) -> list[list[int]]:
    """vLLM's num_speculative_tokens_per_batch_size from the decisions at the measured loads
    (deployed_k at each). Batch sizes between two measured loads go to the nearer one in log2 (a
    load's range reaches half-way to the next, geometric mean rounded down); past the largest
    load measured, benchmark.undecided_k up to `max_batch` (vLLM would otherwise carry the last
    range's k to every larger batch: nothing measured says it pays there)."""
    loads = sorted(decided)
    schedule = []
    for i, c in enumerate(loads):
        lo = 1 if i == 0 else schedule[-1][1] + 1
        hi = c if i == len(loads) - 1 else max(lo, math.floor(math.sqrt(c * loads[i + 1])))
        k = deployed_k(decided[c], undecided_k)
        if schedule and schedule[-1][2] == k:
            schedule[-1][1] = hi
        else:
            schedule.append([lo, hi, k])
    if max_batch and loads and max_batch > loads[-1]:
        if schedule[-1][2] == undecided_k:
            schedule[-1][1] = max_batch
        else:
            schedule.append([loads[-1] + 1, max_batch, undecided_k])
    return schedule


def schedule_coverage(decided: dict, undecided_k: int, max_batch: int | None) -> str:
    """What deploy.json's schedule covers, in words."""
    loads = sorted(decided)
    past = (
        f"batch sizes {loads[-1] + 1}-{max_batch} (past the largest load measured) get "
        f"benchmark.undecided_k = {undecided_k} until measured (add the load to "
        "benchmark.concurrency)"
        if max_batch and max_batch > loads[-1]
        else f"vLLM carries the last range's k to every batch size past {loads[-1]}, which was "
        "not measured"
    )
    return (
        f"measured at {', '.join(map(str, loads))} requests in flight; a batch size between two "
        f"measured loads takes the k of the nearer one in log2 (ranges meet at their geometric "
        f"mean); {past}"
    )


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
    rule = rule_of(cfg, levels, (design or {}).get("looks_planned"))
    decided = decisions(levels, rule)
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
        "k_rule": intervals.K_RULE,
        "k_margin": rule.k_margin,
        "margin": rule.margin,
        "family": {
            "loads": rule.loads,
            "ks": rule.ks,
            "statements_per_look": rule.statements,
            "looks_planned": rule.looks,
            "intervals": rule.family,
            "each_interval_level": round(rule.level, 6),
        },
        "pays_off": {"yes": True, "no": False, "no_gain": False}.get(chosen["decision"]),
        "undecided_k": cfg.undecided_k,
        "baseline_tokens_per_s": levels[serve].baseline["output_tokens_per_s"],
        "speculative_tokens_per_s": measured["output_tokens_per_s"],
        "acceptance_length": measured.get("acceptance_length"),
        "decisions": {str(c): d for c, d in sorted(decided.items())},
        "break_even": break_even(decided),
        "k_per_batch_size": k_schedule(decided, cfg.undecided_k, max_batch_of(cfg)),
        "k_per_batch_size_covers": schedule_coverage(decided, cfg.undecided_k, max_batch_of(cfg)),
        "settled": {str(c): d["settled"] for c, d in sorted(decided.items())},
    }
    if any(level.compare for level in levels.values()):
        v["compare"] = compare_decisions(levels, rule)
    v.update(free_comparisons(levels, decided, rule, cfg, serve, design))
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


def compare_decisions(levels: dict[int, Level], rule: intervals.Rule) -> dict:
    """{name: {c: decision}} of each benchmark.compare draft against the same baseline passes."""
    names = sorted({n for level in levels.values() for n in level.compare})
    out = {}
    for name in names:
        sub = {
            c: Level(level.baseline, level.compare[name])
            for c, level in levels.items()
            if name in level.compare
        }
        out[name] = {str(c): d for c, d in sorted(decisions(sub, rule).items())}
    return out


def max_batch_of(cfg) -> int | None:
    """The largest batch the deployed schedule covers: benchmark.max_batch_size (vLLM's
    max_num_seqs of the server deployed), None where not set."""
    return getattr(cfg, "max_batch_size", None)


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


# ---- the draft against speculation that needs no training (benchmark.free) ---------------------

FREE_METHOD = (
    "the draft at the k its decision chose (its best k where it chose none) over the free method's "
    "server, round by round on the ratios to the same baseline passes (intervals.paired_difference); "
    "each interval at 1 - (1 - confidence) / ((statements + added) x looks): the schedule's family "
    "with these comparisons and the free methods' own speedups added"
)


def free_comparisons(
    levels: dict[int, Level],
    decided: dict[int, dict],
    rule: intervals.Rule,
    cfg,
    serve: int,
    design: dict | None = None,
) -> dict:
    """{"free": ...}: at each load, each benchmark.free method's speedup and whether the draft beats
    it (the paired interval of draft over free), and which is better at the serve load ("draft",
    the method's name, or None where the intervals cannot tell); {} without benchmark.free. The
    methods this engine does not serve are named as not measured. `design`'s groups (side by
    side) say whether the two servers shared their baseline passes (`same_group`)."""
    names = sorted({name for level in levels.values() for name in level.free})
    missing = {
        name: f"benchmark.engine {cfg.engine} does not serve it"
        if cfg.engine not in free_method(name).engines
        else "the servers are benchmark.endpoints' (a free server launched here would not share "
        "their host)"
        if getattr(cfg, "endpoints", None)
        else "not in the sweep measured (recorded before benchmark.free named it)"
        for name in sorted(getattr(cfg, "free", {}) or {})
        if name not in names
    }
    if not names:
        if not missing:
            return {}
        words = "; ".join(f"{name} not measured: {why}" for name, why in missing.items())
        return {
            "free": {
                "methods": {},
                "better_at_serve": None,
                "not_measured": missing,
                "words": words,
            }
        }
    # two statements per method and load, in the rule's family (rule_of): its speedup and the
    # draft over it
    added = free_statements(len(names), len(levels))
    level = rule.level
    methods = {}
    for name in names:
        by_load = {}
        for c, lvl in sorted(levels.items()):
            if name not in lvl.free:
                continue
            cmp = _draft_over_free(lvl, decided[c], lvl.free[name], level, name)
            cmp["same_group"] = _same_group(design, cmp["draft_k"], f"{name}:k{cmp['free_k']}")
            by_load[str(c)] = cmp
        free_k = next(lvl.free[name]["k"] for lvl in levels.values() if name in lvl.free)
        methods[name] = {"k": free_k, "by_load": by_load}
    at_serve = {name: m["by_load"].get(str(serve)) for name, m in methods.items()}
    beating = [n for n, cmp in at_serve.items() if cmp and cmp["better"] == n]
    if beating:  # a free method beats the draft: the one that gives most over no speculation
        better = max(beating, key=lambda n: at_serve[n]["free_speedup"] or 0)
    elif at_serve and all(cmp and cmp["better"] == "draft" for cmp in at_serve.values()):
        better = "draft"
    else:
        better = None
    out = {
        "method": FREE_METHOD,
        "level": round(level, 6),
        "statements_added_per_look": added,
        "methods": methods,
        "better_at_serve": better,
    }
    out["words"] = _free_words(serve, better, methods, at_serve)
    if missing:
        out["not_measured"] = missing
    return {"free": out}


def _free_words(c: int, better: str | None, methods: dict, at_serve: dict) -> str:
    """The draft against the free methods at the serve load, in a sentence."""
    at = f"at {c} request{'s' if c != 1 else ''} in flight"
    names = " / ".join(f"{n} (k={m['k']})" for n, m in methods.items())
    if better is None:
        return f"{at} the intervals cannot tell the trained draft from {names}"
    if better == "draft":
        shown = "; ".join(
            f"{cmp['ratio']:.2f}x [{cmp['low']:.2f}-{cmp['high']:.2f}] over {n}"
            for n, cmp in at_serve.items()
        )
        return f"{at} the trained draft beats {names} ({shown}): training was worth it"
    cmp = at_serve[better]
    lo, hi = cmp["free_low"], cmp["free_high"]
    own = f"{cmp['free_speedup']:.2f}x" + (f" [{lo:.2f}-{hi:.2f}]" if lo is not None else "")
    pays = lo is not None and lo > 1
    return (
        f"{at} {better} (k={cmp['free_k']}, no draft) beats the trained draft (the draft gives "
        f"{cmp['ratio']:.2f}x [{cmp['low']:.2f}-{cmp['high']:.2f}] of its speed); {better} gives "
        f"{own} over no speculation" + ("" if pays else ", which does not itself clear 1")
    )


def _same_group(design: dict | None, k: int | None, server: str) -> bool | None:
    """Whether this run's draft at k and `server` ran in the same group beside the baseline (the
    same baseline passes); None where the design has no groups (sequential, or not recorded)."""
    groups = (design or {}).get("groups")
    if not groups or k is None:
        return None
    where = {name: i for i, group in enumerate(groups) for name in group}
    return where.get(f"k{k}") is not None and where.get(f"k{k}") == where.get(server)


def _draft_over_free(lvl: Level, d: dict, free: dict, level: float, name: str) -> dict:
    """One load: the free method's speedup and interval, the draft (the decision's k, else its
    best) over it, and which is better (None: the interval holds 1)."""
    k = d["k"] if d.get("k") is not None else d.get("best_k")
    ratios_free = paired(free, lvl.baseline)
    own = intervals.interval(ratios_free, level, abs(free.get("drift_log") or 0.0))
    out = {
        "free_k": free["k"],
        "free_speedup": own["speedup"],
        "free_low": own["low"],
        "free_high": own["high"],
        "free_acceptance_length": free.get("acceptance_length"),
        "draft_k": k,
        "draft_speedup": d["by_k"][k]["speedup"] if k in d.get("by_k", {}) else None,
    }
    if k is None or k not in lvl.speculative:
        return {**out, "ratio": None, "low": None, "high": None, "better": None}
    spec = lvl.speculative[k]
    drift = max(abs(spec.get("drift_log") or 0.0), abs(free.get("drift_log") or 0.0))
    versus = intervals.paired_difference(paired(spec, lvl.baseline), ratios_free, level, drift)
    better = (
        "draft"
        if versus["low"] is not None and versus["low"] > 1
        else name
        if versus["high"] is not None and versus["high"] < 1
        else None
    )
    return {
        **out,
        "ratio": versus["ratio"],
        "low": versus["low"],
        "high": versus["high"],
        "n": versus["n"],
        "paired": versus["paired"],
        "better": better,
    }
