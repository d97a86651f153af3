"""The benchmark's decision: at each load the best k and its speedup, the break-even load, the
verdict at the user's load (benchmark.serve_concurrency) and, when the draft does not pay off
there, what would: the acceptance length each speedup goal needs and the training samples the
acceptance-vs-samples forecast says that takes.

Cost model. Over a run of requests at load c, the baseline emits one token per target step per
request, the speculative server tau(c, k) tokens per verification step (its acceptance length).
So speedup = tau / r, where r(c, k) = tau(c, k) * baseline tokens/s / speculative tokens/s is the
cost of one speculative step (the target verifying k + 1 tokens, plus k draft steps) relative to
one plain decoding step at that load. r is measured at every (c, k) of the sweep and fitted as
    r(c, k) = a + b k + (d + e k) log2 c
(terms dropped where the sweep has one k or one load). A speedup goal g at (c, k) then needs
tau >= g r(c, k); a chain of k draft tokens emits at most k + 1 tokens per step, so where
g r(c, k) > k + 1 for every k, no draft pays off at that load (the verify cost alone is too high).
The fit's error is reported on each sweep point left out of it (the speedup it predicts there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from draftline.benchmark import intervals
from draftline.benchmark.sweep import Level
from draftline.tools.forecast import build_report


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


# ---- cost model -------------------------------------------------------------------------------


def step_costs(levels: dict[int, Level]) -> list[dict]:
    """Every sweep point: {c, k, tau, speedup, r} with r the relative step cost (module docstring)."""
    points = []
    for c, level in sorted(levels.items()):
        base = level.baseline["output_tokens_per_s"]
        for k, spec in sorted(level.speculative.items()):
            tau, tps = spec.get("acceptance_length"), spec["output_tokens_per_s"]
            if not (base and tps and tau):
                continue
            points.append(
                {"c": c, "k": k, "tau": tau, "speedup": tps / base, "r": tau * base / tps}
            )
    return points


def _features(c, k, terms: list[str]) -> np.ndarray:
    x = np.log2(np.asarray(c, dtype=float))
    k = np.asarray(k, dtype=float)
    columns = {"1": np.ones_like(x), "k": k, "log2c": x, "k*log2c": k * x}
    return np.stack([columns[t] for t in terms], axis=-1)


def model_terms(points: list[dict]) -> list[str]:
    """The terms a sweep can fit with one point left out: a k slope needs two k values, a load
    slope two loads, their product both and five points."""
    ks, loads = {p["k"] for p in points}, {p["c"] for p in points}
    terms = ["1"]
    if len(ks) > 1:
        terms.append("k")
    if len(loads) > 1:
        terms.append("log2c")
    if len(ks) > 1 and len(loads) > 1 and len(points) >= 6:
        terms.append("k*log2c")
    while len(terms) > 1 and len(points) < len(terms) + 1:
        terms.pop()
    return terms


def fit(points: list[dict], terms: list[str]) -> np.ndarray:
    X = _features([p["c"] for p in points], [p["k"] for p in points], terms)
    coef, *_ = np.linalg.lstsq(X, np.array([p["r"] for p in points]), rcond=None)
    return coef


def predict_r(coef: np.ndarray, terms: list[str], c: float, k: float) -> float:
    return float(_features([c], [k], terms)[0] @ coef)


@dataclass(frozen=True)
class CostModel:
    """The fitted relative step cost r(c, k) (module docstring): its terms and coefficients, and
    what the verdict reports of it (`report`: the form, each point's fit, the error on each point
    left out)."""

    terms: list[str]
    coef: np.ndarray
    report: dict

    def r(self, c: float, k: float) -> float:
        return predict_r(self.coef, self.terms, c, k)


def cost_model(points: list[dict]) -> CostModel | None:
    """The fitted relative step cost and its error on each sweep point left out of the fit
    (predicted speedup tau / r against the measured one); None without two points."""
    if len(points) < 2:
        return None
    terms = model_terms(points)
    coef = fit(points, terms)
    held_out = []
    if len(points) > len(terms):
        for i, p in enumerate(points):
            rest = points[:i] + points[i + 1 :]
            r = predict_r(fit(rest, terms), terms, p["c"], p["k"])
            # a fit that predicts no cost at all there cannot give a speedup: counted apart
            predicted = p["tau"] / r if r > 0 else None
            held_out.append(
                {
                    "c": p["c"],
                    "k": p["k"],
                    "measured_speedup": round(p["speedup"], 4),
                    "predicted_speedup": None if predicted is None else round(predicted, 4),
                    "relative_error": None
                    if predicted is None
                    else round(predicted / p["speedup"] - 1, 4),
                }
            )
    errors = [abs(h["relative_error"]) for h in held_out if h["relative_error"] is not None]
    return CostModel(
        terms,
        coef,
        {
            "form": " + ".join(
                f"{c:.4g}*{t}" if t != "1" else f"{c:.4g}" for c, t in zip(coef, terms)
            ),
            "terms": terms,
            "coefficients": [round(float(c), 6) for c in coef],
            "points": [
                {
                    "c": p["c"],
                    "k": p["k"],
                    "r": round(p["r"], 4),
                    "fitted_r": round(predict_r(coef, terms, p["c"], p["k"]), 4),
                }
                for p in points
            ],
            "held_out": held_out,
            "held_out_mean_abs_error": round(float(np.mean(errors)), 4) if errors else None,
            "held_out_max_abs_error": round(float(np.max(errors)), 4) if errors else None,
            # points where the fit without them predicts a step cost <= 0 (too few points for its terms)
            "held_out_unpredicted": sum(h["relative_error"] is None for h in held_out),
        },
    )


def model_break_even(model: CostModel, levels: dict[int, Level], top: int = 4096) -> dict:
    """The load where the cost model's best speedup over the measured ks (each k at its acceptance
    averaged over the loads) falls below 1, searched up to `top` requests in flight in steps of
    2^0.1; `extrapolated` when past the largest load measured. None where it stays above 1."""
    taus: dict[int, list[float]] = {}
    for level in levels.values():
        for k, spec in level.speculative.items():
            if spec.get("acceptance_length"):
                taus.setdefault(k, []).append(spec["acceptance_length"])
    tau = {k: sum(v) / len(v) for k, v in taus.items()}
    x = 0.0
    while 2**x <= top and tau:
        c = 2**x
        best = max((t / r if (r := model.r(c, k)) > 0 else math.inf) for k, t in tau.items())
        if best < 1:
            return {"concurrency": round(c, 1), "extrapolated": c > max(levels)}
        x += 0.1
    return {"concurrency": None, "extrapolated": False}


def needs(model: CostModel, c: int, ks: list[int], goals: list[float]) -> dict:
    """{goal: {k: acceptance length needed at load c, or None where k + 1 tokens a step cannot
    reach it}}."""
    out = {}
    for goal in goals:
        row = {}
        for k in ks:
            tau = goal * model.r(c, k)
            row[k] = round(tau, 3) if tau <= k + 1 else None
        out[goal] = row
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


def interval_words(d: dict) -> str:
    """A decision's speedup with its interval ("<speedup>x [<low>-<high>]"), or the point and why
    it has no interval."""
    if d["speedup"] is None:
        return "no speedup measured"
    if d["low"] is None:
        return f"{d['speedup']:.2f}x (one pass: no interval)"
    return f"{d['speedup']:.2f}x [{d['low']:.2f}-{d['high']:.2f}]"


def load_words(c: int, d: dict) -> str:
    """The decision at one load in a sentence."""
    at = f"at {c} request{'s' if c != 1 else ''} in flight"
    others = ", ".join(f"k={o}" for o in d.get("indistinguishable", []))
    tied = f"; {others} not told apart from it" if others else ""
    if d["decision"] == "yes":
        return f"{at} it pays off: k={d['k']} gives {interval_words(d)}{tied}"
    if d["decision"] == "no":
        return f"{at} it does not pay off: even k={d['best_k']} gives {interval_words(d)}"
    if d["low"] is None:
        return (
            f"{at} it cannot be told: k={d['k']} gives {d['speedup']:.2f}x from one pass per "
            "server, no spread to judge by"
        )
    more = (
        f"; about {d['rounds_to_decide']} rounds of passes at this spread would decide it"
        if d.get("rounds_to_decide")
        else "; more passes at this spread would not decide it"
    )
    return (
        f"{at} it cannot be told: k={d['k']} gives {interval_words(d)}, which holds 1{tied}{more}"
    )


def verdict_words(v: dict) -> str:
    """The verdict in a few sentences, as the console prints it."""
    c = v["serve_concurrency"]
    decided = v["decisions"]
    conf = f"{v['confidence']:.0%}"
    layout = (v.get("design") or {}).get("layout")
    text = (
        f"{v['engine']}{f' ({layout})' if layout else ''}, intervals at {conf} shared by the ks "
        f"compared: {load_words(c, decided[str(c)])}."
    )
    rest = [load_words(int(other), d) for other, d in decided.items() if int(other) != c]
    if rest:
        text += " " + "; ".join(rest)[0].upper() + "; ".join(rest)[1:] + "."
    be = v["break_even"]
    if be["break_even_concurrency"]:
        text += (
            f" Break-even near {be['break_even_concurrency']:g} requests in flight: serve without "
            f"speculation above it."
        )
    if (beyond := be.get("model_estimate")) and beyond.get("concurrency"):
        text += (
            f" The cost model puts break-even near {beyond['concurrency']:g} requests in flight"
            + (" (extrapolated past the loads measured)." if beyond["extrapolated"] else ".")
        )
    if be["undecided_at"]:
        text += (
            f" Deployed with k={v['undecided_k']} where undecided ({be['undecided_at']} requests "
            "in flight)."
        )
    for goal, need in v.get("needs", {}).items():
        if need.get("met"):
            continue
        if need.get("acceptance_length") is None:
            text += (
                f" No draft reaches {goal}x at this load with k <= {need['max_k']}: verifying "
                "costs more than k + 1 tokens a step can repay."
            )
        else:
            text += (
                f" {goal}x needs an acceptance length of {need['acceptance_length']} at "
                f"k={need['k']} (measured {need['measured_acceptance_length']})"
            )
            forecast = need.get("forecast")
            if forecast and forecast.get("samples"):
                at = (
                    f"; {forecast['acceptance_length']} at k={forecast['k']}, where the forecast's "
                    "points were measured"
                    if forecast["k"] != need["k"]
                    else ""
                )
                text += (
                    f"{at}, which the samples forecast puts at about {forecast['samples']:,} "
                    f"training samples ({forecast['trust']})."
                )
            elif forecast and forecast.get("why_not"):
                text += f"; samples: {forecast['why_not']}."
            else:
                text += "."
    if v.get("engine_bound"):
        text += " " + v["engine_bound"]
    return text


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
        "design": design
        or ({"layout": "one request at a time, modes interleaved"} if engine == "hf" else None),
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
