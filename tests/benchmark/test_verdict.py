"""The serving verdict (draftline/benchmark/verdict.py) on hand-made sweeps: the decision per load,
the break-even load, the step-cost model and its held-out error, what a speedup goal needs, the
decision and its words, and vLLM's k per batch size (checked by vLLM's own validator)."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

from draftline.benchmark import costs, verdict
from draftline.benchmark.config import BenchmarkConfig
from draftline.benchmark.sweep import Level
from draftline.engines.config import VLLM_VENV

LOADS, KS = [1, 4, 16], [1, 2, 3]
# the known step cost r = a + b k + (d + e k) log2 c and acceptance per k of the sweeps below
A, B, D, E = 1.0, 0.5, 0.1, 0.05
TAU = {1: 1.8, 2: 2.5, 3: 3.1}


def known_r(c: float, k: int) -> float:
    return A + B * k + (D + E * k) * math.log2(c)


SPREAD = (0.99, 1.0, 1.01, 0.995, 1.005)  # the paired ratios of a sweep: +-1% about its speedup


def sweep(loads=LOADS, ks=KS, r=known_r, noise=None, base=100.0, spread=SPREAD) -> dict:
    """Levels in benchmark_server's shape whose speculative tokens/s make r(c, k) the step cost:
    speedup = tau / r, each paired pass that times a factor of `spread` (geometric mean 1);
    `noise` {(c, k): factor} on the speculative tokens/s."""
    levels = {}
    scale = math.exp(-sum(math.log(f) for f in spread) / len(spread))
    for c in loads:
        spec = {}
        for k in ks:
            tps = TAU[k] * base / r(c, k) * (noise or {}).get((c, k), 1.0)
            spec[k] = {
                "output_tokens_per_s": tps,
                "acceptance_length": TAU[k],
                "paired_speedups": [tps / base * f * scale for f in spread],
            }
        levels[c] = Level({"output_tokens_per_s": base}, spec)
    return levels


def decided(**loads) -> dict:
    """decisions' shape from c<load>=(decision, k, speedup)."""
    return {
        int(c[1:]): {"decision": d, "k": k, "speedup": s, "low": None, "high": None}
        for c, (d, k, s) in loads.items()
    }


# ---- speedups, break-even ---------------------------------------------------------------------------


def test_speedups_are_the_geometric_mean_of_the_paired_ratios():
    levels = {
        1: Level(
            {"output_tokens_per_s": 100.0},
            {
                1: {"output_tokens_per_s": 150.0, "paired_speedups": [1.2, 1.875]},
                3: {"output_tokens_per_s": 180.0},  # no pairs (an older report): the ratio
            },
        ),
        8: Level({"output_tokens_per_s": 0.0}, {1: {"output_tokens_per_s": 10.0}}),
    }
    assert verdict.speedups(levels) == {1: {1: 1.5, 3: 1.8}, 8: {1: None}}


def test_break_even_is_where_the_line_in_log2_load_crosses_one():
    be = verdict.break_even(decided(c1=("yes", 3, 1.5), c4=("yes", 2, 1.1), c16=("no", None, 0.7)))
    # log2 load 2 + (1.1 - 1) / (1.1 - 0.7) x (4 - 2) = 2.5: 2 ** 2.5 = 5.66
    assert be == {
        "pays_at": [1, 4],
        "loses_at": [16],
        "no_gain_at": [],
        "undecided_at": [],
        "last_paying_concurrency": 4,
        "first_losing_concurrency": 16,
        "break_even_concurrency": 5.7,
    }
    # an undecided load between them: the line runs from the last decided yes to the first no
    gap = verdict.break_even(
        decided(c1=("yes", 3, 1.5), c4=("undecided", 2, 1.01), c16=("no", None, 0.6))
    )
    # 0 + (1.5 - 1) / (1.5 - 0.6) x 4 = 2.22: 2 ** 2.22 = 4.67
    assert gap["undecided_at"] == [4] and gap["break_even_concurrency"] == 4.7
    always = verdict.break_even(decided(c1=("yes", 3, 1.5), c4=("yes", 3, 1.2)))
    assert always["loses_at"] == [] and always["break_even_concurrency"] is None
    never = verdict.break_even(decided(c1=("no", None, 0.9), c4=("no", None, 0.6)))
    assert never["pays_at"] == [] and never["last_paying_concurrency"] is None
    assert never["break_even_concurrency"] is None


