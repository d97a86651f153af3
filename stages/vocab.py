"""Stage `vocab`: the draft vocabulary, the most frequent trainable target tokens.

    python -m stages.vocab models/target/card.json datasets/tokenized/token_freq.pt models/vocab reports/vocab.json

Built by speculators' build_vocab_mappings_from_distribution, in its conventions and file names:
d2t.npy, int64 [draft_vocab_size], offsets (target id = i + d2t[i], ids ascending); t2d.npy, bool
[target_vocab_size], True for the target ids the draft can emit. Frequencies count trainable
(loss-masked) tokens only. The report says which share of trainable tokens the draft covers.
"""

import sys
from pathlib import Path

from draftline.card import TargetCard
from draftline.config import stage_params
from draftline.threads import apply_thread_policy


def check_sizes(draft_vocab_size: int, target_vocab_size: int, freq: dict[int, int]) -> None:
    if draft_vocab_size > target_vocab_size:
        raise ValueError(
            f"vocab.draft_vocab_size ({draft_vocab_size}) is larger than the target vocabulary "
            f"({target_vocab_size}); it must be at most that"
        )
    outside = [t for t in freq if not 0 <= t < target_vocab_size]
    if outside:
        raise ValueError(f"token frequencies name ids outside the target vocabulary ({target_vocab_size}): {sorted(outside)[:5]}")


def coverage_report(freq: dict[int, int], t2d, draft_vocab_size: int, target_vocab_size: int) -> dict:
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


def main(card_path: str, freq_path: str, out_dir: str, report_path: str) -> None:
    params = stage_params()
    apply_thread_policy("vocab")  # before torch loads: draftline/threads.py
    cfg = params.vocab
    import numpy as np
    import torch
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    from draftline.io import read_json, write_json, write_meta

    card = TargetCard.load(card_path)
    freq = torch.load(freq_path, weights_only=True)
    try:
        check_sizes(cfg.draft_vocab_size, card["vocab_size"], freq)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    d2t, t2d = build_vocab_mappings_from_distribution(freq, cfg.draft_vocab_size, card["vocab_size"])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "d2t.npy", d2t.numpy())
    np.save(out / "t2d.npy", t2d.numpy())
    report = coverage_report(freq, t2d, cfg.draft_vocab_size, card["vocab_size"])
    write_json(report_path, report)
    write_meta(out, "vocab", cfg.model_dump())
    print(f"vocab: {cfg.draft_vocab_size} draft tokens cover {report['coverage']:.2%} of trainable tokens "
          f"({report['distinct_trainable_tokens']} distinct)")


if __name__ == "__main__":
    main(*sys.argv[1:])
