"""Acceptance-vs-samples forecast (draftline/benchmark/forecast.py, draftline/tools/forecast.py) on synthetic points with known curves."""

import json
import math

import numpy as np
import pytest

from draftline.benchmark.forecast import (
    MEASURE,
    build_report,
    fit_log_linear,
    fit_saturating,
    forecast,
    parameter_draws,
    read_points,
    solve,
)
from draftline.tools.forecast import main, points_from_dvc_exps

WHY_THREE = (
    "3 points at distinct sample counts: a forecast needs at least 4; run "
    "`dvc exp run -S samples=N` at more sizes"
)


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
    assert f["extrapolation_factor"] == round(f["samples"] / 4000, 2)
    assert 1 < f["extrapolation_factor"] <= 2
    assert f["trust"] == (
        "extrapolation up to 2x the largest run (4,000 samples): indicative, within its interval"
    )
    assert report["measure"] == MEASURE and "held-out acceptance length" in MEASURE
    far = report["forecasts"]["3.0"]["log_linear"]  # e^10.4 = 32,859: about 8.2x the largest run
    assert abs(far["extrapolation_factor"] - math.exp(10.4) / 4000) / (math.exp(10.4) / 4000) < 0.2
    assert far["extrapolation_factor"] == round(far["samples"] / 4000, 2)
    assert far["trust"] == (
        f"extrapolated {far['samples'] / 4000:.1f}x past the largest run (4,000 samples): "
        "an order of magnitude to budget for, not a plan"
    )


def test_just_past_twice_the_largest_run_the_trust_says_how_far():
    # tau = 1 + 0.5 ln(n / 100) exactly: tau 2.5 at 100 e^3 = 2,009, 2.51x the largest run (800)
    samples = [100, 200, 400, 800]
    report = build_report(
        pts(samples, [1 + 0.5 * math.log(n / 100) for n in samples]), [2.0, 2.5], k=3
    )
    inside = report["forecasts"]["2.0"]["log_linear"]  # 100 e^2 = 739: inside the range
    assert inside["samples"] == 739 and inside["extrapolation_factor"] == 0.92
    assert inside["trust"] == "interpolation (inside the measured range)"
    past = report["forecasts"]["2.5"]["log_linear"]
    assert past["samples"] == 2009 and past["extrapolation_factor"] == 2.51
    assert past["trust"].startswith("extrapolated 2.5x past the largest run (800 samples)")


def log_linear_fit(dof: int, sd_a: float, b: float = 0.25) -> dict:
    """A log-linear fit whose only uncertain parameter is the intercept a (standard error sd_a)."""
    fit = fit_log_linear(np.array([100.0, 1000.0]), np.array([1.0, 1.0 + b * math.log(10)]))
    return {**fit, "dof": dof, "cov": np.diag([sd_a**2, 0.0])}


def interval_in_standard_errors(dof: int) -> float:
    """The half-width of the 10-90 interval of ln(samples), in standard errors of a: the 90th
    percentile of the draws' distribution (ln n = (target - a) / b is linear in a)."""
    sd_a, b = 0.05, 0.25
    f = forecast(log_linear_fit(dof, sd_a, b), 2.0)
    lo, hi = f["interval_10_90"]
    return math.log(hi / lo) / 2 / (sd_a / b)


def test_the_interval_is_students_t_at_the_residual_dof_not_the_normals():
    z_90 = 1.2816  # the normal's 90th percentile
    t_90_one_dof = math.tan(0.4 * math.pi)  # Student t at 1 dof (Cauchy): 3.078
    t_90_thirty_dof = 1.3104
    one = interval_in_standard_errors(1)
    assert abs(one - t_90_one_dof) / t_90_one_dof < 0.1
    assert one > 2 * z_90  # the normal's interval would be less than half as wide
    thirty = interval_in_standard_errors(30)
    assert abs(thirty - t_90_thirty_dof) / t_90_thirty_dof < 0.05
    assert interval_in_standard_errors(1) == one  # seeded: the same draws each time


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
    assert report["preferred"] == "saturating"  # exact: far the lower AICc, 6 points for 3
    assert report["selection"]["aicc"]["saturating"] < report["selection"]["aicc"]["log_linear"]
    assert abs(report["forecasts"]["3.0"]["saturating"]["samples"] - 3600) / 3600 < 0.1
    above = report["forecasts"]["3.5"]["saturating"]  # above an exactly measured ceiling
    assert above["samples"] is None and above["ruled_out"] is True
    assert above["trust"] == "never reaches it at 90%"