# ---- the cost model ---------------------------------------------------------------------------------


def test_cost_model_recovers_a_known_step_cost_exactly():
    points = costs.step_costs(sweep())
    assert len(points) == 9
    assert all(math.isclose(p["r"], known_r(p["c"], p["k"])) for p in points)
    model = costs.cost_model(points)
    assert model.report["terms"] == ["1", "k", "log2c", "k*log2c"]
    assert model.report["coefficients"] == pytest.approx([A, B, D, E], abs=1e-6)
    assert all(p["fitted_r"] == p["r"] for p in model.report["points"])
    # every point left out of the fit is predicted exactly by the other eight
    assert len(model.report["held_out"]) == 9
    assert all(h["relative_error"] == 0.0 for h in model.report["held_out"])
    assert all(h["predicted_speedup"] == h["measured_speedup"] for h in model.report["held_out"])
    assert model.report["held_out_mean_abs_error"] == model.report["held_out_max_abs_error"] == 0.0


def test_cost_model_reports_its_error_on_each_point_left_out():
    factors = [1.06, 0.95, 1.02, 0.97, 1.04, 0.93, 1.05, 0.98, 1.01]
    noise = {(c, k): f for (c, k), f in zip([(c, k) for c in LOADS for k in KS], factors)}
    points = costs.step_costs(sweep(noise=noise))
    model = costs.cost_model(points)
    assert model.report["coefficients"] != pytest.approx([A, B, D, E], abs=1e-3)

    # leave-one-out by hand: fit the other eight, predict the speedup tau / r of the one left out
    def features(p):
        x = math.log2(p["c"])
        return [1.0, p["k"], x, p["k"] * x]

    errors = []
    for i, p in enumerate(points):
        rest = points[:i] + points[i + 1 :]
        coef, *_ = np.linalg.lstsq(
            np.array([features(q) for q in rest]), np.array([q["r"] for q in rest]), rcond=None
        )
        predicted = p["tau"] / float(np.dot(features(p), coef))
        errors.append(predicted / p["speedup"] - 1)
        assert (
            model.report["held_out"][i]["c"] == p["c"]
            and model.report["held_out"][i]["k"] == p["k"]
        )
        assert model.report["held_out"][i]["relative_error"] == pytest.approx(errors[-1], abs=1e-4)
    assert model.report["held_out_mean_abs_error"] == pytest.approx(
        np.mean(np.abs(errors)), abs=1e-4
    )
    assert model.report["held_out_max_abs_error"] == pytest.approx(np.max(np.abs(errors)), abs=1e-4)
    assert 0.01 < model.report["held_out_mean_abs_error"] < 0.2


def test_a_point_the_fit_without_it_cannot_price_is_counted_not_infinite():
    """2 k x 2 loads: the fit left without one point can predict a step cost <= 0 there; that point
    gets no predicted speedup (None, counted in held_out_unpredicted), and the errors stay finite
    JSON numbers."""
    r = {(1, 1): 1.0, (1, 3): 1.2, (4, 1): 0.05, (4, 3): 3.0}
    levels = sweep(loads=[1, 4], ks=[1, 3], r=lambda c, k: r[(c, k)])
    model = costs.cost_model(costs.step_costs(levels))
    unpredicted = [h for h in model.report["held_out"] if h["predicted_speedup"] is None]
    assert unpredicted and model.report["held_out_unpredicted"] == len(unpredicted)
    assert all(h["relative_error"] is None for h in unpredicted)
    for key in ("held_out_mean_abs_error", "held_out_max_abs_error"):
        assert model.report[key] is None or math.isfinite(model.report[key])
    json.dumps(model.report, allow_nan=False)


