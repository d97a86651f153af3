"""Stage `tokenize`: regenerated conversations -> speculators Arrow layout + token frequencies
(draftline/tokens/tokenize.py).

    python -m stages.tokenize models/target/card.json datasets/prompts/train.jsonl \
        datasets/regenerated/conversations.jsonl datasets/tokenized reports/tokenize.json

The report goes to its last argument. More rows cut at tokenize.max_length than
tokenize.max_truncated_share fails the stage after the report is written (its `check` says how
many, and which max_length would do). The output persists across runs (dvc.yaml: persist); what a
rerun keeps is the library's, once resume.verify_sample of the kept conversations tokenized again
give their kept rows (the report's `spot_check`).
"""

import sys
from pathlib import Path

from draftline.core.config import ResumeConfig, stage_sections
from draftline.core.errors import entry_point
from draftline.core.threads import apply_thread_policy
from draftline.tokens.config import TokenizeConfig


@entry_point
def main(
    card_path: str, prompts_path: str, regenerated_path: str, out_dir: str, report_path: str
) -> None:
    # resume: how many kept conversations are tokenized again before their rows are trusted
    # (operational: dvc.yaml does not list it)
    params = stage_sections(tokenize=TokenizeConfig, resume=ResumeConfig)
    apply_thread_policy("tokenize")  # before torch loads: draftline/core/threads.py
    from draftline.core.io import write_json
    from draftline.tokens.report import truncation_error
    from draftline.tokens.tokenize import Paths, run

    paths = Paths(Path(card_path), Path(prompts_path), Path(regenerated_path), Path(out_dir))
    report = run(params, paths)
    write_json(report_path, report)
    print(
        f"tokenize: {report['conversations']} conversations -> {report['rows']} rows, {report['tokens']} tokens, "
        f"{report['trainable_fraction']:.1%} trainable, {report['truncated']} truncated, skipped {report['skipped']}"
    )
    ids = report["server_token_ids"]
    print(
        f"tokenize: {ids['retokenized_equal_server_ids']} of {ids['server_ids']} assistant turns with "
        f"the server's token ids re-tokenize to exactly them ({ids['no_server_ids']} turns without ids); "
        f"training on {ids['assistant_ids']} ids"
    )
    done = report["incremental"]
    print(
        f"tokenize: {done['rows_tokenized']} rows tokenized, {done['rows_kept']} kept and "
        f"{done['rows_copied']} copied from the previous output"
        + (
            f" (all tokenized: {done['all_tokenized_because']})"
            if done["all_tokenized_because"]
            else ""
        )
    )
    spot = report["spot_check"]
    print(
        f"tokenize: spot-check: {spot['checked']} kept conversations tokenized again gave their "
        f"{spot['rows']} kept rows"
        if spot["not_run"] is None
        else f"tokenize: spot-check not run: {spot['not_run']}"
    )
    if error := truncation_error(report):
        raise SystemExit(error)


if __name__ == "__main__":
    main(*sys.argv[1:])
