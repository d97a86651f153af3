"""Stage `mix`: the prepared datasets -> the train, eval and dev prompts and the eval sets
(draftline/data/mixing.py).

    python -m stages.mix datasets/prepared reports/prepare datasets/prompts reports/mix.json

Reads PREPARED_DIR/<name>.jsonl and PREPARE_REPORTS/<name>.json of every dataset; writes
OUT_DIR/train.jsonl, eval.jsonl, dev.jsonl, sets/<name>.jsonl and meta.json, and the report to its
last argument. A shortfall that mix.allow_shortfall accepts is said on stderr.
"""

import sys
from pathlib import Path

from draftline.core.config import stage_sections
from draftline.core.errors import entry_point
from draftline.core.threads import apply_thread_policy
from draftline.data.config import Datasets, MixConfig
from draftline.evaluate.config import EvaluateConfig


@entry_point
def main(prepared_dir: str, prepare_reports: str, out_dir: str, report_json: str) -> None:
    # evaluate: its eval sets (evaluate.sets), held out of train like the eval split
    params = stage_sections(
        samples=int, seed=(int, 0), datasets=Datasets, mix=MixConfig, evaluate=EvaluateConfig
    )
    apply_thread_policy("mix")  # before torch loads: draftline/core/threads.py
    from draftline.core.io import write_json
    from draftline.data.mixing import Paths, run

    try:
        mixed = run(params, Paths(Path(prepared_dir), Path(prepare_reports), Path(out_dir)))
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    if mixed.shortfall:
        print(
            f"mix: SHORTFALL accepted (mix.allow_shortfall: true): {mixed.shortfall}",
            file=sys.stderr,
        )
    report = mixed.report
    write_json(report_json, report)
    print(
        f"mix: train {len(mixed.train)} {report['train']['by_source']}, eval {len(mixed.eval)}, "
        f"dev {len(mixed.dev)}, eval sets { ({n: len(r) for n, r in mixed.sets.items()}) }; "
        "twins of them kept out of train "
        f"{sum(report['holdout']['train_rows_skipped'].values())}; "
        f"duplicates dropped {report['duplicates_dropped']['total']}"
        + (f"; capped {report['capped']}" if report["capped"] else "")
        + (
            f"; rows carrying a piece of {', '.join(report['holdout']['pieces']['sets'])} kept "
            f"out of train {report['holdout']['pieces']['train_rows_skipped']}"
            if "pieces" in report["holdout"]
            else ""
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