def test_cost_model_terms_follow_what_the_sweep_varies():
    def terms(loads, ks):
        return costs.model_terms(costs.step_costs(sweep(loads, ks)))

    assert terms([1, 4, 16], [3]) == ["1", "log2c"]  # one k: no k slope
    assert terms([4], [1, 2, 3]) == ["1", "k"]  # one load: no load slope
    assert terms([1, 4], [1, 3]) == ["1", "k", "log2c"]  # four points: no product term
    assert terms([1, 4], [1]) == ["1"]  # two points: one left out leaves one
    one_load = costs.cost_model(costs.step_costs(sweep([4], [1, 2, 3])))
    assert one_load.report["coefficients"] == pytest.approx([A + 2 * D, B + 2 * E], abs=1e-6)
    assert one_load.report["held_out_mean_abs_error"] == 0.0
    assert costs.cost_model(costs.step_costs(sweep([4], [3]))) is None


def test_needs_is_the_acceptance_a_goal_takes_and_none_where_k_plus_one_cannot_reach_it():
    model = costs.cost_model(costs.step_costs(sweep()))
    # at 16 requests in flight r = 1.4 + 0.7 k: 1.0x needs tau = r, 1.5x needs 1.5 r > k + 1
    assert costs.needs(model, 16, KS, [1.0, 1.5]) == {
        1.0: {1: None, 2: 2.8, 3: 3.5},  # k=1: 2.1 > 2 tokens a step
        1.5: {1: None, 2: None, 3: None},  # compute-bound: no draft pays off
    }
    assert costs.needs(model, 1, [1], [1.0]) == {1.0: {1: 1.5}}


# ---- the decision -----------------------------------------------------------------------------------


def cfg(**overrides) -> BenchmarkConfig:
    return BenchmarkConfig(**{"k": KS, "concurrency": LOADS, "serve_concurrency": 4, **overrides})


