"""Stage `hidden_states`: capture the target's aux + last hidden states for every tokenized row.

    python -m stages.hidden_states models/target/card.json datasets/tokenized datasets/hidden_states reports/hidden_states.json

Backend `hf` runs the target here (CPU, one GPU, or several with `device_map`); backend `vllm`
launches `vllm serve` for extraction and hands the rows to speculators' `generate-offline-data`.
`format: fp8` stores hs-connectors' FP8 layout (vLLM: its FP8 connector). `mode: online` stores
nothing: meta.json tells the train stage to make the states itself, the report gives the estimate.
Resumable (persist: true in dvc.yaml): valid files are kept, missing, truncated or corrupt ones
(re)done, so growing `samples` extracts only the new rows. Prints the disk estimate and refuses to
start when free space is below it x `disk_margin`.
"""

import sys
from pathlib import Path

from draftline.core.config import stage_sections
from draftline.core.threads import apply_thread_policy
from draftline.hidden_states.config import HiddenStatesConfig
from draftline.train.config import TrainConfig


def main(card_path: str, tokenized_dir: str, out_dir: str, report_path: str) -> None:
    params = stage_sections(hidden_states=HiddenStatesConfig, train=TrainConfig)
    apply_thread_policy("hidden_states")  # before torch loads: draftline/core/threads.py
    from draftline.core.io import write_json
    from draftline.hidden_states.extract import Paths, run

    log = Path(report_path).with_suffix(".vllm.log")
    report = run(params, Paths(Path(card_path), Path(tokenized_dir), Path(out_dir), log))
    write_json(report_path, report)


if __name__ == "__main__":
    main(*sys.argv[1:])
