"""Drafts compared prompt by prompt: the gain of this run's draft over each other draft measured on
the same prompts (draftline/evaluate/compare.py), with a Student-t interval paired over prompts, and
the smallest gain an eval set can detect.

Two drafts decoded on the same prompts err on the same hard prompts, so their difference is far
less noisy per prompt than either acceptance: the unit is the prompt (a row asked turn by turn is
one unit, its turns' steps pooled), its figure the acceptance length of its own steps (tokens per
verification step, a+1), and the gain is the mean over prompts of this run's draft's figure minus
the other's, every prompt counted once. (The table's acceptance lengths pool every step, so a
prompt with more steps weighs more there: the two means can differ slightly.)

The interval: mean d ± t_{1-α/2, n-1} · sd(d) / √n at evaluate.confidence = 1 - α. The smallest
detectable gain (minimum detectable difference) at 80% power:
    MDD = (t_{1-α/2, n-1} + t_{0.8, n-1}) · sd(d) / √n,
also relative to the other draft's acceptance, with the prompts a 5% gain would need at the same
spread. With no other draft measured, a set's detectable gain is bounded from the run's own draft:
two drafts with its per-prompt spread sd, independent, would give sd(d) = √2 · sd; drafts of one
recipe correlate positively over prompts, which makes sd(d), and the gain they can detect, smaller.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

from draftline.core.stats import t_quantile
from draftline.evaluate.context import Step

POWER = 0.8  # the chance a gain of MDD gives an interval clear of 0
TARGET_GAIN = 0.05  # the relative gain whose prompts the report counts
MAX_PROMPTS = 10**7  # past this many prompts a gain counts as out of reach


def per_prompt_acceptance(
    steps: Iterable[Step], unit: Callable[[str], str] | None = None
) -> dict[str, float]:
    """Each prompt's acceptance length (its steps' a+1 summed over their count), in the order the
    prompts were first met; `unit` maps a step's prompt id to its unit (a row's turns to the row)."""
    sums: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for step in steps:
        key = unit(step.prompt) if unit else step.prompt
        sums[key][0] += step.accepted
        sums[key][1] += 1
    return {key: round(a / n, 6) for key, (a, n) in sums.items() if n}


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, sd


def detectable(sd: float, n: int, confidence: float) -> float | None:
    """The smallest mean gain with POWER chance of an interval clear of 0 (MDD), at n prompts and
    a per-prompt spread sd of the difference; None below two prompts."""
    if n < 2:
        return None
    factor = t_quantile(0.5 + confidence / 2, n - 1) + t_quantile(POWER, n - 1)
    return factor * sd / math.sqrt(n)


def prompts_needed(sd: float, gain: float, confidence: float) -> int | None:
    """The fewest prompts whose MDD at spread sd is at most `gain` (at least 2); None beyond
    MAX_PROMPTS or for no gain to detect."""
    if gain <= 0:
        return None
    if sd == 0:
        return 2

    def enough(n: int) -> bool:
        return detectable(sd, n, confidence) <= gain

    if enough(2):
        return 2
    low, high = 2, 4
    while not enough(high):
        low, high = high, high * 2
        if high > MAX_PROMPTS:
            return None
    while high - low > 1:  # enough(high), not enough(low): MDD falls as n grows
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def detection(sd: float, n: int, base: float, confidence: float) -> dict:
    """MDD at n prompts and spread sd, relative to `base` (the acceptance it is a gain over), and
    the prompts a TARGET_GAIN gain over `base` would need."""
    mdd = detectable(sd, n, confidence)
    return {
        "mdd": _rounded(mdd),
        "mdd_relative": _rounded(None if mdd is None or not base else mdd / base),
        "prompts_for_5pct": prompts_needed(sd, TARGET_GAIN * base, confidence),
    }


def paired_gain(ours: dict[str, float], other: dict[str, float], confidence: float) -> dict:
    """This run's draft's gain over another, prompt by prompt over the prompts both measured: the
    mean, its interval, what it decides (gain / loss / cannot tell), the spread, and what the set
    can detect at it."""
    common = [p for p in ours if p in other]
    diffs = [ours[p] - other[p] for p in common]
    n = len(diffs)
    if not n:
        return {"prompts": 0, "gain": None, "low": None, "high": None, "decision": None}
    mean, sd = _mean_sd(diffs)
    base = sum(other[p] for p in common) / n
    low = high = None
    if n > 1:
        half = t_quantile(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)
        low, high = mean - half, mean + half
    decision = None if low is None else "gain" if low > 0 else "loss" if high < 0 else "cannot tell"
    return {
        "prompts": n,
        "gain": _rounded(mean),
        "low": _rounded(low),
        "high": _rounded(high),
        "decision": decision,
        "relative_gain": _rounded(mean / base if base else None),
        "other_acceptance": _rounded(base),
        "sd_difference": _rounded(sd),
        **detection(sd, n, base, confidence),
    }


def unpaired_bound(ours: dict[str, float], confidence: float) -> dict:
    """What a set can detect with no other draft measured: the run's draft's own per-prompt spread
    sd, as two independent drafts (sd of the difference √2 · sd), relative to its acceptance."""
    values = list(ours.values())
    if not values:
        return {"prompts": 0, "mdd": None, "mdd_relative": None, "prompts_for_5pct": None}
    mean, sd = _mean_sd(values)
    return {
        "prompts": len(values),
        "acceptance": _rounded(mean),
        "sd": _rounded(sd),
        **detection(math.sqrt(2) * sd, len(values), mean, confidence),
    }


def paired_report(results: dict, ours: str, confidence: float) -> dict:
    """Per set: the unpaired bound of this run's draft `ours`, and its paired gain over every other
    draft; {set: {draft: figures}} as compare gives it, each figures' `per_prompt`. A set whose
    figures hold no per-prompt acceptance (vLLM's counters are per run) is skipped, saying so."""
    sets = {}
    for name, drafts in results.items():
        mine = (drafts.get(ours) or {}).get("per_prompt")
        if not mine:
            sets[name] = {
                "skipped": "no per-prompt acceptance: vLLM counts per run, not per prompt"
            }
            continue
        sets[name] = {
            "unpaired_bound": unpaired_bound(mine, confidence),
            "drafts": {
                draft: paired_gain(mine, figures.get("per_prompt") or {}, confidence)
                for draft, figures in drafts.items()
                if draft != ours
            },
        }
    return {
        "confidence": confidence,
        "power": POWER,
        "target_gain": TARGET_GAIN,
        "draft": ours,
        "sets": sets,
    }


def _pct(value: float | None) -> str:
    return "" if value is None else f"{value:.1%}"


def paired_table(paired: dict) -> str:
    """The paired report as markdown: each set's gain over each other draft with its interval and
    decision, and the smallest gain it detects; a set with no other draft, its unpaired bound."""
    lines = [
        f"Gain of this run's draft ({paired['draft']}) over each other draft, paired over prompts "
        f"(mean per prompt, {paired['confidence']:.0%} Student-t interval); detectable: the smallest "
        f"gain the set detects at {paired['power']:.0%} power (relative to the other draft); "
        f"prompts for {paired['target_gain']:.0%}: what a {paired['target_gain']:.0%} gain would "
        "need at the same spread. Without another draft, the bound from this draft's own spread "
        "(two independent drafts).",
        "",
        "| set | vs | prompts | gain | interval | decision | detectable | prompts for 5% |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in paired["sets"].items():
        if "skipped" in entry:
            lines.append(f"| {name} | | | | | {entry['skipped']} | | |")
            continue
        for draft, g in entry["drafts"].items():
            interval = "" if g["low"] is None else f"[{g['low']:+.3f}, {g['high']:+.3f}]"
            gain = "" if g["gain"] is None else f"{g['gain']:+.3f}"
            mdd = "" if g.get("mdd") is None else f"{g['mdd']:.3f} ({_pct(g['mdd_relative'])})"
            lines.append(
                f"| {name} | {draft} | {g['prompts']} | {gain} | {interval} | "
                f"{g['decision'] or ''} | {mdd} | {g.get('prompts_for_5pct') or ''} |"
            )
        if not entry["drafts"]:
            b = entry["unpaired_bound"]
            mdd = "" if b["mdd"] is None else f"{b['mdd']:.3f} ({_pct(b['mdd_relative'])})"
            lines.append(
                f"| {name} | (unpaired bound) | {b['prompts']} | | | | {mdd} | "
                f"{b['prompts_for_5pct'] or ''} |"
            )
    return "\n".join(lines) + "\n"