def test_decide_at_the_serve_load_with_the_goals_met_reachable_and_out_of_reach():
    # speedups (tau / r): c1 1.2 / 1.25 / 1.24, c4 1.0 / 1.042 / 1.033, c16 0.857 / 0.893 / 0.886,
    # each from five pairs within +-2%
    v = verdict.decide(sweep(), cfg(speedup_goals=[1.0, 1.2, 1.5]), "vllm", [])
    assert (v["serve_concurrency"], v["decision"], v["k"], v["pays_off"]) == (4, "yes", 2, True)
    assert v["speedup"] == pytest.approx(2.5 / known_r(4, 2), abs=1e-4)
    assert 1 < v["speedup_low"] < v["speedup"] < v["speedup_high"] < 1.1
    assert v["acceptance_length"] == 2.5 and v["baseline_tokens_per_s"] == 100.0
    decisions = {c: (d["decision"], d["k"]) for c, d in v["decisions"].items()}
    # c1: k=2 (1.25) and k=3 (1.24) beat k=1 (1.2) in every round by less than the 5% k margin:
    # the smallest k; c4: k=1 (1.0) lies within 5% of 1, k=3 does not beat k=2: k=2; c16: every
    # interval below 1. Every round's ratios move together: the paired intervals are points.
    assert decisions == {"1": ("yes", 1), "4": ("yes", 2), "16": ("no", None)}
    assert v["decisions"]["1"]["versus"]["k2/k1"]["ratio"] == pytest.approx(1.25 / 1.2, abs=1e-4)
    assert all(d["settled"] for d in v["decisions"].values())
    assert v["settled"] == {"1": True, "4": True, "16": True}
    assert v["family"] == {
        "loads": 3,
        "ks": 3,
        "statements_per_look": 18,
        "looks_planned": 1,
        "intervals": 18,
        "each_interval_level": round(1 - 0.1 / 18, 6),
    }
    assert v["break_even"]["pays_at"] == [1, 4] and v["break_even"]["loses_at"] == [16]
    # past 16, the largest load measured: benchmark.undecided_k up to benchmark.max_batch_size
    assert v["k_per_batch_size"] == [[1, 2, 1], [3, 8, 2], [9, 1024, 0]]
    assert (
        "1024 (past the largest load measured) get benchmark.undecided_k = 0"
        in (v["k_per_batch_size_covers"])
    )
    assert v["cost_model"]["held_out_mean_abs_error"] == 0.0 and "_coef" not in v["cost_model"]
    assert "note" not in v
    met, reachable, beyond = (v["needs"][g] for g in ("1.0", "1.2", "1.5"))
    assert met["met"] is True and met["k"] == 2 and "forecast" not in met
    # 1.2x at 4 requests in flight: tau >= 1.2 r = 1.44 + 0.72 k, reachable at k 2 and 3
    assert reachable["met"] is False and reachable["by_k"] == {"1": None, "2": 2.88, "3": 3.6}
    assert (reachable["k"], reachable["acceptance_length"]) == (2, 2.88)
    assert reachable["measured_acceptance_length"] == 2.5
    assert reachable["forecast"] == {
        "samples": None,
        "why_not": "no acceptance-vs-samples points were given",
    }
    assert beyond["met"] is False and beyond["acceptance_length"] is None
    assert beyond["by_k"] == {"1": None, "2": None, "3": None} and beyond["max_k"] == 3
    words = v["words"]
    low, high = v["speedup_low"], v["speedup_high"]
    assert words.startswith(
        f"vllm, intervals at 90% shared by every k and pair of ks at every load and look: at 4 "
        f"requests in flight it pays off: k=2 gives 1.04x [{low:.2f}-{high:.2f}]. At 1 request"
    ), words
    assert "at 16 requests in flight it does not pay off: even k=2 gives 0.89x" in words
    be = v["break_even"]["break_even_concurrency"]
    assert f"Break-even near {be:g} requests in flight" in words
    assert "1.0x" not in words  # met: nothing to say
    assert "1.2x needs an acceptance length of 2.88 at k=2 (measured 2.5); samples: no " in words
    assert (
        "No draft reaches 1.5x at this load with k <= 3: verifying costs more than k + 1 tokens "
        "a step can repay." in words
    )


def test_decide_forecasts_the_samples_at_the_k_the_points_were_measured_at():
    # acceptance 2.0 at 100 samples, 0.3 more per doubling to 2.9 at 800, all at k=3: the
    # log-linear curve (the saturating one, with its ceiling k + 1, does not fit better)
    points = [
        {"samples": n, "acceptance_length": a, "k": 3}
        for n, a in ((100, 2.0), (200, 2.3), (400, 2.6), (800, 2.9))
    ]
    v = verdict.decide(sweep(), cfg(speedup_goals=[1.2]), "vllm", points)
    forecast = v["needs"]["1.2"]["forecast"]
    # at k=3 the goal needs 1.2 r(4, 3) = 3.6: 100 x 2 ** ((3.6 - 2.0) / 0.3) samples, 5.04x 800
    assert forecast["k"] == 3 and forecast["acceptance_length"] == 3.6
    assert forecast["fit"] == "log_linear" and forecast["measured_samples"] == [100, 800]
    assert forecast["samples"] == pytest.approx(100 * 2 ** (1.6 / 0.3), abs=2)
    assert forecast["extrapolation_factor"] == pytest.approx(100 * 2 ** (1.6 / 0.3) / 800, abs=0.01)
    assert "why_not" not in forecast
    assert (
        f"about {forecast['samples']:,} training samples (extrapolated 5.0x past the largest run "
        "(800 samples): an order of magnitude to budget for, not a plan)." in v["words"]
    )
    # three runs: no number, and the words say why instead
    three = verdict.decide(sweep(), cfg(speedup_goals=[1.2]), "vllm", points[:3])
    assert three["needs"]["1.2"]["forecast"]["samples"] is None
    assert (
        "1.2x needs an acceptance length of 2.88 at k=2 (measured 2.5); samples: 3 points at "
        "distinct sample counts: a forecast needs at least 4; run `dvc exp run -S samples=N` at "
        "more sizes." in three["words"]
    )
    one_run = verdict.decide(sweep(), cfg(speedup_goals=[1.2]), "vllm", points[:1])
    assert "two or more distinct `samples`" in one_run["needs"]["1.2"]["forecast"]["why_not"]
    assert "samples: need runs at two or more distinct" in one_run["words"]
    mixed = [*points[:3], {**points[3], "k": 2}]  # another k's acceptance: another measure
    refused = verdict.decide(sweep(), cfg(speedup_goals=[1.2]), "vllm", mixed)
    assert "points measured at different k" in refused["needs"]["1.2"]["forecast"]["why_not"]
    assert refused["needs"]["1.2"]["forecast"]["samples"] is None


