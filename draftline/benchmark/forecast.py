"""Acceptance length vs training samples: the curves fitted to the runs made so far and the samples
a requested acceptance length needs, with the fit's uncertainty. The verdict forecasts from it
(draftline/benchmark/verdict.py), and so does `draftline forecast` (draftline/tools/forecast.py,
its report and command line).

The measure (the report's `measure`): every point is the evaluate stage's acceptance length on the
held-out eval split (`acceptance_length`, as evaluate.engine measured it) at the stage's k
(evaluate.k): the row of each run's `reports/evaluate/acceptance_vs_samples.json` (what `dvc plots`
draws), given as files, or reports/acceptance.json's `acceptance_length` and `k` against
params.yaml's `samples`, collected from `dvc exp show --json` with --dvc-exps. An acceptance length
at another k is another measure: points whose `k` differs from the first point's are refused, and
so is a --k other than the points' own. Points at the same `samples` are kept (repeats tell the
noise).

Two curves, least squares:
- log-linear: tau = a + b ln(n). Two parameters, so it is defined from two points; it grows
  without bound, so near the ceiling k + 1 it is optimistic (forecasts too few samples).
- saturating: tau = tau_max - c n^(-alpha), tau_max <= k + 1 (alpha on a grid, tau_max and c
  linear for each alpha); needs at least 4 points, and is the one to prefer when it fits better.

Too few points: the curves are fitted from two distinct `samples` values on, but a forecast
number is given only from MIN_POINTS distinct `samples` values on; with fewer, each forecast has
samples None and a `why_not` that says how many there are and what to run.

Uncertainty: residual standard error and the parameter covariance of the linear fit, with the
residual degrees of freedom (points - parameters; alpha counts as one). The 10th-90th percentile of
the forecast samples comes from 4,000 draws of the parameters from the multivariate Student t with
those degrees of freedom (normal draws with the fit's covariance, each divided by
sqrt(chi2(dof) / dof)), not from a normal: with few residual degrees of freedom the interval is as
wide as the data allow. With as many points as parameters there is no residual, hence no interval:
the report says so.
How far it is trusted (`trust`, and `extrapolation_factor`: the forecast samples over the largest
measured run's): inside the measured samples range it is an interpolation; up to TRUST_FACTOR
times the largest measured run it is an extrapolation, indicative within its interval; past that
the trust says how far it is extrapolated ("extrapolated N.Nx past the largest run (M samples)"):
the number says which order of magnitude to budget for, not a plan.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

ALPHAS = np.round(np.arange(0.05, 2.001, 0.01), 3)
TRUST_FACTOR = 2.0  # extrapolation beyond this times the largest measured samples is not trusted
MIN_POINTS = 4  # distinct `samples` values a forecast number needs (the curves fit from 2)
DRAWS = 4000  # parameter draws for the 10-90 interval
DEFAULT_K = 3  # evaluate.k's default: the k of points that carry none, without --k
MEASURE = (
    "acceptance_length: the evaluate stage's held-out acceptance length at its k "
    "(reports/evaluate/acceptance_vs_samples.json, reports/acceptance.json)"
)


def read_points(paths: list[str]) -> list[dict]:
    points = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        for row in data if isinstance(data, list) else [data]:
            if not isinstance(row, dict) or "samples" not in row or "acceptance_length" not in row:
                raise ValueError(
                    f"{path}: each point needs `samples` and `acceptance_length`, got {row!r}"
                )
            point = {
                "samples": int(row["samples"]),
                "acceptance_length": float(row["acceptance_length"]),
                "source": str(path),
            }
            if row.get("k") is not None:
                point["k"] = int(row["k"])  # the k the acceptance was measured at
            points.append(point)
    return points


def _linear_fit(X: np.ndarray, y: np.ndarray) -> dict:
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ beta
    dof = len(y) - X.shape[1]
    sse = float(resid @ resid)
    cov = None
    if dof > 0:
        sigma2 = sse / dof
        cov = sigma2 * np.linalg.pinv(X.T @ X)
    return {"beta": beta, "sse": sse, "dof": dof, "cov": cov, "rmse": math.sqrt(sse / len(y))}


def fit_log_linear(n: np.ndarray, tau: np.ndarray) -> dict:
    fit = _linear_fit(np.column_stack([np.ones_like(n), np.log(n)]), tau)
    a, b = fit["beta"]
    return {**fit, "form": "tau = a + b ln(n)", "params": {"a": float(a), "b": float(b)}}


def fit_saturating(n: np.ndarray, tau: np.ndarray, ceiling: float) -> dict | None:
    if len(n) < 4:
        return None
    best = None
    for alpha in ALPHAS:
        X = np.column_stack([np.ones_like(n), -(n**-alpha)])
        fit = _linear_fit(X, tau)
        tau_max, c = fit["beta"]
        if tau_max > ceiling or c <= 0:
            continue
        if best is None or fit["sse"] < best["sse"]:
            best = {**fit, "alpha": float(alpha)}
    if best is None:
        return None
    tau_max, c = best["beta"]
    best["dof"] = len(n) - 3  # alpha was fitted too
    if best["dof"] <= 0:
        best["cov"] = None
    else:
        best["cov"] = best["cov"] * (len(n) - 2) / best["dof"]
    return {
        **best,
        "form": "tau = tau_max - c n^(-alpha)",
        "params": {"tau_max": float(tau_max), "c": float(c), "alpha": best["alpha"]},
    }


LOG_FLOAT_MAX = math.log(sys.float_info.max)


def solve(fit: dict, target: float, beta=None) -> float:
    """Samples at which the curve reaches `target` (inf when it never does)."""
    if fit["form"].startswith("tau = a"):
        a, b = fit["beta"] if beta is None else beta
        if b <= 0:
            return math.inf
        log_n = (target - a) / b  # a draw with a slope near 0 puts the target past any float
        return math.exp(log_n) if log_n < LOG_FLOAT_MAX else math.inf
    tau_max, c = fit["beta"] if beta is None else beta
    if c <= 0 or target >= tau_max:
        return math.inf
    return ((tau_max - target) / c) ** (-1.0 / fit["alpha"])


def t_draws(beta: np.ndarray, cov: np.ndarray, dof: int, draws: int, seed: int) -> np.ndarray:
    """Parameter draws from the multivariate Student t centred on beta with scale matrix cov and
    dof degrees of freedom: normal draws divided by sqrt(chi2(dof) / dof)."""
    rng = np.random.default_rng(seed)
    z = rng.multivariate_normal(np.zeros(len(beta)), cov, size=draws, method="svd")
    w = rng.chisquare(dof, size=draws) / dof
    return np.asarray(beta) + z / np.sqrt(w)[:, None]


def forecast(fit: dict, target: float, draws: int = DRAWS, seed: int = 0) -> dict:
    """The samples the curve reaches target at, and the 10-90 percentile of that over draws of the
    parameters from the multivariate t with the fit's residual degrees of freedom."""
    point = solve(fit, target)
    out = {"samples": _round(point), "interval_10_90": None}
    if fit["cov"] is not None and fit["dof"] > 0:
        betas = t_draws(fit["beta"], fit["cov"], fit["dof"], draws, seed)
        values = np.array([solve(fit, target, b) for b in betas])
        lo, hi = np.quantile(
            values, [0.1, 0.9], method="inverted_cdf"
        )  # inf where a draw never gets there
        out["interval_10_90"] = [_round(lo), _round(hi)]
    return out


