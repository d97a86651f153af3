"""Stage `vocab`: the draft vocabulary, the most frequent trainable target tokens.

    python -m stages.vocab models/target/card.json datasets/tokenized/token_freq.pt models/vocab reports/vocab.json

Built by speculators' build_vocab_mappings_from_distribution, in its conventions and file names:
d2t.npy, int64 [draft_vocab_size], offsets (target id = i + d2t[i], ids ascending); t2d.npy, bool
[target_vocab_size], True for the target ids the draft can emit. Frequencies count trainable
(loss-masked) tokens only. The report says which share of trainable tokens the draft covers
(draftline/tokens/vocab.py); below vocab.min_coverage the stage fails after writing it, naming
vocab.draft_vocab_size and the size that would reach the threshold.
"""

import sys

from draftline.core.card import TargetCard
from draftline.core.config import output_shaping, stage_sections
from draftline.core.threads import apply_thread_policy
from draftline.tokens.config import VocabConfig


def main(card_path: str, freq_path: str, out_dir: str, report_path: str) -> None:
    params = stage_sections(vocab=VocabConfig)
    apply_thread_policy("vocab")  # before torch loads: draftline/core/threads.py
    cfg = params.vocab
    from draftline.core.io import write_json, write_meta
    from draftline.tokens.vocab import VocabSizeError, build_draft_vocab, coverage_error

    card = TargetCard.load(card_path)
    try:
        report = build_draft_vocab(
            freq_path, cfg.draft_vocab_size, card.vocab_size, out_dir, cfg.min_coverage
        )
    except VocabSizeError as err:
        raise SystemExit(f"error: {err}") from None
    write_json(report_path, report)
    # the threshold is operational: it decides whether the stage passes, not what it writes
    write_meta(out_dir, "vocab", output_shaping(cfg))
    print(
        f"vocab: {cfg.draft_vocab_size} draft tokens cover {report['coverage']:.2%} of trainable tokens "
        f"({report['distinct_trainable_tokens']} distinct)"
    )
    if error := coverage_error(report):
        raise SystemExit(error)


if __name__ == "__main__":
    main(*sys.argv[1:])