def test_samples_for_a_curve_that_never_reaches_the_acceptance_says_so():
    points = [
        {"samples": n, "acceptance_length": a, "k": 3}
        for n, a in ((100, 2.6), (200, 2.4), (400, 2.2), (800, 2.0))
    ]  # falling acceptance: the log-linear curve never reaches more
    out = verdict.samples_for(points, 3.0, 3)
    assert out["samples"] is None and out["extrapolation_factor"] is None
    assert out["why_not"].startswith(
        "the log-linear curve fitted to the runs never reaches 3.0 at 90%"
    )


def test_read_points_keeps_the_k_each_point_was_measured_at(tmp_path):
    """The evaluate stage's acceptance_vs_samples.json gives its k: the verdict forecasts there."""
    from draftline.benchmark.run import read_points

    path = tmp_path / "acceptance_vs_samples.json"
    path.write_text(json.dumps([{"samples": 600, "acceptance_length": 3.5, "k": 3, "tau_sim": 3}]))
    [point] = read_points(path)
    assert (point["samples"], point["acceptance_length"], point["k"]) == (600, 3.5, 3)
    path.write_text(json.dumps({"samples": 60, "acceptance_length": 2.0}))
    assert "k" not in read_points(path)[0]
    assert read_points(tmp_path / "missing.json") == [] and read_points(None) == []


def test_decide_where_no_load_pays_and_for_the_built_in_engine():
    def dear(c, k):
        return 2 * known_r(c, k)

    v = verdict.decide(sweep(r=dear), cfg(speedup_goals=[1.0]), "vllm", [])
    assert v["decision"] == "no" and v["pays_off"] is False and v["k"] is None
    assert v["break_even"]["pays_at"] == [] and v["k_per_batch_size"] == [[1, 1024, 0]]
    assert "at 4 requests in flight it does not pay off: even k=2 gives 0.52x" in v["words"]
    # engine hf measures 1 request in flight: its verdict is there, whatever serve_concurrency says
    hf = verdict.decide(sweep(loads=[1]), cfg(engine="hf"), "hf", [])
    assert hf["serve_concurrency"] == 1 and hf["k"] == 1 and "1 request in flight" in hf["note"]
    assert hf["cost_model"]["terms"] == ["1", "k"]
    assert "at 1 request in flight it pays off: k=1 gives 1.20x" in hf["words"]


# ---- k per batch size -------------------------------------------------------------------------------


SCHEDULES = [
    # each load's range reaches half-way (in log2) to the next; the last ends at the largest load
    (
        decided(c1=("yes", 3, 1.4), c4=("yes", 2, 1.1), c16=("no", None, 0.9)),
        [[1, 2, 3], [3, 8, 2], [9, 16, 0]],
    ),
    (decided(c1=("yes", 2, 1.3), c4=("yes", 2, 1.1), c16=("yes", 2, 1.05)), [[1, 16, 2]]),
    # losing: 0; undecided: benchmark.undecided_k (0 here); merged
    (
        decided(c1=("yes", 3, 1.2), c4=("undecided", 1, 1.01), c16=("no", None, 0.8)),
        [[1, 2, 3], [3, 16, 0]],
    ),
    (
        decided(c1=("yes", 1, 1.2), c2=("yes", 2, 1.1), c3=("yes", 3, 1.1)),
        [[1, 1, 1], [2, 2, 2], [3, 3, 3]],
    ),
    (decided(c4=("yes", 2, 1.2), c32=("yes", 1, 1.1)), [[1, 11, 2], [12, 32, 1]]),
    (decided(c8=("yes", 3, 1.5)), [[1, 8, 3]]),
]


