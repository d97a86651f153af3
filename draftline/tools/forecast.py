"""Acceptance length vs training samples: fit the runs made so far, forecast the samples a
requested acceptance length needs, with the fit's uncertainty.

    draftline forecast --dvc-exps                        # every experiment/commit dvc knows
    draftline forecast points.json [more.json ...]       # [{"samples": N, "acceptance_length": x}, ...]
    draftline forecast --dvc-exps --targets 2.5 3.0 --out reports/forecast

Points: `reports/evaluate/acceptance_vs_samples.json` of each run (what `dvc plots` draws), given
as files, or collected from `dvc exp show --json` (params `samples`, metric `acceptance_length`
of reports/acceptance.json) with --dvc-exps. Points at the same `samples` are kept (repeats tell
the noise).

Two curves, least squares:
- log-linear: tau = a + b ln(n). Two parameters, so it is defined from two points; it grows
  without bound, so near the ceiling k + 1 it is optimistic (forecasts too few samples).
- saturating: tau = tau_max - c n^(-alpha), tau_max <= k + 1 (alpha on a grid, tau_max and c
  linear for each alpha); needs at least 4 points, and is the one to prefer when it fits better.

Uncertainty: residual standard error and the parameter covariance of the linear fit; 4,000 draws
of the parameters from that normal give the 10th-90th percentile of the forecast samples. With as
many points as parameters there is no residual, hence no interval: the report says so.
How far it is trusted (`trust`): inside the measured samples range it is an interpolation; up
to 4x the largest measured run it is an extrapolation of the kind this curve family usually
gets right within its interval; past that the number says which order of magnitude to budget
for, not a plan. Writes <out>.json and <out>.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import subprocess
import sys
from pathlib import Path

import numpy as np

from draftline.core.errors import DraftlineError, entry_point

# by name: `python -m draftline.tools.forecast` runs this module as __main__, a logger nothing sets up
log = logging.getLogger("draftline.tools.forecast")

ALPHAS = np.round(np.arange(0.05, 2.001, 0.01), 3)
TRUST_FACTOR = 4.0  # extrapolation beyond this times the largest measured samples is not trusted


def read_points(paths: list[str]) -> list[dict]:
    points = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        for row in data if isinstance(data, list) else [data]:
            if not isinstance(row, dict) or "samples" not in row or "acceptance_length" not in row:
                raise ValueError(
                    f"{path}: each point needs `samples` and `acceptance_length`, got {row!r}"
                )
            points.append(
                {
                    "samples": int(row["samples"]),
                    "acceptance_length": float(row["acceptance_length"]),
                    "source": str(path),
                }
            )
    return points


def points_from_dvc_exps(exp_show: list | dict) -> list[dict]:
    """Points from `dvc exp show --json`: every node that has params.yaml's `samples` and
    reports/acceptance.json's `acceptance_length` (workspace, commits, experiments)."""
    points = []

    def walk(node, name):
        if isinstance(node, dict):
            data = node.get("data") if isinstance(node.get("data"), dict) else node
            params, metrics = data.get("params"), data.get("metrics")
            if isinstance(params, dict) and isinstance(metrics, dict):
                samples = ((params.get("params.yaml") or {}).get("data") or {}).get("samples")
                acc = ((metrics.get("reports/acceptance.json") or {}).get("data") or {}).get(
                    "acceptance_length"
                )
                if isinstance(samples, int) and isinstance(acc, (int, float)):
                    points.append(
                        {
                            "samples": samples,
                            "acceptance_length": float(acc),
                            "source": node.get("name")
                            or data.get("name")
                            or name
                            or data.get("rev", "?"),
                        }
                    )
            for key, value in node.items():
                if key not in ("params", "metrics"):
                    walk(value, node.get("name") or name)
        elif isinstance(node, list):
            for value in node:
                walk(value, name)

    walk(exp_show, None)
    seen, unique = set(), []
    for p in points:  # a commit and the workspace on it repeat the same run
        key = (p["samples"], p["acceptance_length"], p["source"])
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


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


def solve(fit: dict, target: float, beta=None) -> float:
    """Samples at which the curve reaches `target` (inf when it never does)."""
    if fit["form"].startswith("tau = a"):
        a, b = fit["beta"] if beta is None else beta
        return math.exp((target - a) / b) if b > 0 else math.inf
    tau_max, c = fit["beta"] if beta is None else beta
    if c <= 0 or target >= tau_max:
        return math.inf
    return ((tau_max - target) / c) ** (-1.0 / fit["alpha"])


def forecast(fit: dict, target: float, draws: int = 4000, seed: int = 0) -> dict:
    point = solve(fit, target)
    out = {"samples": _round(point), "interval_10_90": None}
    if fit["cov"] is not None:
        rng = np.random.default_rng(seed)
        betas = rng.multivariate_normal(fit["beta"], fit["cov"], size=draws, method="svd")
        values = np.array([solve(fit, target, b) for b in betas])
        lo, hi = np.quantile(
            values, [0.1, 0.9], method="inverted_cdf"
        )  # inf where a draw never gets there
        out["interval_10_90"] = [_round(lo), _round(hi)]
    return out


