"""Stage `vocab`: the draft vocabulary, the most frequent trainable target tokens
(draftline/tokens/vocab.py).

    python -m stages.vocab models/target/card.json datasets/tokenized/token_freq.pt models/vocab reports/vocab.json

Writes models/vocab (d2t.npy, t2d.npy, meta.json) and the report (which share of the trainable
tokens the draft covers) to reports/vocab.json; below vocab.min_coverage the stage fails after writing
it, naming vocab.draft_vocab_size and the size that would reach the threshold.
"""

import sys
from pathlib import Path

from draftline.core.config import stage_sections
from draftline.core.errors import entry_point
from draftline.core.threads import apply_thread_policy
from draftline.tokens.config import VocabConfig


@entry_point
def main(card_path: str, freq_path: str, out_dir: str, report_path: str) -> None:
    params = stage_sections(vocab=VocabConfig)
    apply_thread_policy("vocab")  # before torch loads: draftline/core/threads.py
    from draftline.core.io import write_json
    from draftline.tokens.vocab import Paths, coverage_error, run

    report = run(params, Paths(Path(card_path), Path(freq_path), Path(out_dir)))
    write_json(report_path, report)
    print(
        f"vocab: {params.vocab.draft_vocab_size} draft tokens cover {report['coverage']:.2%} of trainable tokens "
        f"({report['distinct_trainable_tokens']} distinct)"
    )
    if error := coverage_error(report):
        raise SystemExit(error)


if __name__ == "__main__":
    main(*sys.argv[1:])