@pytest.mark.parametrize("decisions, schedule", SCHEDULES)
def test_k_schedule_ranges_merges_and_zero_where_no_k_pays(decisions, schedule):
    assert verdict.k_schedule(decisions) == schedule


def test_k_schedule_serves_undecided_loads_with_undecided_k():
    loads = decided(c1=("yes", 3, 1.4), c4=("undecided", 2, 1.02), c16=("no", None, 0.8))
    assert verdict.k_schedule(loads, undecided_k=1) == [[1, 2, 3], [3, 8, 1], [9, 16, 0]]


VLLM_PYTHON = Path(__file__).resolve().parents[2] / VLLM_VENV / "bin" / "python"


@pytest.mark.skipif(not VLLM_PYTHON.is_file(), reason=f"no {VLLM_VENV}: make setup-vllm")
def test_k_schedule_passes_vllms_own_validator():
    """vLLM's num_speculative_tokens_per_batch_size checks (vllm/v1/spec_decode/dynamic/utils.py),
    run in .venv-vllm: each schedule is valid and its dense lookup gives the best k at each load
    measured, under the largest k scheduled."""
    schedules = [schedule for _, schedule in SCHEDULES]
    schedules.append(verdict.decide(sweep(), cfg(), "vllm", [])["k_per_batch_size"])
    code = (
        "import json, sys\n"
        "from vllm.v1.spec_decode.dynamic.utils import (\n"
        "    build_dynamic_sd_schedule_lookup, validate_and_normalize_dynamic_sd_schedule)\n"
        "out = []\n"
        "for s in json.load(sys.stdin):\n"
        "    validate_and_normalize_dynamic_sd_schedule(s)\n"
        "    top = max(max(k for _, _, k in s), 1)\n"
        "    out.append(build_dynamic_sd_schedule_lookup(s, 40, top))\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run(
        [str(VLLM_PYTHON), "-c", code],
        input=json.dumps(schedules),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lookups = json.loads(proc.stdout.strip().splitlines()[-1])
    for (loads, _), lookup in zip(SCHEDULES, lookups):
        for c, d in loads.items():
            assert lookup[c] == (d["k"] if d["decision"] == "yes" else 0), (c, lookup)
    assert lookups[0][1:] == [3, 3, 2, 2, 2, 2, 2, 2] + [0] * 32  # 0 carried on past 16
    assert lookups[-1][1:9] == [1, 1] + [2] * 6 and lookups[-1][9:] == [0] * 32


def test_the_cost_model_estimates_break_even_past_the_loads_measured():
    """A draft that pays at every load measured: the words say so, and the cost model's own
    break-even load is given, marked as an extrapolation; one that loses inside the sweep gets
    the model's estimate unmarked."""
    v = verdict.decide(sweep(loads=[1, 4], ks=[1, 2, 3]), cfg(concurrency=[1, 4]), "vllm", [])
    assert v["break_even"]["loses_at"] == []
    estimate = v["break_even"]["model_estimate"]
    # r = 1 + 0.5 k + (0.1 + 0.05 k) log2 c: tau / r falls below 1 for every k past c = 2^2.6
    # (k = 2, the last to fall)
    assert estimate["extrapolated"] and 5.5 < estimate["concurrency"] < 6.5
    assert (
        v["break_even"]["pays_at"] == [1, 4] and v["break_even"]["break_even_concurrency"] is None
    )
    assert "(extrapolated past the loads measured)" in v["words"]
    loads = [1, 16, 256]
    inside = verdict.decide(
        sweep(loads=loads), cfg(concurrency=loads, serve_concurrency=1), "vllm", []
    )
    assert inside["break_even"]["model_estimate"]["extrapolated"] is False
