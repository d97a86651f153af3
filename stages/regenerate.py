"""Stage `regenerate`: every assistant turn answered again by the target, through a plain server.

    python -m stages.regenerate models/target/card.json datasets/prompts/train.jsonl datasets/regenerated reports/regenerate.json

The stage file reads the `regenerate` section, sets the thread policy before torch loads, makes
SIGTERM unwind like Ctrl-C (the server is stopped, files closed), runs the phase
(draftline/regenerate/run.py: the server of `regenerate.backend`, `hf` by default, started and
stopped around the run, or the `external` endpoints) and writes its report; it fails, the
conversations kept, with the phase's error (too many failures, or answers that mostly ended at
max_tokens).
"""

import signal
import sys
from pathlib import Path

from draftline.core.config import ResumeConfig, stage_sections
from draftline.core.errors import entry_point
from draftline.core.threads import apply_thread_policy
from draftline.regenerate.config import RegenerateConfig


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds like Ctrl-C: the server is stopped, files closed


@entry_point
def main(card_path: str, prompts_path: str, out_dir: str, report_path: str) -> None:
    params = stage_sections(regenerate=RegenerateConfig, resume=ResumeConfig)
    apply_thread_policy("regenerate")  # before torch loads: draftline/core/threads.py
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    from draftline.core.io import write_json
    from draftline.core.machine import without_run_facts
    from draftline.regenerate.run import RUN_FACTS, Paths, run

    result = run(params, Paths(Path(card_path), Path(prompts_path), Path(out_dir)))
    write_json(report_path, without_run_facts(result.report, RUN_FACTS, Path(report_path).name))
    if result.error:
        raise SystemExit(result.error)


if __name__ == "__main__":
    main(*sys.argv[1:])
