"""The draft vocabulary: the most frequent trainable target tokens, and how much of the data it covers.

Built by speculators' build_vocab_mappings_from_distribution, in its conventions and file names:
d2t.npy, int64 [draft_vocab_size], offsets (target id = i + d2t[i], ids ascending); t2d.npy, bool
[target_vocab_size], True for the target ids the draft can emit. Frequencies count trainable
(loss-masked) tokens only.
"""

from __future__ import annotations

from pathlib import Path


class VocabSizeError(ValueError):
    """The draft vocabulary does not fit the target's (too large, or frequencies of ids outside it)."""


def check_sizes(draft_vocab_size: int, target_vocab_size: int, freq: dict[int, int]) -> None:
    if draft_vocab_size > target_vocab_size:
        raise VocabSizeError(
            f"vocab.draft_vocab_size ({draft_vocab_size}) is larger than the target vocabulary "
            f"({target_vocab_size}); it must be at most that"
        )
    outside = [t for t in freq if not 0 <= t < target_vocab_size]
    if outside:
        raise VocabSizeError(
            f"token frequencies name ids outside the target vocabulary ({target_vocab_size}): {sorted(outside)[:5]}"
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


def build_draft_vocab(
    freq_path: str, draft_vocab_size: int, target_vocab_size: int, out_dir: str
) -> dict:
    """d2t.npy and t2d.npy of the `draft_vocab_size` most frequent tokens of token_freq.pt, written
    to `out_dir`; the coverage report. VocabSizeError when the sizes do not fit."""
    import numpy as np
    import torch
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    freq = torch.load(freq_path, weights_only=True)
    check_sizes(draft_vocab_size, target_vocab_size, freq)
    d2t, t2d = build_vocab_mappings_from_distribution(freq, draft_vocab_size, target_vocab_size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "d2t.npy", d2t.numpy())
    np.save(out / "t2d.npy", t2d.numpy())
    return coverage_report(freq, t2d, draft_vocab_size, target_vocab_size)
