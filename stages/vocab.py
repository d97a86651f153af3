"""Stage `vocab`: the draft vocabulary, the most frequent trainable target tokens.

    python -m stages.vocab models/target/card.json datasets/tokenized/token_freq.pt models/vocab reports/vocab.json

Writes d2t.npy (offsets: target id = i + d2t[i]) and t2d.npy (bool mask over the target vocab),
speculators' conventions and file names.
"""

import sys
from pathlib import Path

from draftline.config import stage_params


def main(card_path: str, freq_path: str, out_dir: str, report_path: str) -> None:
    params = stage_params()
    cfg = params.vocab
    import numpy as np
    import torch
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    from draftline.io import read_json, write_json, write_meta

    card = read_json(card_path)
    if cfg.draft_vocab_size > card["vocab_size"]:
        raise SystemExit(
            f"error: vocab.draft_vocab_size ({cfg.draft_vocab_size}) is larger than the target "
            f"vocabulary ({card['vocab_size']}); it must be at most that"
        )
    freq = torch.load(freq_path, weights_only=True)
    d2t, t2d = build_vocab_mappings_from_distribution(freq, cfg.draft_vocab_size, card["vocab_size"])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "d2t.npy", d2t.numpy())
    np.save(out / "t2d.npy", t2d.numpy())
    total = sum(freq.values())
    covered = sum(c for tid, c in freq.items() if t2d[tid])
    report = {
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_vocab_size": card["vocab_size"],
        "distinct_trainable_tokens": len(freq),
        "trainable_tokens": total,
        "coverage": round(covered / total, 6) if total else 0.0,
    }
    write_json(report_path, report)
    write_meta(out, "vocab", cfg.model_dump())
    print(f"vocab: {cfg.draft_vocab_size} draft tokens cover {report['coverage']:.2%} of trainable tokens")


if __name__ == "__main__":
    main(*sys.argv[1:])
