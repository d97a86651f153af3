"""Stage `regenerate`: every assistant turn answered again by the target, through a plain server.

    python -m stages.regenerate models/target/card.json datasets/prompts/train.jsonl datasets/regenerated reports/regenerate.json

Starts the server of `regenerate.backend` on the target (transformers serve on CPU by default;
vllm or sglang from params), or uses the `external` endpoints; checks each endpoint before the
first request (the card's target, not speculative); sends the prompts with an aiohttp client
(draftline/regenerate/client.py), per short/long partition concurrency; stops the server
(draftline/regenerate/run.py). Output datasets/regenerated/conversations.jsonl is append-only
and keyed by prompt id (persist: true in dvc.yaml), with its index beside it
(draftline/regenerate/index.py): a rerun after a crash, or after growing `samples`, sends only
the prompts not yet there; lines made with other settings move to superseded.jsonl beside it,
never deleted (`draftline conversations restore` brings them back). failures.jsonl
has one line per conversation that failed in the last run; the report counts everything. The
stage fails (its conversations kept) when too many prompts failed (regenerate.max_failure_rate)
or too many answers ended at max_tokens (regenerate.max_length_share).
"""

import signal
import sys
from pathlib import Path

from draftline.core.config import stage_sections
from draftline.core.errors import entry_point
from draftline.core.threads import apply_thread_policy
from draftline.regenerate.config import RegenerateConfig


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds like Ctrl-C: the server is stopped, files closed


@entry_point
def main(card_path: str, prompts_path: str, out_dir: str, report_path: str) -> None:
    params = stage_sections(regenerate=RegenerateConfig)
    apply_thread_policy("regenerate")  # before torch loads: draftline/core/threads.py
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    from draftline.core.io import write_json
    from draftline.regenerate.run import Paths, run

    result = run(params, Paths(Path(card_path), Path(prompts_path), Path(out_dir)))
    write_json(report_path, result.report)
    if result.error:
        raise SystemExit(result.error)


if __name__ == "__main__":
    main(*sys.argv[1:])
