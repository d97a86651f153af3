"""Acceptance-vs-samples forecast (draftline/tools/forecast.py) on synthetic points with known curves."""

import json
import math

import numpy as np
import pytest

from draftline.tools.forecast import build_report, main, points_from_dvc_exps


def pts(samples, taus):
    return [
        {"samples": n, "acceptance_length": t, "source": f"run{n}"} for n, t in zip(samples, taus)
    ]


def test_log_linear_points_give_the_known_samples_with_an_interval_that_holds_them():
    rng = np.random.default_rng(0)
    samples = [250, 500, 1000, 2000, 4000]
    a, b = 0.4, 0.25  # tau = a + b ln n: tau 2.5 at n = e^8.4 = 4,447
    taus = [a + b * math.log(n) + rng.normal(0, 0.01) for n in samples]
    report = build_report(pts(samples, taus), [2.5, 3.0], k=3)
    f = report["forecasts"]["2.5"]["log_linear"]
    assert abs(f["samples"] - math.exp((2.5 - a) / b)) / math.exp((2.5 - a) / b) < 0.15
    lo, hi = f["interval_10_90"]
    assert lo < f["samples"] < hi
    assert "extrapolation up to 4x" in f["trust"]
    far = report["forecasts"]["3.0"]["log_linear"]  # e^10.4 = 32,859: past 4x the largest run
    assert far["samples"] > 4 * 4000 and "not a plan" in far["trust"]


def test_saturating_points_are_fitted_with_a_ceiling_and_preferred():
    samples = [100, 200, 400, 800, 1600, 3200]
    tau_max, c, alpha = 3.2, 12.0, 0.5  # tau 3.0 at n = (0.2 / 12)^(-2) = 3,600
    taus = [tau_max - c * n**-alpha for n in samples]
    report = build_report(pts(samples, taus), [2.5, 3.0, 3.5], k=3)
    fit = report["fits"]["saturating"]
    assert (
        abs(fit["params"]["tau_max"] - tau_max) < 0.05
        and abs(fit["params"]["alpha"] - alpha) < 0.05
    )
    assert report["preferred"] == "saturating"
    assert abs(report["forecasts"]["3.0"]["saturating"]["samples"] - 3600) / 3600 < 0.1
    assert report["forecasts"]["3.5"]["saturating"]["samples"] is None  # above its ceiling: never
    assert report["forecasts"]["3.5"]["saturating"]["trust"] == "not reached by this curve"


def test_two_points_fit_without_an_interval_and_one_value_is_refused():
    report = build_report(pts([500, 1000], [1.8, 2.0]), [2.5], k=3)
    assert report["forecasts"]["2.5"]["log_linear"]["interval_10_90"] is None
    assert report["fits"]["saturating"] is None
    with pytest.raises(ValueError, match="two or more distinct `samples`"):
        build_report(pts([500, 500], [1.8, 1.9]), [2.5], k=3)


def test_points_from_dvc_exp_show_json():
    def node(name, samples, acc):
        return {
            "rev": name,
            "name": name,
            "data": {
                "rev": name,
                "params": {"params.yaml": {"data": {"samples": samples}}},
                "metrics": {"reports/acceptance.json": {"data": {"acceptance_length": acc}}},
            },
        }

    exp_show = [
        {**node("workspace", 600, 3.7)},
        {
            **node("abc123", 600, 3.7),
            "experiments": [
                {"revs": [node("more-data", 1000, 3.8)]},
                {"revs": [node("broken", 2000, None)]},
            ],
        },
    ]
    points = points_from_dvc_exps(exp_show)
    assert sorted((p["samples"], p["acceptance_length"], p["source"]) for p in points) == [
        (600, 3.7, "abc123"),
        (600, 3.7, "workspace"),
        (1000, 3.8, "more-data"),
    ]


def test_command_writes_json_and_markdown(tmp_path):
    points = tmp_path / "points.json"
    points.write_text(
        json.dumps(
            [
                {"samples": n, "acceptance_length": 1.0 + 0.2 * math.log(n / 50)}
                for n in (100, 300, 900)
            ]
        )
    )
    main([str(points), "--out", str(tmp_path / "forecast")])
    report = json.loads((tmp_path / "forecast.json").read_text())
    assert set(report["forecasts"]) == {"2.5", "3.0"}
    text = (tmp_path / "forecast.md").read_text()
    assert "| 2.5 | log_linear |" in text and "not a plan" in text