def _round(x: float):
    return None if not math.isfinite(x) else int(round(x))


def extrapolation_factor(samples_needed, max_measured: int) -> float | None:
    """The forecast samples over the largest measured run's (None where the curve never gets there)."""
    return None if samples_needed is None else round(samples_needed / max_measured, 2)


def trust(samples_needed, max_measured: int, min_measured: int) -> str:
    if samples_needed is None:
        return "not reached by this curve"
    if samples_needed <= max_measured:
        return (
            "interpolation (inside the measured range)"
            if samples_needed >= min_measured
            else "below the smallest run measured"
        )
    if samples_needed <= TRUST_FACTOR * max_measured:
        return (
            f"extrapolation up to {TRUST_FACTOR:g}x the largest run ({max_measured:,} samples): "
            "indicative, within its interval"
        )
    return (
        f"extrapolated {samples_needed / max_measured:.1f}x past the largest run "
        f"({max_measured:,} samples): an order of magnitude to budget for, not a plan"
    )


def measured_k(points: list[dict], k: int | None) -> int:
    """The one k the points' acceptance was measured at: refused when their `k`s differ (each k's
    acceptance length is another measure) or differ from k; k, else DEFAULT_K, where none says."""
    carrying = [p for p in points if p.get("k") is not None]
    if carrying:
        first = carrying[0]
        for p in carrying[1:]:
            if int(p["k"]) != int(first["k"]):
                raise ValueError(
                    f"points measured at different k: {p.get('source', '?')} (samples "
                    f"{p['samples']}) at k={p['k']}, {first.get('source', '?')} at k={first['k']}; "
                    "acceptance lengths at different k are different measures: forecast one k's points"
                )
        if k is not None and int(k) != int(first["k"]):
            raise ValueError(
                f"the points were measured at k={first['k']}, the forecast was asked at k={k}: "
                "forecast at the points' k"
            )
        return int(first["k"])
    return DEFAULT_K if k is None else int(k)


