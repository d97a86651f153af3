"""The benchmark's lossless gate: at temperature 0 a speculative server must give the baseline's
greedy output, request for request.

Each speculative output is judged against the baseline's reference output of its prompt (token ids
where the server sends them, else the text): "identical"; "near_tie" where they first differ at a
token the baseline ranked within tie_tolerance of its own choice (its top logprobs; logprob gaps are
logit gaps), the rule draftline/evaluate/acceptance.py applies to 16-bit targets; else "mismatch".
The stage fails above benchmark.max_output_mismatch_share, after writing its report.
"""

from __future__ import annotations

from draftline.core.errors import DraftlineError

VERDICTS = ("identical", "near_tie", "mismatch")


class LosslessError(DraftlineError, RuntimeError):
    """The lossless gate cannot pass: speculative outputs differed from the baseline's beyond
    benchmark.max_output_mismatch_share, or the baseline gave no reference to judge them by."""


def check_gate(gate: dict, report_path: str) -> None:
    """Raises LosslessError when the gate (see `gate`) did not pass; report_path holds the detail."""
    if gate["passed"]:
        return
    raise LosslessError(
        f"error: benchmark: {gate['mismatch']} of {gate['compared_outputs']} speculative "
        f"outputs ({gate['mismatch_share']:.1%}) differ from the baseline's greedy output, "
        f"not at a near-tie (<= {gate['tie_tolerance']}): above "
        f"benchmark.max_output_mismatch_share {gate['max_output_mismatch_share']} "
        f"({'; '.join(gate['mismatches_at'][:4])}). The draft is served wrongly (method, "
        f"aux layers, vocabulary) or the engine is not lossless here; {report_path} has the detail"
    )


def references(results, prompts: int) -> dict:
    """prompt index -> the baseline's first answered reference request of it."""
    refs = {}
    for r in results or []:
        if r.ok and r.prompt_index not in refs:
            refs[r.prompt_index] = r
    missing = sorted(set(range(prompts)) - set(refs))
    if missing:
        raise LosslessError(
            f"error: benchmark: the baseline answered no reference request for prompts {missing[:5]}: the lossless "
            "gate has nothing to compare them to"
        )
    return refs


def judge(result, ref, tie_tolerance: float) -> str:
    """One speculative output against its prompt's reference: a VERDICTS entry."""
    if result.token_ids and ref.token_ids:
        ours, theirs = result.token_ids, ref.token_ids
    else:
        ours, theirs = result.text, ref.text
    if ours == theirs:
        return "identical"
    if not (result.token_ids and ref.token_ids):
        return "mismatch"  # text alone cannot tell a near-tie
    first = next(
        (i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs))
    )
    if first >= min(len(ours), len(theirs), len(ref.top_logprobs)):
        return "mismatch"  # one stopped before the other, or no logprobs there
    top = ref.top_logprobs[first]
    chosen, greedy = ours[first], theirs[first]
    if chosen in top and greedy in top and top[greedy] - top[chosen] <= tie_tolerance:
        return "near_tie"
    return "mismatch"


def judge_all(results, refs: dict, tie_tolerance: float) -> list[str]:
    """The verdict of every answered request (failed ones are counted by the load summary)."""
    return [judge(r, refs[r.prompt_index], tie_tolerance) for r in results if r.ok]


def tally(verdicts: list[str]) -> dict[str, int]:
    return {v: verdicts.count(v) for v in VERDICTS}


def gate(
    verdicts_by_load: dict[int, dict[int, list[str]]],
    max_mismatch_share: float,
    tie_tolerance: float,
) -> dict:
    """The gate's figures over every speculative output of every k and load ({c: {k: verdicts}},
    each Level's `verdicts`); `passed` False above max_mismatch_share."""
    counts = dict.fromkeys(VERDICTS, 0)
    where = []
    for c, by_k in verdicts_by_load.items():
        for k, verdicts in by_k.items():
            for name, n in tally(verdicts).items():
                counts[name] += n
            if "mismatch" in verdicts:
                where.append(f"c{c} k={k}: {verdicts.count('mismatch')} of {len(verdicts)}")
    compared = sum(counts.values())
    share = round(counts["mismatch"] / compared, 4) if compared else 0.0
    return {
        "compared_outputs": compared,
        **counts,
        "identical_output_share": round(counts["identical"] / compared, 4) if compared else None,
        "lossless_share": round(1 - share, 4),
        "mismatch_share": share,
        "max_output_mismatch_share": max_mismatch_share,
        "tie_tolerance": tie_tolerance,
        "mismatches_at": where,
        "passed": share <= max_mismatch_share,
    }
