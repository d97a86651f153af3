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
  linear for each alpha); three parameters, fitted from 4 points.

Which curve the verdict reads (`preferred`, `selection`): the one with the lower AICc, Akaike's
criterion with its small-sample correction, n ln(SSE/n) + 2K + 2K(K+1)/(n-K-1), K the curve's
parameters (2 or 3; the residual variance, common to both, is not counted) and n the points. With
4 or 5 points in-sample rmse always favours the curve with more parameters (a third parameter
absorbs one of four residuals); AICc is the criterion made for so few points, and it charges the
third parameter what it costs: with n <= K + 1 its correction is infinite, so the saturating curve
(K = 3) is preferred only from 5 points on, and only when its fit is much better, not marginally.
Both curves' forecasts are reported side by side: their spread is the range the data leave open.

Uncertainty: every fitted parameter varies in the draws, alpha included. Residual standard error
s, with the residual degrees of freedom (points - K). Each of 4,000 draws is a parametric bootstrap
of the residuals: the fitted curve plus normal noise of standard deviation s sqrt(dof / chi2(dof))
(the noise's own scale drawn from what the dof tell of it, so few residual degrees of freedom widen
the interval as the Student t does), with every parameter refitted (the saturating curve over the
whole alpha grid, under its ceiling k + 1, c > 0). For the line this is exactly the multivariate
Student t centred on the fit with scale s^2 (X'X)^-1 and the residual dof, so its draws are taken
from that directly. The saturating curve is not linear in alpha: a t drawn from its linearized
covariance sends the ceiling up only with c and alpha negative (a curve that falls), which is why
it is refitted instead. The 10th-90th percentile of the forecast samples, and of each parameter
(`draws_10_90`), is over those draws; a draw that does not rise (b <= 0, or no rising curve under
the ceiling fits it) never reaches a target. With as many points as parameters there is no
residual, hence no interval: the report says so.

Not reached (`samples` None where the central fit does not get there): the report says "never
reaches X at 90%" only where the data rule X out at that confidence: fewer than RULED_OUT of the
draws reach it (the whole 10-90% interval is "never") and, for the saturating curve, the F test of
a ceiling at X rejects it at the same level (`ceiling_p`: tau_max held at X, c and alpha refitted,
against the free fit; a curve of ceiling X never reaches X, so a high p means the runs do not rule
out reaching it). Otherwise it says that the central fit does not reach X but the data do not rule
it out, with that p and the share of draws that reach X (`reach_share`).
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
    return {"beta": beta, "sse": sse, "dof": dof, "rmse": math.sqrt(sse / len(y))}


def _covariance(jacobian: np.ndarray, sse: float, dof: int) -> np.ndarray | None:
    """s^2 (J'J)^-1, J (points, parameters) the curve's Jacobian at the fit: the joint covariance of
    every fitted parameter (None without residual degrees of freedom)."""
    if dof <= 0:
        return None
    return sse / dof * np.linalg.pinv(jacobian.T @ jacobian)


def fit_log_linear(n: np.ndarray, tau: np.ndarray) -> dict:
    X = np.column_stack([np.ones_like(n), np.log(n)])  # (points, 2): the Jacobian in a, b
    fit = _linear_fit(X, tau)
    a, b = fit["beta"]
    return {
        **fit,
        "cov": _covariance(X, fit["sse"], fit["dof"]),
        "form": "tau = a + b ln(n)",
        "params": {"a": float(a), "b": float(b)},
    }


def _saturating_on_grid(n: np.ndarray, tau: np.ndarray, ceiling: float, tau_max=None):
    """The least-squares (tau_max, c, alpha) over the alpha grid, tau_max <= ceiling and c > 0:
    (sse, tau_max, c, alpha), or None where no alpha fits. With tau_max given it is held there and
    only c and alpha are fitted (the ceiling test)."""
    best = None
    for alpha in ALPHAS:
        x = n**-alpha
        if tau_max is None:
            fit = _linear_fit(np.column_stack([np.ones_like(n), -x]), tau)
            top, c = fit["beta"]
            sse = fit["sse"]
        else:
            top, c = tau_max, float(x @ (tau_max - tau) / (x @ x))  # tau_max - tau = c x
            resid = tau_max - tau - c * x
            sse = float(resid @ resid)
        if top > ceiling or c <= 0:
            continue
        if best is None or sse < best[0]:
            best = (sse, float(top), float(c), float(alpha))
    return best


def fit_saturating(n: np.ndarray, tau: np.ndarray, ceiling: float) -> dict | None:
    if len(n) < 4:
        return None
    best = _saturating_on_grid(n, tau, ceiling)
    if best is None:
        return None
    sse, tau_max, c, alpha = best
    return {
        "beta": np.array([tau_max, c, alpha]),
        "sse": sse,
        "dof": len(n) - 3,  # tau_max, c and alpha
        "rmse": math.sqrt(sse / len(n)),
        "n": n,
        "fitted": tau_max - c * n**-alpha,  # (points,): what the bootstrap draws around
        "ceiling": ceiling,
        "form": "tau = tau_max - c n^(-alpha)",
        "params": {"tau_max": tau_max, "c": c, "alpha": alpha},
    }


def bootstrap_saturating(fit: dict, draws: int, seed: int) -> np.ndarray:
    """(draws, 3) refits of (tau_max, c, alpha) to the fitted curve plus normal noise of standard
    deviation s sqrt(dof / chi2(dof)) (s the residual standard error; the residual dof make the
    noise heavy-tailed as they do the t), each refitted over the whole alpha grid with tau_max <= k + 1
    and c > 0. A draw no rising curve under the ceiling fits is all NaN (it never reaches a target)."""
    rng = np.random.default_rng(seed)
    n, dof = fit["n"], fit["dof"]
    sigma = math.sqrt(fit["sse"] / dof) * np.sqrt(dof / rng.chisquare(dof, size=draws))
    y = fit["fitted"] + rng.normal(size=(draws, len(n))) * sigma[:, None]  # (draws, points)
    best_sse = np.full(draws, np.inf)
    params = np.full((draws, 3), np.nan)
    for alpha in ALPHAS:
        X = np.column_stack([np.ones_like(n), -(n**-alpha)])  # (points, 2)
        beta = y @ np.linalg.pinv(X).T  # (draws, 2): tau_max, c
        sse = ((y - beta @ X.T) ** 2).sum(axis=1)
        better = (beta[:, 0] <= fit["ceiling"]) & (beta[:, 1] > 0) & (sse < best_sse)
        best_sse[better] = sse[better]
        params[better, :2] = beta[better]
        params[better, 2] = alpha
    return params


def parameter_draws(fit: dict, draws: int = DRAWS, seed: int = 0) -> np.ndarray | None:
    """(draws, parameters) draws of every fitted parameter (None without residual dof): the
    line's from the multivariate t with its covariance (what a bootstrap of it gives exactly), the
    saturating curve's by the parametric bootstrap."""
    if fit["dof"] <= 0:
        return None
    if fit["form"].startswith("tau = a"):
        return t_draws(fit["beta"], fit["cov"], fit["dof"], draws, seed)
    return bootstrap_saturating(fit, draws, seed)


def ceiling_p(n: np.ndarray, tau: np.ndarray, fit: dict, at: float) -> float | None:
    """p of the F test of a ceiling at `at`: tau_max held there, c and alpha refitted, against the
    free saturating fit (one parameter fewer). None without residual degrees of freedom or where no
    curve with that ceiling rises through the points."""
    from scipy import stats

    if fit["dof"] <= 0:
        return None
    held = _saturating_on_grid(n, tau, max(at, fit["ceiling"]), tau_max=at)
    if held is None:
        return None
    extra = max(held[0] - fit["sse"], 0.0)
    if fit["sse"] <= 0:
        return 0.0 if extra > 0 else 1.0
    return float(stats.f.sf(extra / (fit["sse"] / fit["dof"]), 1, fit["dof"]))


N_PARAMETERS = {"log_linear": 2, "saturating": 3}


def aicc(fit: dict, points: int, parameters: int) -> float | None:
    """n ln(SSE/n) + 2K + 2K(K+1)/(n-K-1), K the curve's parameters; None (infinite: the points
    cannot carry that many parameters) where n <= K + 1."""
    if points - parameters - 1 <= 0:
        return None
    sse = max(fit["sse"], 1e-300)  # an exact fit: the lowest criterion, not log(0)
    return (
        points * math.log(sse / points)
        + 2 * parameters
        + 2 * parameters * (parameters + 1) / (points - parameters - 1)
    )


def select(fits: dict, points: int) -> dict:
    """The curve with the lower AICc, the fewer parameters on a tie or where neither is defined."""
    scores = {
        name: (aicc(fit, points, N_PARAMETERS[name]) if fit is not None else None)
        for name, fit in fits.items()
    }
    defined = {name: v for name, v in scores.items() if v is not None}
    preferred = (
        min(defined, key=lambda name: (defined[name], N_PARAMETERS[name]))
        if defined
        else "log_linear"
    )
    undefined = [
        f"{name} ({N_PARAMETERS[name]} parameters, {points} points)"
        for name, fit in fits.items()
        if fit is not None and scores[name] is None
    ]
    return {
        "criterion": "AICc: n ln(SSE/n) + 2K + 2K(K+1)/(n-K-1), K the curve's parameters; lower is better",
        "preferred": preferred,
        "aicc": {name: (None if v is None else round(v, 3)) for name, v in scores.items()},
        "undefined": (
            "AICc is infinite (n <= K + 1: no points left to pay for the parameters) for "
            + ", ".join(undefined)
            if undefined
            else None
        ),
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
    tau_max, c, alpha = fit["beta"] if beta is None else beta
    if not (c > 0 and alpha > 0 and target < tau_max):  # NaN: a draw no rising curve fits
        return math.inf
    log_n = math.log((tau_max - target) / c) / -alpha
    return math.exp(log_n) if log_n < LOG_FLOAT_MAX else math.inf


def t_draws(beta: np.ndarray, cov: np.ndarray, dof: int, draws: int, seed: int) -> np.ndarray:
    """Parameter draws from the multivariate Student t centred on beta with scale matrix cov and
    dof degrees of freedom: normal draws divided by sqrt(chi2(dof) / dof)."""
    rng = np.random.default_rng(seed)
    z = rng.multivariate_normal(np.zeros(len(beta)), cov, size=draws, method="svd")
    w = rng.chisquare(dof, size=draws) / dof
    return np.asarray(beta) + z / np.sqrt(w)[:, None]


RULED_OUT = 0.1  # ruled out at 90%: under this share of draws reach it, and the F test p under it


def forecast(
    fit: dict, target: float, draws: int = DRAWS, seed: int = 0, betas: np.ndarray | None = None
) -> dict:
    """The samples the curve reaches target at, and the 10-90 percentile of that over draws of all
    the curve's parameters (parameter_draws), with the share of draws that reach the target at all
    (`reach_share`). betas: the draws, where the caller has them already."""
    point = solve(fit, target)
    out = {"samples": _round(point), "interval_10_90": None, "reach_share": None}
    betas = parameter_draws(fit, draws, seed) if betas is None else betas
    if betas is not None:
        values = np.array([solve(fit, target, b) for b in betas])
        lo, hi = np.quantile(
            values, [0.1, 0.9], method="inverted_cdf"
        )  # inf where a draw never gets there
        out["interval_10_90"] = [_round(lo), _round(hi)]
        out["reach_share"] = round(float(np.isfinite(values).mean()), 3)
    return out


def spread(fit: dict, betas: np.ndarray | None) -> dict | None:
    """Each fitted parameter's 10th and 90th percentile over the draws (None without them)."""
    if betas is None:
        return None
    return {
        key: [round(float(v), 4) for v in np.nanquantile(betas[:, i], [0.1, 0.9])]
        for i, key in enumerate(fit["params"])
    }


def ruled_out(f: dict) -> bool:
    """Whether the data rule the target out at 90%: fewer than RULED_OUT of the draws reach it and,
    for the saturating curve, the F test rejects a ceiling at the target at that level too."""
    if f.get("reach_share") is None or f["reach_share"] >= RULED_OUT:
        return False
    return f.get("ceiling_p") is None or f["ceiling_p"] < RULED_OUT


def not_reached(name: str, fit: dict, target: float, f: dict) -> str:
    """What a curve whose central fit does not reach target says: "never reaches" only where the
    draws rule it out at 90%; otherwise that the interval leaves it open."""
    curve = name.replace("_", "-")
    top = (
        f" (its ceiling tau_max = {fit['params']['tau_max']:.2f})"
        if "tau_max" in fit["params"]
        else ""
    )
    if f.get("reach_share") is None:
        return (
            f"the {curve} curve's central fit does not reach {target}{top}; with no residual "
            "degrees of freedom there is no interval, so the data do not rule it out"
        )
    share = f"{f['reach_share']:.0%} of the parameter draws reach it"
    if ruled_out(f):
        return f"the {curve} curve fitted to the runs never reaches {target} at 90% ({share})"
    test = (
        f"a ceiling at {target} fits the runs with p = {f['ceiling_p']:.2f} (F test) and "
        if f.get("ceiling_p") is not None
        else ""
    )
    return (
        f"the {curve} curve's central fit does not reach {target}{top}, but the data do not "
        f"rule it out at 90%: {test}{share}"
    )


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
    selection = select(fits, len(points))
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
            "aicc": selection["aicc"][name],
        }
        betas = parameter_draws(fit)  # (draws, parameters): every parameter varies
        report["fits"][name]["draws_10_90"] = spread(fit, betas)
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
                f = forecast(fit, target, betas=betas)
                f["extrapolation_factor"] = extrapolation_factor(f["samples"], int(n.max()))
                f["trust"] = trust(f["samples"], int(n.max()), int(n.min()))
                if f["samples"] is None:
                    if name == "saturating":
                        f["ceiling_p"] = ceiling_p(n, tau, fit, target)
                    f["ruled_out"] = ruled_out(f)
                    f["trust"] = (
                        "never reaches it at 90%"
                        if f["ruled_out"]
                        else "not reached by the central fit; not ruled out"
                    )
                    f["why_not"] = not_reached(name, fit, target, f)  # the verdict says it
            report["forecasts"].setdefault(str(target), {})[name] = f
    report["selection"] = selection
    report["preferred"] = selection["preferred"]
    return report
