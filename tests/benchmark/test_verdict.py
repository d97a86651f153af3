"""The serving verdict (draftline/benchmark/verdict.py) on hand-made sweeps: the best k per load,
the break-even load, the step-cost model and its held-out error, what a speedup goal needs, the
decision and its words, and vLLM's k per batch size (checked by vLLM's own validator)."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

from draftline.benchmark import verdict
from draftline.benchmark.config import BenchmarkConfig
from draftline.engines.config import VLLM_VENV

LOADS, KS = [1, 4, 16], [1, 2, 3]
# the known step cost r = a + b k + (d + e k) log2 c and acceptance per k of the sweeps below
A, B, D, E = 1.0, 0.5, 0.1, 0.05
TAU = {1: 1.8, 2: 2.5, 3: 3.1}


def known_r(c: float, k: int) -> float:
    return A + B * k + (D + E * k) * math.log2(c)


def sweep(loads=LOADS, ks=KS, r=known_r, noise=None, base=100.0) -> dict:
    """Levels in benchmark_server's shape whose speculative tokens/s make r(c, k) the step cost:
    speedup = tau / r; `noise` {(c, k): factor} on the speculative tokens/s."""
    levels = {}
    for c in loads:
        spec = {}
        for k in ks:
            tps = TAU[k] * base / r(c, k) * (noise or {}).get((c, k), 1.0)
            spec[k] = {"output_tokens_per_s": tps, "acceptance_length": TAU[k]}
        levels[c] = {"baseline": {"output_tokens_per_s": base}, "speculative": spec}
    return levels


def best(**speedups) -> dict:
    """best_per_load's shape from c<load>=(k, speedup)."""
    return {int(c[1:]): {"k": k, "speedup": s} for c, (k, s) in speedups.items()}


# ---- best k, break-even ---------------------------------------------------------------------------


def test_speedups_and_the_best_k_per_load():
    levels = {
        1: {
            "baseline": {"output_tokens_per_s": 100.0},
            "speculative": {
                1: {"output_tokens_per_s": 150.0},
                3: {"output_tokens_per_s": 180.0},
            },
        },
        4: {  # a tie: the smaller k
            "baseline": {"output_tokens_per_s": 200.0},
            "speculative": {
                3: {"output_tokens_per_s": 220.0},
                1: {"output_tokens_per_s": 220.0},
            },
        },
        8: {"baseline": {"output_tokens_per_s": 0.0}, "speculative": {1: {}}},
    }
    levels[8]["speculative"][1]["output_tokens_per_s"] = 10.0
    table = verdict.speedups(levels)
    assert table == {1: {1: 1.5, 3: 1.8}, 4: {3: 1.1, 1: 1.1}, 8: {1: None}}
    assert verdict.best_per_load(table) == {
        1: {"k": 3, "speedup": 1.8},
        4: {"k": 1, "speedup": 1.1},
        8: {"k": 1, "speedup": None},
    }


def test_break_even_is_where_the_line_in_log2_load_crosses_one():
    be = verdict.break_even(best(c1=(3, 1.5), c4=(2, 1.1), c16=(1, 0.7)))
    # log2 load 2 + (1.1 - 1) / (1.1 - 0.7) x (4 - 2) = 2.5: 2 ** 2.5 = 5.66
    assert be == {
        "pays_at": [1, 4],
        "loses_at": [16],
        "last_paying_concurrency": 4,
        "first_losing_concurrency": 16,
        "break_even_concurrency": 5.7,
    }
    exactly_one = verdict.break_even(best(c2=(1, 1.0), c8=(1, 0.5)))
    assert exactly_one["break_even_concurrency"] == 2.0 and exactly_one["pays_at"] == [2]
    always = verdict.break_even(best(c1=(3, 1.5), c4=(3, 1.2)))
    assert always["loses_at"] == [] and always["break_even_concurrency"] is None
    assert always["first_losing_concurrency"] is None
    never = verdict.break_even(best(c1=(1, 0.9), c4=(1, 0.6)))
    assert never["pays_at"] == [] and never["last_paying_concurrency"] is None
    assert never["break_even_concurrency"] is None


# ---- the cost model ---------------------------------------------------------------------------------


