"""Drafts compared prompt by prompt (draftline/evaluate/paired.py): the paired interval and the
smallest detectable gain checked against a per-prompt table recorded here, computed by hand with
scipy; each prompt's acceptance from its steps; the report and table compare writes. The stage
writing them: tests/evaluate/test_compare.py."""

import math

import pytest
from scipy import stats

from draftline.evaluate.context import Step
from draftline.evaluate.paired import (
    paired_gain,
    paired_report,
    paired_table,
    per_prompt_acceptance,
    prompts_needed,
    unpaired_bound,
)

# a recorded per-prompt table: acceptance length of this run's draft and of the draft it is
# compared with, on the same ten prompts
TABLE = {
    "p0": (2.91, 2.60),
    "p1": (3.40, 3.10),
    "p2": (1.85, 1.90),
    "p3": (2.50, 2.05),
    "p4": (3.05, 2.95),
    "p5": (2.20, 1.70),
    "p6": (3.60, 3.55),
    "p7": (2.75, 2.30),
    "p8": (1.95, 2.10),
    "p9": (3.10, 2.70),
}
CONFIDENCE = 0.9


def by_hand(table: dict, confidence: float) -> dict:
    """The paired t interval and the MDD at 80% power, from the per-prompt differences."""
    d = [ours - other for ours, other in table.values()]
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    t = stats.t.ppf(1 - (1 - confidence) / 2, n - 1)
    base = sum(other for _, other in table.values()) / n
    mdd = (t + stats.t.ppf(0.8, n - 1)) * sd / math.sqrt(n)
    need = next(
        m
        for m in range(2, 100_000)
        if (stats.t.ppf(1 - (1 - confidence) / 2, m - 1) + stats.t.ppf(0.8, m - 1))
        * sd
        / math.sqrt(m)
        <= 0.05 * base
    )
    return {
        "gain": mean,
        "low": mean - t * sd / math.sqrt(n),
        "high": mean + t * sd / math.sqrt(n),
        "sd": sd,
        "mdd": mdd,
        "relative": mdd / base,
        "need": need,
    }


def test_the_paired_interval_is_the_t_interval_over_the_recorded_prompts():
    ours = {p: a for p, (a, _) in TABLE.items()}
    other = {p: b for p, (_, b) in TABLE.items()}
    got = paired_gain(ours, other, CONFIDENCE)
    want = by_hand(TABLE, CONFIDENCE)
    assert got["prompts"] == 10
    assert got["gain"] == pytest.approx(want["gain"], abs=1e-4)
    assert (got["low"], got["high"]) == pytest.approx((want["low"], want["high"]), abs=1e-4)
    assert got["sd_difference"] == pytest.approx(want["sd"], abs=1e-4)
    assert got["mdd"] == pytest.approx(want["mdd"], abs=1e-4)
    assert got["mdd_relative"] == pytest.approx(want["relative"], abs=1e-4)
    assert got["prompts_for_5pct"] == want["need"]
    assert got["decision"] == ("gain" if want["low"] > 0 else "cannot tell")
    # the same table the other way round: the same interval, mirrored, and a loss
    back = paired_gain(other, ours, CONFIDENCE)
    assert (back["low"], back["high"]) == pytest.approx((-want["high"], -want["low"]), abs=1e-4)


def test_prompts_only_one_draft_measured_are_left_out_and_the_decision_follows_the_interval():
    ours = {"a": 2.0, "b": 3.0, "c": 2.5, "only_ours": 9.0}
    other = {"a": 2.0, "b": 3.1, "c": 2.4, "only_other": 1.0}
    got = paired_gain(ours, other, CONFIDENCE)
    assert got["prompts"] == 3 and got["decision"] == "cannot tell"
    clear = paired_gain({"a": 2.5, "b": 3.5, "c": 3.0}, {"a": 2.0, "b": 3.1, "c": 2.4}, 0.9)
    assert clear["decision"] == "gain" and clear["low"] > 0
    lone = paired_gain({"a": 2.5}, {"a": 2.0}, 0.9)
    assert lone["prompts"] == 1 and lone["low"] is None and lone["mdd"] is None


def test_prompts_needed_is_the_first_count_whose_mdd_reaches_the_gain():
    sd, gain = 0.4, 0.12
    n = prompts_needed(sd, gain, 0.9)

    def mdd(m):
        return (stats.t.ppf(0.95, m - 1) + stats.t.ppf(0.8, m - 1)) * sd / math.sqrt(m)

    assert mdd(n) <= gain < mdd(n - 1)
    assert prompts_needed(0.0, gain, 0.9) == 2 and prompts_needed(sd, 0.0, 0.9) is None


def test_the_unpaired_bound_takes_two_independent_drafts_of_this_spread():
    ours = {p: a for p, (a, _) in TABLE.items()}
    values = list(ours.values())
    n, mean = len(values), sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    bound = unpaired_bound(ours, CONFIDENCE)
    mdd = (stats.t.ppf(0.95, n - 1) + stats.t.ppf(0.8, n - 1)) * math.sqrt(2) * sd / math.sqrt(n)
    assert bound["mdd"] == pytest.approx(mdd, abs=1e-4)
    assert bound["mdd_relative"] == pytest.approx(mdd / mean, abs=1e-4)


def test_a_prompts_acceptance_pools_its_steps_and_a_rows_turns():
    steps = [
        Step("r1", 10, 3, 3),
        Step("r1", 13, 1, 1),
        Step("r2", 10, 4, 4),
        Step("r1#turn2", 30, 2, 2),
    ]
    assert per_prompt_acceptance(steps) == {"r1": 2.0, "r2": 4.0, "r1#turn2": 2.0}
    rows = {"r1": "r1", "r2": "r2", "r1#turn2": "r1"}
    assert per_prompt_acceptance(steps, rows.__getitem__) == {"r1": 2.0, "r2": 4.0}


def test_the_report_pairs_every_other_draft_and_bounds_a_set_without_one():
    ours = {p: a for p, (a, _) in TABLE.items()}
    other = {p: b for p, (_, b) in TABLE.items()}
    results = {
        "heldout": {"trained": {"per_prompt": ours}, "public": {"per_prompt": other}},
        "chat": {"trained": {"per_prompt": ours}},
        "by_vllm": {"trained": {"per_prompt": None}, "public": {"per_prompt": None}},
    }
    report = paired_report(results, "trained", CONFIDENCE)
    held = report["sets"]["heldout"]
    assert held["drafts"]["public"] == paired_gain(ours, other, CONFIDENCE)
    assert report["sets"]["chat"]["drafts"] == {}
    assert report["sets"]["chat"]["unpaired_bound"] == unpaired_bound(ours, CONFIDENCE)
    assert "vLLM" in report["sets"]["by_vllm"]["skipped"]
    table = paired_table(report)
    g = held["drafts"]["public"]
    assert (
        f"| heldout | public | 10 | {g['gain']:+.3f} | [{g['low']:+.3f}, {g['high']:+.3f}] |"
        in table
    )
    assert "| chat | (unpaired bound) | 10 |" in table
    assert "90% Student-t interval" in table and "80% power" in table
