"""Acceptance length vs training samples: fit the runs made so far, forecast the samples a
requested acceptance length needs, with the fit's uncertainty.

    draftline forecast --dvc-exps                        # every experiment/commit dvc knows
    draftline forecast points.json [more.json ...]       # [{"samples": N, "acceptance_length": x, "k": k}, ...]
    draftline forecast --dvc-exps --targets 2.5 3.0 --out reports/forecast

The points, the curves, their uncertainty and trust: draftline/benchmark/forecast.py, whose
fitting the benchmark's verdict shares. Writes <out>.json and <out>.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
from pathlib import Path

from draftline.benchmark.forecast import (
    DEFAULT_K,
    MIN_POINTS,
    TRUST_FACTOR,
    build_report,
    read_points,
)
from draftline.core.errors import DraftlineError, entry_point

# by name: `python -m draftline.tools.forecast` runs this module as __main__, a logger nothing sets up
log = logging.getLogger("draftline.tools.forecast")


def points_from_dvc_exps(exp_show: list | dict) -> list[dict]:
    """Points from `dvc exp show --json`: every node that has params.yaml's `samples` and
    reports/acceptance.json's `acceptance_length` (workspace, commits, experiments), with that
    report's `k` where it gives one."""
    points = []

    def walk(node, name):
        if isinstance(node, dict):
            data = node.get("data") if isinstance(node.get("data"), dict) else node
            params, metrics = data.get("params"), data.get("metrics")
            if isinstance(params, dict) and isinstance(metrics, dict):
                samples = ((params.get("params.yaml") or {}).get("data") or {}).get("samples")
                acceptance = (metrics.get("reports/acceptance.json") or {}).get("data") or {}
                acc = acceptance.get("acceptance_length")
                if isinstance(samples, int) and isinstance(acc, (int, float)):
                    point = {
                        "samples": samples,
                        "acceptance_length": float(acc),
                        "source": node.get("name")
                        or data.get("name")
                        or name
                        or data.get("rev", "?"),
                    }
                    if isinstance(acceptance.get("k"), int):
                        point["k"] = acceptance["k"]
                    points.append(point)
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


def markdown(report: dict) -> str:
    lines = [
        "# Acceptance length vs training samples: forecast",
        "",
        f"Measure: {report['measure']}.",
        "",
        f"k = {report['k']}; runs measured between {report['measured_samples'][0]:,} and "
        f"{report['measured_samples'][1]:,} samples, at {report['distinct_samples']} distinct "
        "sample counts (`draftline forecast`).",
        "",
    ]
    if report["why_not"]:
        lines += [f"**No forecast**: {report['why_not']}.", ""]
    lines += [
        "| samples | acceptance length | run |",
        "|---|---|---|",
    ]
    lines += [
        f"| {p['samples']:,} | {p['acceptance_length']:.3f} | {p['source']} |"
        for p in report["points"]
    ]
    lines += [
        "",
        "| curve | form | parameters | their draws, 10-90% | rmse | residual dof | AICc |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, fit in report["fits"].items():
        if fit is None:
            lines.append(
                f"| {name} | — | needs 4+ points with a ceiling of k + 1 | — | — | — | — |"
            )
        else:
            params = ", ".join(f"{k}={v:.4g}" for k, v in fit["params"].items())
            spread = (
                "no residual: no draws"
                if fit.get("draws_10_90") is None
                else ", ".join(
                    f"{k} {lo:.4g} – {hi:.4g}" for k, (lo, hi) in fit["draws_10_90"].items()
                )
            )
            aicc = "infinite (n <= K + 1)" if fit.get("aicc") is None else f"{fit['aicc']:.2f}"
            lines.append(
                f"| {name} | {fit['form']} | {params} | {spread} | {fit['rmse']} | "
                f"{fit['residual_dof']} | {aicc} |"
            )
    lines += [
        "",
        "| target acceptance length | curve | samples needed | 10-90% | x largest run | trust |",
        "|---|---|---|---|---|---|",
    ]
    for target, by_curve in report["forecasts"].items():
        for name, f in by_curve.items():
            if report["why_not"]:
                lines.append(f"| {target} | {name} | no forecast | — | — | {f['why_not']} |")
                continue
            samples = f"{f['samples']:,}" if f["samples"] is not None else "not by the central fit"
            interval = (
                "no residual: no interval"
                if f["interval_10_90"] is None
                else " – ".join("never" if v is None else f"{v:,}" for v in f["interval_10_90"])
            )
            factor = "—" if f["extrapolation_factor"] is None else f"{f['extrapolation_factor']:g}x"
            words = f["why_not"] if f["samples"] is None else f["trust"]
            lines.append(f"| {target} | {name} | {samples} | {interval} | {factor} | {words} |")
    selection = report["selection"]
    lines += [
        "",
        f"Preferred curve (lower AICc, the criterion that charges each parameter with so few "
        f"points; in-sample rmse always favours the curve with more; fewer parameters where no "
        f"AICc is finite): {report['preferred']}"
        + (f"; {selection['undefined']}" if selection.get("undefined") else "")
        + ". Both curves are shown: where they disagree, the range between them is what the runs "
        "leave open. The log-linear curve has no ceiling, so near k + 1 it forecasts too few "
        "samples. A forecast needs runs at "
        f"{MIN_POINTS} or more distinct sample counts. The 10-90% interval is over draws of every "
        "parameter (a parametric bootstrap of the residuals with the noise scale drawn from the "
        "residual degrees of freedom; for the line, the multivariate Student t it amounts to). "
        '"Never reaches" is said only where the data rule the target out at 90%. Inside the '
        f"measured range a forecast is an interpolation; up to {TRUST_FACTOR:g}x the largest run it is "
        "indicative within its interval; beyond, it gives the order of magnitude to budget for, not a "
        "plan: measure one more run nearer the target before spending GPU-days.",
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
        "--k",
        type=int,
        help="draft tokens per step the runs were evaluated with (default: the points' `k`, else "
        f"{DEFAULT_K}); one the points contradict is refused",
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