def too_few_points(distinct: int) -> str | None:
    """Why there is no forecast number with `distinct` distinct `samples` values (None: there is)."""
    if distinct >= MIN_POINTS:
        return None
    return (
        f"{distinct} point{'s' if distinct != 1 else ''} at distinct sample counts: a forecast needs "
        f"at least {MIN_POINTS}; run `dvc exp run -S samples=N` at more sizes"
    )


def build_report(points: list[dict], targets: list[float], k: int | None = None) -> dict:
    k = measured_k(points, k)
    distinct = len({p["samples"] for p in points})
    if distinct < 2:
        raise ValueError(
            f"need runs at two or more distinct `samples` values to fit a curve, got "
            f"{sorted({p['samples'] for p in points})}; a forecast needs at least {MIN_POINTS}: run "
            "`dvc exp run -S samples=N` at more sizes"
        )
    why_not = too_few_points(distinct)
    n = np.array([p["samples"] for p in points], dtype=float)
    tau = np.array([p["acceptance_length"] for p in points], dtype=float)
    fits = {"log_linear": fit_log_linear(n, tau), "saturating": fit_saturating(n, tau, k + 1.0)}
    report = {
        "measure": MEASURE,
        "k": k,
        "points": sorted(points, key=lambda p: p["samples"]),
        "distinct_samples": distinct,
        "measured_samples": [int(n.min()), int(n.max())],
        "why_not": why_not,
        "fits": {},
        "forecasts": {},
    }
    for name, fit in fits.items():
        if fit is None:
            report["fits"][name] = None
            continue
        report["fits"][name] = {
            "form": fit["form"],
            "params": fit["params"],
            "rmse": round(fit["rmse"], 4),
            "residual_dof": fit["dof"],
        }
        for target in targets:
            if why_not:
                f = {
                    "samples": None,
                    "interval_10_90": None,
                    "extrapolation_factor": None,
                    "trust": None,
                    "why_not": why_not,
                }
            else:
                f = forecast(fit, target)
                f["extrapolation_factor"] = extrapolation_factor(f["samples"], int(n.max()))
                f["trust"] = trust(f["samples"], int(n.max()), int(n.min()))
            report["forecasts"].setdefault(str(target), {})[name] = f
    usable = {k_: v for k_, v in fits.items() if v is not None}
    report["preferred"] = (
        "saturating"
        if "saturating" in usable and usable["saturating"]["rmse"] <= usable["log_linear"]["rmse"]
        else "log_linear"
    )
    return report