def test_fewer_than_four_distinct_sample_counts_give_no_number_but_say_why():
    two = build_report(pts([500, 1000], [1.8, 2.0]), [2.5], k=3)
    assert two["fits"]["log_linear"]["residual_dof"] == 0 and two["fits"]["saturating"] is None
    assert two["forecasts"]["2.5"]["log_linear"] == {
        "samples": None,
        "interval_10_90": None,
        "extrapolation_factor": None,
        "trust": None,
        "why_not": "2 points at distinct sample counts: a forecast needs at least 4; run "
        "`dvc exp run -S samples=N` at more sizes",
    }
    # four runs, one repeated: three distinct sample counts still give no number
    three = build_report(pts([500, 1000, 2000, 2000], [1.8, 2.0, 2.2, 2.25]), [2.5], k=3)
    assert three["distinct_samples"] == 3 and three["why_not"] == WHY_THREE
    assert three["fits"]["log_linear"]["residual_dof"] == 2  # fitted, with its residual
    assert all(
        f["samples"] is None and f["why_not"] == WHY_THREE
        for f in three["forecasts"]["2.5"].values()
    )
    four = build_report(pts([500, 1000, 2000, 4000], [1.8, 2.0, 2.2, 2.4]), [2.5], k=3)
    assert four["why_not"] is None and four["forecasts"]["2.5"]["log_linear"]["samples"] > 4000
    with pytest.raises(ValueError, match="two or more distinct `samples`.*needs at least 4"):
        build_report(pts([500, 500], [1.8, 1.9]), [2.5], k=3)


def test_points_at_another_k_are_another_measure_and_refused(tmp_path):
    points = [{**p, "k": 3} for p in pts([100, 200, 400, 800], [1.8, 2.0, 2.2, 2.4])]
    assert build_report(points, [2.5])["k"] == 3  # the points' k
    mixed = points[:3] + [{**points[3], "k": 2}]
    with pytest.raises(
        ValueError, match=r"different k: run800 \(samples 800\) at k=2, run100 at k=3"
    ):
        build_report(mixed, [2.5])
    with pytest.raises(ValueError, match="measured at k=3, the forecast was asked at k=2"):
        build_report(points, [2.5], k=2)
    path = tmp_path / "points.json"
    path.write_text(
        json.dumps(
            [
                {"samples": 100, "acceptance_length": 1.8, "k": 3},
                {"samples": 200, "acceptance_length": 2.0, "k": 2},
            ]
        )
    )
    assert [p["k"] for p in read_points([str(path)])] == [3, 2]
    with pytest.raises(SystemExit, match="different k"):
        main([str(path), "--out", str(tmp_path / "forecast")])


def test_points_from_dvc_exp_show_json():
    def node(name, samples, acc):
        return {
            "rev": name,
            "name": name,
            "data": {
                "rev": name,
                "params": {"params.yaml": {"data": {"samples": samples}}},
                "metrics": {
                    "reports/acceptance.json": {"data": {"acceptance_length": acc, "k": 3}}
                },
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
    assert {p["k"] for p in points} == {3}  # reports/acceptance.json's k
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
                for n in (100, 300, 900, 2700)
            ]
        )
    )
    main([str(points), "--out", str(tmp_path / "forecast")])
    report = json.loads((tmp_path / "forecast.json").read_text())
    assert set(report["forecasts"]) == {"2.5", "3.0"} and report["measure"] == MEASURE
    far = report["forecasts"]["3.0"]["log_linear"]  # 50 e^10 = 1.1M samples, 408x the largest run
    assert far["extrapolation_factor"] == pytest.approx(50 * math.exp(10) / 2700, rel=0.01)
    text = (tmp_path / "forecast.md").read_text()
    assert "| 2.5 | log_linear |" in text and "not a plan" in text
    assert f"{far['extrapolation_factor']:g}x | extrapolated" in text
    points.write_text(json.dumps(json.loads(points.read_text())[:3]))  # three runs: no number
    main([str(points), "--out", str(tmp_path / "forecast")])
    report = json.loads((tmp_path / "forecast.json").read_text())
    assert report["forecasts"]["2.5"]["log_linear"]["samples"] is None
    text = (tmp_path / "forecast.md").read_text()
    assert f"**No forecast**: {WHY_THREE}." in text
    assert f"| 2.5 | log_linear | no forecast | — | — | {WHY_THREE} |" in text


def test_a_flat_curve_never_reaches_the_target_instead_of_overflowing():
    """A slope draw near zero puts the target past any float: that draw never gets there (inf),
    and a flat fit's forecast has no number, not an OverflowError."""
    fit = {"form": "tau = a + b ln(n)", "beta": np.array([1.9, 1e-4]), "cov": None, "dof": 0}
    assert solve(fit, 3.0) == math.inf
    assert solve(fit, 1.9 + 1e-4 * math.log(100)) == pytest.approx(100)
    flat = pts([125, 250, 375, 500], [1.96, 1.97, 1.96, 1.98])
    f = build_report(flat, [3.5], k=3)["forecasts"]["3.5"]["log_linear"]
    assert f["samples"] is None or f["samples"] > 10**6
    assert f["interval_10_90"][1] is None  # the upper draws never get there


