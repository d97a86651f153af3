"""devtools/benchmark_power.py: the bootstrap over recorded rounds decides each simulated run by the
benchmark's own rule, so a schedule far from every margin holds at the smallest budget, one near
the margins holds more often as the budget grows, and the spread per second of measuring does not
depend on the pass length when the noise is white."""

import json
import math
import random

import pytest

from devtools.benchmark_power import Budget, main, power, rounds_of, rule_of, spread

LOADS = (1, 4, 16)


def detail(speedups: dict, rounds: int, sd: float, pass_s: float = 1.0, seed: int = 0) -> dict:
    """A one-group side-by-side benchmark.detail.json: each round's baseline pass at 100 tokens/s
    times round noise, each k's pass that pass times its speedup and its own noise (log sd `sd`:
    the spread of its paired log ratio)."""
    rng = random.Random(seed)
    levels = {}
    for c in LOADS:
        base = [100 * math.exp(rng.gauss(0, sd)) for _ in range(rounds)]
        level = {"baseline": {"runs_tokens_per_s": base}}
        for k, s in speedups[c].items():
            level[f"k{k}"] = {
                "runs_tokens_per_s": [b * s * math.exp(rng.gauss(0, sd)) for b in base]
            }
        levels[f"c{c}"] = level
    return {
        "ks": [1, 2, 3],
        "concurrency": list(LOADS),
        "levels": levels,
        "verdict": {
            "confidence": 0.9,
            "k_margin": 0.05,
            "margin": 0.05,
            "family": {"loads": 3, "ks": 3, "statements_per_look": 24},
            "design": {
                "layout": "side_by_side",
                "groups": [["k1", "k2", "k3"]],
                "rounds": rounds,
                "pass_s_median": pass_s,
                "stops": [{"seconds": 20.0 * rounds}],
            },
        },
    }


def test_a_schedule_far_from_every_margin_holds_at_the_smallest_budget():
    clear = {c: {1: 1.2, 2: 1.5, 3: 1.51} for c in LOADS}  # k2 beats k1 by 25%; k3 ties k2
    d = detail(clear, 12, 0.01)
    pool = rounds_of(d)
    out = power(pool, lambda looks: rule_of(d, looks), Budget(12), 50, 0)
    assert out["modal_schedule"] == [[1, 16, 2], [17, 1024, 0]]
    assert out["p_modal"] == 1.0 and out["p_four_of_five"] == 1.0
    assert out["looks_at"] == [8, 12]


def test_a_schedule_near_the_margins_holds_more_often_with_more_rounds():
    near = {
        1: {1: 1.2, 2: 1.32, 3: 1.34},
        4: {1: 1.1, 2: 1.2, 3: 1.22},
        16: {1: 1.08, 2: 1.09, 3: 1.1},
    }
    d = detail(near, 60, 0.1)
    pool = rounds_of(d)
    small = power(pool, lambda looks: rule_of(d, looks), Budget(12), 150, 0)
    large = power(pool, lambda looks: rule_of(d, looks), Budget(96, look_every=24), 150, 0)
    assert small["p_modal"] < 0.8 and small["distinct_schedules"] > 2
    assert large["p_modal"] > small["p_modal"]
    assert large["looks_at"] == [8, 32, 56, 80, 96]
    assert sum(large["stopped_at"].values()) == 150


def test_the_rule_counts_the_family_as_the_run_did():
    d = detail({c: {1: 1.1, 2: 1.2, 3: 1.3} for c in LOADS}, 4, 0.05)
    rule = rule_of(d, 2)
    assert rule.extra == 24 - 3 * (3 + 3) and rule.statements == 24 and rule.family == 48


def test_white_noise_gives_the_same_spread_per_second_at_any_pass_length():
    speed = {c: {1: 1.1, 2: 1.2, 3: 1.3} for c in LOADS}
    one = spread(detail(speed, 400, 0.1, pass_s=1.0, seed=1))
    three = spread(detail(speed, 400, 0.1 / math.sqrt(3), pass_s=3.0, seed=2))
    assert one["pooled_sd_log"] == pytest.approx(0.1, rel=0.1)
    assert three["pooled_sd_log"] == pytest.approx(0.1 / math.sqrt(3), rel=0.1)
    assert three["sd_log_per_second"] == pytest.approx(one["sd_log_per_second"], rel=0.15)


def test_grouped_runs_are_refused(tmp_path):
    d = detail({c: {1: 1.1, 2: 1.2, 3: 1.3} for c in LOADS}, 4, 0.05)
    d["verdict"]["design"]["groups"] = [["k1", "k2"], ["k3"]]
    path = tmp_path / "grouped.json"
    path.write_text(json.dumps(d))
    with pytest.raises(SystemExit, match="one-group side_by_side"):
        main([f"g={path}", "--out", str(tmp_path / "p.json")])


def test_the_report_names_the_smallest_budget_that_holds(tmp_path):
    runs = []
    for i in range(2):
        path = tmp_path / f"r{i}.json"
        path.write_text(
            json.dumps(detail({c: {1: 1.2, 2: 1.5, 3: 1.51} for c in LOADS}, 12, 0.01, seed=i))
        )
        runs.append(f"r{i}={path}")
    out = tmp_path / "power.json"
    main([*runs, "--budgets", "12", "24", "--simulated", "20", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["pool_rounds"] == 24 and report["round_s"] == 20.0
    assert report["smallest_budget_four_of_five"] == 12
    assert report["budgets"]["24"]["minutes_of_rounds"] == 8.0