def _round(x: float):
    return None if not math.isfinite(x) else int(round(x))


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
        return f"extrapolation up to {TRUST_FACTOR:g}x the largest run: indicative, within its interval"
    return (
        f"beyond {TRUST_FACTOR:g}x the largest run: an order of magnitude to budget for, not a plan"
    )


def build_report(points: list[dict], targets: list[float], k: int) -> dict:
    if len({p["samples"] for p in points}) < 2:
        raise ValueError(
            f"need runs at two or more distinct `samples` values to fit a curve, got "
            f"{sorted({p['samples'] for p in points})}"
        )
    n = np.array([p["samples"] for p in points], dtype=float)
    tau = np.array([p["acceptance_length"] for p in points], dtype=float)
    fits = {"log_linear": fit_log_linear(n, tau), "saturating": fit_saturating(n, tau, k + 1.0)}
    report = {
        "k": k,
        "points": sorted(points, key=lambda p: p["samples"]),
        "measured_samples": [int(n.min()), int(n.max())],
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
            f = forecast(fit, target)
            f["trust"] = trust(f["samples"], int(n.max()), int(n.min()))
            report["forecasts"].setdefault(str(target), {})[name] = f
    usable = {k_: v for k_, v in fits.items() if v is not None}
    report["preferred"] = (
        "saturating"
        if "saturating" in usable and usable["saturating"]["rmse"] <= usable["log_linear"]["rmse"]
        else "log_linear"
    )
    return report


def markdown(report: dict) -> str:
    lines = [
        "# Acceptance length vs training samples: forecast",
        "",
        f"k = {report['k']}; runs measured between {report['measured_samples'][0]:,} and "
        f"{report['measured_samples'][1]:,} samples (`draftline forecast`).",
        "",
        "| samples | acceptance length | run |",
        "|---|---|---|",
    ]
    lines += [
        f"| {p['samples']:,} | {p['acceptance_length']:.3f} | {p['source']} |"
        for p in report["points"]
    ]
    lines += ["", "| curve | form | parameters | rmse | residual dof |", "|---|---|---|---|---|"]
    for name, fit in report["fits"].items():
        if fit is None:
            lines.append(f"| {name} | — | needs 4+ points with a ceiling of k + 1 | — | — |")
        else:
            params = ", ".join(f"{k}={v:.4g}" for k, v in fit["params"].items())
            lines.append(
                f"| {name} | {fit['form']} | {params} | {fit['rmse']} | {fit['residual_dof']} |"
            )
    lines += [
        "",
        "| target acceptance length | curve | samples needed | 10-90% | trust |",
        "|---|---|---|---|---|",
    ]
    for target, by_curve in report["forecasts"].items():
        for name, f in by_curve.items():
            samples = f"{f['samples']:,}" if f["samples"] is not None else "never"
            interval = (
                "no residual: no interval"
                if f["interval_10_90"] is None
                else " – ".join("never" if v is None else f"{v:,}" for v in f["interval_10_90"])
            )
            lines.append(f"| {target} | {name} | {samples} | {interval} | {f['trust']} |")
    lines += [
        "",
        f"Preferred curve (lower rmse): {report['preferred']}. The log-linear curve has no ceiling, so "
        "near k + 1 it forecasts too few samples; the saturating one needs 4 or more runs. Inside the measured "
        f"range a forecast is an interpolation; up to {TRUST_FACTOR:g}x the largest run it is indicative within "
        "its interval; beyond, it gives the order of magnitude to budget for, not a plan: measure one more "
        "run nearer the target before spending GPU-days.",
        "",
    ]
    return "\n".join(lines)


@entry_point
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", help="JSON lists of {samples, acceptance_length}")
    ap.add_argument(
        "--dvc-exps", action="store_true", help="collect points from `dvc exp show --json`"
    )
    ap.add_argument("--targets", nargs="+", type=float, default=[2.5, 3.0])
    ap.add_argument(
        "--k", type=int, default=3, help="draft tokens per step the runs were evaluated with"
    )
    ap.add_argument("--out", default="reports/forecast", help="writes OUT.json and OUT.md")
    args = ap.parse_args(argv)
    points = read_points(args.files)
    if args.dvc_exps:
        proc = subprocess.run(
            ["dvc", "exp", "show", "--json", "--all-commits"], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise DraftlineError(f"error: dvc exp show failed: {proc.stderr.strip()[-500:]}")
        points += points_from_dvc_exps(json.loads(proc.stdout))
    try:
        report = build_report(points, args.targets, args.k)
    except ValueError as err:
        raise DraftlineError(f"error: {err}") from None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    log.info(markdown(report))


if __name__ == "__main__":
    main(sys.argv[1:])
