"""The draft vocabulary: the most frequent trainable target tokens, and how much of the data it covers.

In speculators' conventions and file names, built as its build_vocab_mappings_from_distribution
builds them (tests/tokens/test_vocab.py holds the two equal; importing that function would load
speculators' whole package, transformers' model stack included):
d2t.npy, int64 [draft_vocab_size], offsets (target id = i + d2t[i], ids ascending); t2d.npy, bool
[target_vocab_size], True for the target ids the draft can emit. Frequencies count trainable
(loss-masked) tokens only.

A vocabulary that covers too little of the trainable tokens fails the stage (vocab.min_coverage):
the draft can never propose the tokens it lacks, so every hour of extraction and training after
it would buy a draft capped below what its size allows (256 tokens of a 160k vocabulary).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from draftline.core.card import TargetCard
from draftline.core.config import output_shaping
from draftline.core.errors import DraftlineError
from draftline.core.io import write_meta


class VocabSizeError(DraftlineError, ValueError):
    """The draft vocabulary does not fit the target's (too large, or frequencies of ids outside it)."""


def check_sizes(draft_vocab_size: int, target_vocab_size: int, freq: dict[int, int]) -> None:
    if draft_vocab_size > target_vocab_size:
        raise VocabSizeError(
            f"error: vocab.draft_vocab_size ({draft_vocab_size}) is larger than the target vocabulary "
            f"({target_vocab_size}); it must be at most that"
        )
    outside = [t for t in freq if not 0 <= t < target_vocab_size]
    if outside:
        raise VocabSizeError(
            f"error: token frequencies name ids outside the target vocabulary ({target_vocab_size}): {sorted(outside)[:5]}"
        )


def coverage_report(
    freq: dict[int, int], t2d, draft_vocab_size: int, target_vocab_size: int
) -> dict:
    total = sum(freq.values())
    covered = sum(c for tid, c in freq.items() if t2d[tid])
    return {
        "draft_vocab_size": draft_vocab_size,
        "target_vocab_size": target_vocab_size,
        "distinct_trainable_tokens": len(freq),
        "trainable_tokens": total,
        # share of trainable tokens the draft can emit: its ceiling on per-token acceptance
        "coverage": round(covered / total, 6) if total else 0.0,
        "uncovered_distinct_tokens": sum(1 for tid in freq if not t2d[tid]),
        # draft slots no trainable token filled (speculators fills them with the lowest unused ids)
        "unseen_tokens_in_draft": max(0, draft_vocab_size - len(freq)),
    }


def vocab_mappings(freq: dict[int, int], draft_vocab_size: int, target_vocab_size: int):
    """(d2t, t2d) numpy arrays: the `draft_vocab_size` most frequent ids (ties to the lower id),
    topped up with the lowest unused ids when fewer were seen, in ascending order."""
    import numpy as np

    ranked = sorted(freq, key=lambda tid: (-freq[tid], tid))[:draft_vocab_size]
    chosen = set(ranked)
    spare = (tid for tid in range(draft_vocab_size) if tid not in chosen)
    ids = sorted(ranked + [next(spare) for _ in range(draft_vocab_size - len(ranked))])
    d2t = np.asarray(ids, dtype=np.int64) - np.arange(draft_vocab_size, dtype=np.int64)
    t2d = np.zeros(target_vocab_size, dtype=bool)
    t2d[ids] = True
    return d2t, t2d


def build_draft_vocab(
    freq_path: str,
    draft_vocab_size: int,
    target_vocab_size: int,
    out_dir: str,
    min_coverage: float = 0.0,
) -> dict:
    """d2t.npy and t2d.npy of the `draft_vocab_size` most frequent tokens of token_freq.pt, written
    to `out_dir`; the coverage report with its check against `min_coverage` (coverage_error says
    whether the stage fails). VocabSizeError when the sizes do not fit."""
    # numpy / torch load on first use: importing this module stays light
    import numpy as np
    import torch

    freq = torch.load(freq_path, weights_only=True)
    check_sizes(draft_vocab_size, target_vocab_size, freq)
    d2t, t2d = vocab_mappings(freq, draft_vocab_size, target_vocab_size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "d2t.npy", d2t)
    np.save(out / "t2d.npy", t2d)
    report = coverage_report(freq, t2d, draft_vocab_size, target_vocab_size)
    return {**report, "check": coverage_check(report, freq, min_coverage)}


def size_for_coverage(freq: dict[int, int], share: float) -> int:
    """The smallest draft vocabulary (most frequent tokens first) that covers `share` of `freq`."""
    total, covered = sum(freq.values()), 0
    for n, count in enumerate(sorted(freq.values(), reverse=True), 1):
        covered += count
        if covered >= share * total:
            return n
    return len(freq)


def coverage_check(report: dict, freq: dict[int, int], min_coverage: float) -> dict:
    """reports/vocab.json's `check`: the coverage measured against vocab.min_coverage, and the
    draft vocabulary size that would reach it."""
    passed = report["coverage"] >= min_coverage
    return {
        "param": "vocab.min_coverage",
        "coverage": report["coverage"],
        "threshold": min_coverage,
        "verdict": "pass" if passed else "fail",
        "size_for_threshold": size_for_coverage(freq, min_coverage),
    }


def coverage_error(report: dict) -> str | None:
    """The stage's error when the draft vocabulary covers less than vocab.min_coverage."""
    check = report["check"]
    if check["verdict"] != "fail":
        return None
    return (
        f"error: the {report['draft_vocab_size']}-token draft vocabulary covers "
        f"{report['coverage']:.1%} of the {report['trainable_tokens']} trainable tokens "
        f"({report['distinct_trainable_tokens']} distinct), below vocab.min_coverage "
        f"{check['threshold']}: the draft could never propose the other {1 - report['coverage']:.1%}. "
        f"Raise vocab.draft_vocab_size (the {check['size_for_threshold']} most frequent tokens "
        f"reach {check['threshold']:.0%}), or lower vocab.min_coverage (0 turns the check off)."
    )


class Paths(NamedTuple):
    card: Path  # models/target/card.json
    freq: Path  # datasets/tokenized/token_freq.pt
    out: Path  # models/vocab: d2t.npy, t2d.npy, meta.json


def run(params, paths: Paths) -> dict:
    """Stage `vocab`: the draft vocabulary of params.vocab written to paths.out, with meta.json;
    the coverage report (coverage_error says whether it fails). VocabSizeError for a size that
    cannot be built."""
    cfg = params.vocab
    card = TargetCard.load(paths.card)
    report = build_draft_vocab(
        str(paths.freq), cfg.draft_vocab_size, card.vocab_size, str(paths.out), cfg.min_coverage
    )
    # the threshold is operational: it decides whether the stage passes, not what it writes
    write_meta(str(paths.out), "vocab", output_shaping(cfg))
    return report
