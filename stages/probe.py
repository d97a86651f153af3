"""Stage `probe`: before regeneration spends anything, try what would otherwise fail after it
(train.init against the card, one row through the configured vLLM extraction path:
draftline/probe/checks.py).

    python -m stages.probe models/target/card.json reports/probe.json reports/probe_passed.txt

A refusal exits with the report's error after reports/probe.json is written, and leaves
reports/probe_passed.txt as it was: regenerate depends on that file, so `dvc repro` stops here.
"""

import sys
from pathlib import Path

from draftline.core.config import stage_sections
from draftline.core.errors import entry_point
from draftline.core.threads import apply_thread_policy
from draftline.hidden_states.config import HiddenStatesConfig
from draftline.tokens.config import VocabConfig
from draftline.train.config import TrainConfig


@entry_point
def main(card_path: str, report_path: str, stamp_path: str) -> None:
    # train: the probe checks train.init as the train stage will load it, and train.backend
    # decides whether the online mode asks a vLLM server
    params = stage_sections(train=TrainConfig, vocab=VocabConfig, hidden_states=HiddenStatesConfig)
    apply_thread_policy("probe")  # before torch loads: draftline/core/threads.py
    from draftline.probe.checks import Paths, run

    report = run(params, Paths(Path(card_path), Path(report_path), Path(stamp_path)))
    if report["error"]:
        raise SystemExit(f"error: {report['error']}")
    extraction = report["extraction"]
    print(
        f"probe: train.init {'fits' if report['init'] else 'not set'}; vLLM extraction "
        + (
            f"({extraction['path']}) passed"
            if extraction.get("passed")
            else f"not probed: {extraction['why']}"
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
