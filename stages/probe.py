"""Stage `probe`: before regeneration spends anything, try what would otherwise fail after it.

    python -m stages.probe models/target/card.json reports/probe.json reports/probe_passed.txt

train.init (a local directory or a hub id) is checked against the target card as the train
stage will check it (hidden size, target vocabulary, decoder layers, aux layer ids, norms, draft
vocabulary), in seconds, without loading its weights. With a vLLM extraction path configured
(hidden_states.backend vllm, or mode online with train.backend speculators), one short prompt goes
through that path: the same server command and client as the stage that will use it, and its
states must come back at the card's aux layers with the target's hidden size. That costs one
start of the server, so a pass is recorded in reports/probe.json under a key of the card and the
settings that decide it and not repeated (hidden_states.vllm.probe: false skips it). A refusal
names what to change and leaves reports/probe_passed.txt as it was: regenerate depends on that
file, so `dvc repro` stops here. Its text is the same for every pass, so passing stales nothing.
"""

import sys
from pathlib import Path

from draftline.core.config import stage_sections
from draftline.core.threads import apply_thread_policy
from draftline.hidden_states.config import HiddenStatesConfig
from draftline.tokens.config import VocabConfig
from draftline.train.config import TrainConfig


def main(card_path: str, report_path: str, stamp_path: str) -> None:
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