def test_cost_model_recovers_a_known_step_cost_exactly():
    points = verdict.step_costs(sweep())
    assert len(points) == 9
    assert all(math.isclose(p["r"], known_r(p["c"], p["k"])) for p in points)
    model = verdict.cost_model(points)
    assert model["terms"] == ["1", "k", "log2c", "k*log2c"]
    assert model["coefficients"] == pytest.approx([A, B, D, E], abs=1e-6)
    assert all(p["fitted_r"] == p["r"] for p in model["points"])
    # every point left out of the fit is predicted exactly by the other eight
    assert len(model["held_out"]) == 9
    assert all(h["relative_error"] == 0.0 for h in model["held_out"])
    assert all(h["predicted_speedup"] == h["measured_speedup"] for h in model["held_out"])
    assert model["held_out_mean_abs_error"] == model["held_out_max_abs_error"] == 0.0


def test_cost_model_reports_its_error_on_each_point_left_out():
    factors = [1.06, 0.95, 1.02, 0.97, 1.04, 0.93, 1.05, 0.98, 1.01]
    noise = {(c, k): f for (c, k), f in zip([(c, k) for c in LOADS for k in KS], factors)}
    points = verdict.step_costs(sweep(noise=noise))
    model = verdict.cost_model(points)
    assert model["coefficients"] != pytest.approx([A, B, D, E], abs=1e-3)

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
        assert model["held_out"][i]["c"] == p["c"] and model["held_out"][i]["k"] == p["k"]
        assert model["held_out"][i]["relative_error"] == pytest.approx(errors[-1], abs=1e-4)
    assert model["held_out_mean_abs_error"] == pytest.approx(np.mean(np.abs(errors)), abs=1e-4)
    assert model["held_out_max_abs_error"] == pytest.approx(np.max(np.abs(errors)), abs=1e-4)
    assert 0.01 < model["held_out_mean_abs_error"] < 0.2


def test_a_point_the_fit_without_it_cannot_price_is_counted_not_infinite():
    """2 k x 2 loads: the fit left without one point can predict a step cost <= 0 there; that point
    gets no predicted speedup (None, counted in held_out_unpredicted), and the errors stay finite
    JSON numbers."""
    r = {(1, 1): 1.0, (1, 3): 1.2, (4, 1): 0.05, (4, 3): 3.0}
    levels = sweep(loads=[1, 4], ks=[1, 3], r=lambda c, k: r[(c, k)])
    model = verdict.cost_model(verdict.step_costs(levels))
    unpredicted = [h for h in model["held_out"] if h["predicted_speedup"] is None]
    assert unpredicted and model["held_out_unpredicted"] == len(unpredicted)
    assert all(h["relative_error"] is None for h in unpredicted)
    for key in ("held_out_mean_abs_error", "held_out_max_abs_error"):
        assert model[key] is None or math.isfinite(model[key])
    json.dumps({k: v for k, v in model.items() if k != "_coef"}, allow_nan=False)


def test_cost_model_terms_follow_what_the_sweep_varies():
    def terms(loads, ks):
        return verdict.model_terms(verdict.step_costs(sweep(loads, ks)))

    assert terms([1, 4, 16], [3]) == ["1", "log2c"]  # one k: no k slope
    assert terms([4], [1, 2, 3]) == ["1", "k"]  # one load: no load slope
    assert terms([1, 4], [1, 3]) == ["1", "k", "log2c"]  # four points: no product term
    assert terms([1, 4], [1]) == ["1"]  # two points: one left out leaves one
    one_load = verdict.cost_model(verdict.step_costs(sweep([4], [1, 2, 3])))
    assert one_load["coefficients"] == pytest.approx([A + 2 * D, B + 2 * E], abs=1e-6)
    assert one_load["held_out_mean_abs_error"] == 0.0
    assert verdict.cost_model(verdict.step_costs(sweep([4], [3]))) is None


