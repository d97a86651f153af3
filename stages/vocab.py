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
from pathlib import Path

from draftline.core.config import stage_sections
from draftline.core.threads import apply_thread_policy
from draftline.tokens.config import VocabConfig


def main(card_path: str, freq_path: str, out_dir: str, report_path: str) -> None:
    params = stage_sections(vocab=VocabConfig)
    apply_thread_policy("vocab")  # before torch loads: draftline/core/threads.py
    from draftline.core.io import write_json
    from draftline.tokens.vocab import Paths, VocabSizeError, coverage_error, run

    try:
        report = run(params, Paths(Path(card_path), Path(freq_path), Path(out_dir)))
    except VocabSizeError as err:
        raise SystemExit(f"error: {err}") from None
    write_json(report_path, report)
    print(
        f"vocab: {params.vocab.draft_vocab_size} draft tokens cover {report['coverage']:.2%} of trainable tokens "
        f"({report['distinct_trainable_tokens']} distinct)"
    )
    if error := coverage_error(report):
        raise SystemExit(error)


if __name__ == "__main__":
    main(*sys.argv[1:])