# The SmolLM2 recipe's four runs (reports/recipe_smollm2/acceptance_vs_samples.json), k = 3.
SMOLLM2 = pts([125, 250, 375, 500], [1.7628, 1.9023, 1.9613, 1.9818])


def test_the_draws_vary_every_parameter_alpha_included():
    """The saturating curve's draws refit alpha too (they held it at its fit before): its spread
    is not zero."""
    rng = np.random.default_rng(0)
    samples = [100, 200, 400, 800, 1600, 3200]
    taus = [3.2 - 12.0 * n**-0.5 + rng.normal(0, 0.01) for n in samples]
    n, tau = np.array(samples, dtype=float), np.array(taus)
    fit = fit_saturating(n, tau, 4.0)
    draws = parameter_draws(fit)
    assert draws.shape == (4000, 3)
    assert np.nanstd(draws[:, 2]) > 0.01  # alpha varies
    assert len(np.unique(draws[:, 2])) > 10
    report = build_report(pts(samples, taus), [3.0], k=3)
    lo, hi = report["fits"]["saturating"]["draws_10_90"]["alpha"]
    assert lo < report["fits"]["saturating"]["params"]["alpha"] < hi
    # on the recorded runs: alpha's 10-90% spans far more than a grid step
    smollm2 = build_report(SMOLLM2, [2.5], k=3)["fits"]["saturating"]["draws_10_90"]
    assert smollm2["alpha"][1] - smollm2["alpha"][0] > 0.5


def test_aicc_prefers_the_line_when_the_saturating_curve_wins_rmse_only_marginally():
    # a line in ln(n) with noise: the three-parameter curve bends into the noise and fits a
    # little better in-sample, which AICc does not pay for
    samples = [100, 200, 400, 800, 1600, 3200]
    taus = [1.908, 2.056, 2.232, 2.35, 2.443, 2.614]
    report = build_report(pts(samples, taus), [2.5], k=3)
    line, curve = report["fits"]["log_linear"], report["fits"]["saturating"]
    assert curve["rmse"] < line["rmse"] < 1.2 * curve["rmse"]  # rmse alone would pick the curve
    assert report["selection"]["aicc"] == {"log_linear": line["aicc"], "saturating": curve["aicc"]}
    assert line["aicc"] < curve["aicc"]
    assert report["preferred"] == "log_linear"
    # four points cannot carry three parameters: the saturating curve's AICc is infinite
    four = build_report(SMOLLM2, [2.5], k=3)
    assert four["fits"]["saturating"]["rmse"] < four["fits"]["log_linear"]["rmse"]
    assert four["selection"]["aicc"]["saturating"] is None and four["preferred"] == "log_linear"
    assert "saturating (3 parameters, 4 points)" in four["selection"]["undefined"]


def test_never_reaches_only_where_the_data_rule_it_out():
    # the recorded runs: the central ceiling is 2.08, but a ceiling at 2.5 fits with p = 0.2
    open_ = build_report(SMOLLM2, [2.5], k=3)["forecasts"]["2.5"]["saturating"]
    assert open_["samples"] is None and open_["ruled_out"] is False
    assert open_["ceiling_p"] == pytest.approx(0.196, abs=0.01)
    assert "never reaches" not in open_["why_not"] and "never" not in open_["trust"]
    assert open_["why_not"].startswith(
        "the saturating curve's central fit does not reach 2.5 (its ceiling tau_max = 2.08), but "
        "the data do not rule it out at 90%: a ceiling at 2.5 fits the runs with p = 0.20"
    )
    # six precise points under a ceiling of 2.1: 2.5 is ruled out, and only then said so
    rng = np.random.default_rng(0)
    samples = [100, 200, 400, 800, 1600, 3200]
    taus = [2.1 - 6.0 * n**-0.6 + rng.normal(0, 0.005) for n in samples]
    shut = build_report(pts(samples, taus), [2.5], k=3)["forecasts"]["2.5"]["saturating"]
    assert shut["ruled_out"] is True and shut["reach_share"] < 0.1 and shut["ceiling_p"] < 0.1
    assert shut["why_not"].startswith(
        "the saturating curve fitted to the runs never reaches 2.5 at 90%"
    )
    assert shut["trust"] == "never reaches it at 90%"
    # the verdict's words are the forecast's
    from draftline.benchmark.verdict import samples_for

    said = samples_for([{**p, "k": 3} for p in pts(samples, taus)], 2.5, 3)
    assert said["fit"] == "saturating" and said["why_not"] == shut["why_not"]