def test_needs_is_the_acceptance_a_goal_takes_and_none_where_k_plus_one_cannot_reach_it():
    model = verdict.cost_model(verdict.step_costs(sweep()))
    # at 16 requests in flight r = 1.4 + 0.7 k: 1.0x needs tau = r, 1.5x needs 1.5 r > k + 1
    assert verdict.needs(model, 16, KS, [1.0, 1.5]) == {
        1.0: {1: None, 2: 2.8, 3: 3.5},  # k=1: 2.1 > 2 tokens a step
        1.5: {1: None, 2: None, 3: None},  # compute-bound: no draft pays off
    }
    assert verdict.needs(model, 1, [1], [1.0]) == {1.0: {1: 1.5}}


# ---- the decision -----------------------------------------------------------------------------------


def cfg(**overrides) -> BenchmarkConfig:
    return BenchmarkConfig(**{"k": KS, "concurrency": LOADS, "serve_concurrency": 4, **overrides})


def test_decide_at_the_serve_load_with_the_goals_met_reachable_and_out_of_reach():
    # speedups (tau / r): c1 1.2 / 1.25 / 1.24, c4 1.0 / 1.042 / 1.033, c16 0.857 / 0.893 / 0.886
    v = verdict.decide(sweep(), cfg(speedup_goals=[1.0, 1.2, 1.5]), "vllm", [])
    assert (v["serve_concurrency"], v["k"], v["pays_off"]) == (4, 2, True)
    assert v["speedup"] == round(2.5 / known_r(4, 2), 4) == 1.0417
    assert v["acceptance_length"] == 2.5 and v["baseline_tokens_per_s"] == 100.0
    assert {c: b["k"] for c, b in v["best_per_load"].items()} == {"1": 2, "4": 2, "16": 2}
    assert v["break_even"]["pays_at"] == [1, 4] and v["break_even"]["loses_at"] == [16]
    assert v["k_per_batch_size"] == [[1, 8, 2], [9, 16, 0]]
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
    assert words.startswith("the draft pays off: at 4 requests in flight (vllm), k=2 gives 1.04x.")
    assert "It pays at [1, 4] requests in flight and loses at [16]" in words
    be = v["break_even"]["break_even_concurrency"]
    assert f"serve without speculation above about {be:g} requests in flight" in words
    assert "1.0x" not in words  # met: nothing to say
    assert "1.2x needs an acceptance length of 2.88 at k=2 (measured 2.5); samples: no " in words
    assert (
        "No draft reaches 1.5x at this load with k <= 3: verifying costs more than k + 1 tokens "
        "a step can repay." in words
    )


def test_decide_forecasts_the_samples_at_the_k_the_points_were_measured_at():
    # acceptance 2.0 at 100 samples, 2.6 at 400, both at k=3: the log-linear curve
    points = [
        {"samples": 100, "acceptance_length": 2.0, "k": 3},
        {"samples": 400, "acceptance_length": 2.6, "k": 3},
    ]
    v = verdict.decide(sweep(), cfg(speedup_goals=[1.2]), "vllm", points)
    forecast = v["needs"]["1.2"]["forecast"]
    # at k=3 the goal needs 1.2 r(4, 3) = 3.6: 100 x 4 ** ((3.6 - 2.0) / 0.6) samples
    assert forecast["k"] == 3 and forecast["acceptance_length"] == 3.6
    assert forecast["fit"] == "log_linear" and forecast["measured_samples"] == [100, 400]
    assert forecast["samples"] == pytest.approx(100 * 4 ** (1.6 / 0.6), abs=2)
    assert f"about {forecast['samples']:,} training samples" in v["words"]
    one_run = verdict.decide(sweep(), cfg(speedup_goals=[1.2]), "vllm", points[:1])
    assert "two or more distinct `samples`" in one_run["needs"]["1.2"]["forecast"]["why_not"]


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
    assert v["pays_off"] is False and v["break_even"]["pays_at"] == []
    assert v["k_per_batch_size"] == [[1, 16, 0]]
    assert v["words"].startswith("the draft does not pay off: at 4 requests in flight")
    assert "It loses at every load measured." in v["words"]
    # engine hf measures 1 request in flight: its verdict is there, whatever serve_concurrency says
    hf = verdict.decide(sweep(loads=[1]), cfg(engine="hf"), "hf", [])
    assert hf["serve_concurrency"] == 1 and hf["k"] == 2 and "1 request in flight" in hf["note"]
    assert hf["cost_model"]["terms"] == ["1", "k"]
    assert hf["words"].startswith("the draft pays off: at 1 request in flight (hf), k=2 gives")


