"""Stage `mix`: prepared datasets → the weighted, prefix-stable train split and a held-out eval split.

    python -m stages.mix datasets/prepared reports/prepare datasets/prompts reports/mix.json

Reads PREPARED_DIR/<name>.jsonl and PREPARE_REPORTS/<name>.json for every dataset in params.yaml
and writes OUT_DIR/train.jsonl, OUT_DIR/eval.jsonl (records of draftline/formats.py plus
"partition": short|long), OUT_DIR/meta.json and a report: rows per source and partition, caps,
cross-dataset duplicates, and every dataset's drop counts by reason. Uses `samples`, `seed` and
`mix.*`; the rule is in draftline/mixing.py.
"""

import json
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

from draftline.config import stage_params
from draftline.threads import apply_thread_policy


def light_rows(path: Path) -> list[dict]:
    """What mixing needs of each prepared record, plus the byte offset of its line (the full record
    is read back only if it is chosen)."""
    from draftline.formats import content_hash

    rows, offset = [], 0
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                rows.append({"id": record["id"], "source": record.get("source"), "offset": offset,
                             **({"source_detail": record["source_detail"]} if record.get("source_detail") else {}),
                             "prompt_tokens_est": record["prompt_tokens_est"],
                             "digest": content_hash(record["messages"], record["tools"])})
            offset += len(line)
    return rows


def full_records(rows: list[dict], paths: dict[str, Path]) -> Iterator[dict]:
    """The chosen light rows as full records, keeping the mixed id (it may have been renamed) and partition."""
    with ExitStack() as stack:
        files = {name: stack.enter_context(open(path, "rb")) for name, path in paths.items()}
        for row in rows:
            f = files[row["source"]]
            f.seek(row["offset"])
            yield {**json.loads(f.readline()), "id": row["id"], "partition": row["partition"]}


def main(prepared_dir: str, prepare_reports: str, out_dir: str, report_json: str) -> None:
    params = stage_params()
    apply_thread_policy("mix")  # before torch loads: draftline/threads.py
    from draftline.io import file_sha256, read_json, write_json, write_jsonl, write_meta
    from draftline.mixing import mix_datasets, shortfall_problems, shortfall_table

    pools, paths, inputs, prepared = {}, {}, {}, {}
    for name in sorted(params.datasets):
        path, report = Path(prepared_dir) / f"{name}.jsonl", Path(prepare_reports) / f"{name}.json"
        if not path.is_file() or not report.is_file():
            raise SystemExit(f"error: {path} or {report} not found; run `python -m stages.prepare {name} ...` first")
        pools[name], paths[name] = light_rows(path), path
        # A file from another dataset (renamed, stale) would silently mislabel the mix.
        if strays := sorted({row.get("source") for row in pools[name]} - {name}, key=str):
            raise SystemExit(f"error: {path} holds rows of source {strays}, expected only {name!r}")
        inputs[name] = file_sha256(path)
        stats = read_json(report)
        prepared[name] = {key: stats.get(key) for key in ("rows_read", "rows_kept", "dropped", "resolved_revision")}
    cfg = params.mix
    try:
        train, eval_rows, report = mix_datasets(pools, cfg.weights, params.samples, cfg.eval_samples,
                                                cfg.long_threshold_tokens, params.seed, cfg.caps)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    report["allow_shortfall"] = cfg.allow_shortfall
    if problems := shortfall_problems(report):
        numbers = (f"{'; '.join(problems)}.\n{shortfall_table(report)}\n"
                   f"(available: rows left after cross-dataset duplicates; eval takes {len(eval_rows)} of them first)")
        if not cfg.allow_shortfall:
            raise SystemExit(f"error: mix: {numbers}\nLower `samples` (at most {report['max_samples_at_weights']} "
                             "keeps the weights), add data or change mix.weights / mix.caps, or set "
                             "mix.allow_shortfall: true to train on the rows there are at the shares above.")
        print(f"mix: SHORTFALL accepted (mix.allow_shortfall: true): {numbers}", file=sys.stderr)
    reasons = sum((Counter(p["dropped"]) for p in prepared.values()), Counter())
    reasons["duplicate_across_datasets"] = report["duplicates_dropped"]["total"]
    report["prepare"] = prepared
    report["dropped_by_reason"] = dict(sorted((+reasons).items(), key=lambda kv: (-kv[1], kv[0])))
    out = Path(out_dir)
    write_jsonl(out / "train.jsonl", full_records(train, paths))
    write_jsonl(out / "eval.jsonl", full_records(eval_rows, paths))
    write_json(report_json, report)
    write_meta(out, "mix", {"samples": params.samples, "seed": params.seed, "mix": cfg.model_dump()},
               inputs=inputs, counts={"train": len(train), "eval": len(eval_rows)})
    print(f"mix: train {len(train)} {report['train']['by_source']}, eval {len(eval_rows)}; "
          f"duplicates dropped {report['duplicates_dropped']['total']}"
          + (f"; capped {report['capped']}" if report["capped"] else ""))


if __name__ == "__main__":
    main(*sys.argv[1:])
