"""Stage `hidden_states`: the target's aux + last hidden states of every tokenized row
(draftline/hidden_states/extract.py).

    python -m stages.hidden_states models/target/card.json datasets/tokenized datasets/hidden_states reports/hidden_states.json

The report goes to its last argument; backend vllm's server log beside it
(reports/hidden_states.vllm.log).
"""

import sys
from pathlib import Path

from draftline.core.config import ResumeConfig, stage_sections
from draftline.core.errors import entry_point
from draftline.core.threads import apply_thread_policy
from draftline.hidden_states.config import HiddenStatesConfig
from draftline.train.config import TrainConfig


@entry_point
def main(card_path: str, tokenized_dir: str, out_dir: str, report_path: str) -> None:
    # train: train.pack_len only sizes the online mode's forwards named when the disk is short
    # (a message; no output depends on it, so dvc.yaml does not list it)
    # resume: how many kept files are recomputed before they are trusted (operational)
    params = stage_sections(
        hidden_states=HiddenStatesConfig, train=TrainConfig, resume=ResumeConfig
    )
    apply_thread_policy("hidden_states")  # before torch loads: draftline/core/threads.py
    from draftline.core.io import write_json
    from draftline.core.machine import without_run_facts
    from draftline.hidden_states.extract import RUN_FACTS, Paths, run

    log = Path(report_path).with_suffix(".vllm.log")
    report = run(params, Paths(Path(card_path), Path(tokenized_dir), Path(out_dir), log))
    write_json(report_path, without_run_facts(report, RUN_FACTS, Path(report_path).name))


if __name__ == "__main__":
    main(*sys.argv[1:])
