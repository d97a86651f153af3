"""The benchmark's cost model: what one speculative step costs against a plain one, fitted over
the sweep, and what follows from it (the load where no measured k pays, the acceptance a speedup
goal needs). The verdict (draftline/benchmark/verdict.py) decides with it.

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
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from draftline.benchmark.sweep import Level


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