# ---- k per batch size -------------------------------------------------------------------------------


SCHEDULES = [
    # each load's range reaches half-way (in log2) to the next; the last ends at the largest load
    (best(c1=(3, 1.4), c4=(2, 1.1), c16=(1, 0.9)), [[1, 2, 3], [3, 8, 2], [9, 16, 0]]),
    (best(c1=(2, 1.3), c4=(2, 1.1), c16=(2, 1.05)), [[1, 16, 2]]),  # one k: one range
    (best(c1=(3, 1.2), c4=(1, 0.9), c16=(2, 0.8)), [[1, 2, 3], [3, 16, 0]]),  # losing: 0, merged
    (best(c1=(1, 1.2), c2=(2, 1.1), c3=(3, 1.0)), [[1, 1, 1], [2, 2, 2], [3, 3, 3]]),
    (best(c4=(2, 1.2), c32=(1, 1.1)), [[1, 11, 2], [12, 32, 1]]),  # the first range starts at 1
    (best(c8=(3, 1.5)), [[1, 8, 3]]),
]


@pytest.mark.parametrize("best_k, schedule", SCHEDULES)
def test_k_schedule_ranges_merges_and_zero_where_no_k_pays(best_k, schedule):
    assert verdict.k_schedule(best_k) == schedule


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
    for (best_k, _), lookup in zip(SCHEDULES, lookups):
        for c, b in best_k.items():
            assert lookup[c] == (b["k"] if b["speedup"] >= 1 else 0), (c, lookup)
    assert lookups[0][1:] == [3, 3, 2, 2, 2, 2, 2, 2] + [0] * 32  # 0 carried on past 16
    assert lookups[-1][1:9] == [2] * 8 and lookups[-1][9:] == [0] * 32


def test_the_passes_spread_says_which_ks_the_sweep_cannot_tell_apart():
    """With every pass's tokens/s, the best k carries its speedup range, and a k whose best pass
    reaches into that range is named as not told apart; the words say so."""
    levels = {
        4: {
            "baseline": {"output_tokens_per_s": 100.0, "runs_tokens_per_s": [95.0, 100.0, 105.0]},
            "speculative": {
                1: {
                    "output_tokens_per_s": 110.0,
                    "runs_tokens_per_s": [104.0, 110.0, 112.0],
                    "acceptance_length": 1.8,
                },
                2: {
                    "output_tokens_per_s": 120.0,
                    "runs_tokens_per_s": [118.0, 120.0, 125.0],
                    "acceptance_length": 2.6,
                },
                3: {
                    "output_tokens_per_s": 90.0,
                    "runs_tokens_per_s": [88.0, 90.0, 91.0],
                    "acceptance_length": 3.2,
                },
            },
        }
    }
    ranges = verdict.speedup_ranges(levels)
    assert ranges[4][2] == [round(118 / 105, 4), round(125 / 95, 4)]
    best = verdict.best_per_load(verdict.speedups(levels), ranges)[4]
    assert best["k"] == 2 and best["speedup_range"] == ranges[4][2]
    assert best["within_spread"] == [1]  # 112 / 95 = 1.18 >= 118 / 105 = 1.12; k=3 tops at 0.96
    v = verdict.decide(levels, cfg(serve_concurrency=4, concurrency=[4]), "vllm", [])
    assert "k=1 within that spread: the sweep does not tell them apart" in v["words"]
    # without passes (an older report): no range, nothing claimed
    for level in levels.values():
        level["baseline"].pop("runs_tokens_per_s")
    assert "speedup_range" not in verdict.best_per_load(verdict.speedups(levels), {})[4]


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
    assert "It pays at every load measured ([1, 4] requests in flight)" in v["words"]
    assert "(extrapolated past the loads measured)" in v["words"]
    loads = [1, 16, 256]
    inside = verdict.decide(
        sweep(loads=loads), cfg(concurrency=loads, serve_concurrency=1), "vllm", []
    )
    assert inside["break_even"]["model_estimate"]["extrapolated"] is False
