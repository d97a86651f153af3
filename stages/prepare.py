"""Stage `prepare`: one dataset of params.yaml → normalized records + a drop report.

    python -m stages.prepare sharegpt_sample datasets/prepared/sharegpt_sample.jsonl reports/prepare/sharegpt_sample.json

Reads `datasets.<NAME>` (a local .jsonl/.json/.parquet file or a hub dataset id, its format,
split, config name, revision, max_rows). Rows that cannot be used are dropped and counted by
reason; a dataset with no usable row fails. Record and report schemas: draftline/formats.py.
"""

import sys
from itertools import islice

from draftline.config import stage_params


def main(name: str, out_jsonl: str, report_json: str) -> None:
    params = stage_params()
    if name not in params.datasets:
        raise SystemExit(f"error: unknown dataset {name!r}; params.yaml datasets: {', '.join(sorted(params.datasets))}")
    spec = params.datasets[name]
    from rich.progress import track

    from draftline.formats import prepare_records, read_rows
    from draftline.io import write_json, write_jsonl

    try:
        rows = read_rows(spec.path, spec.split, spec.name, spec.revision)
        rows = islice(rows, spec.max_rows)  # max_rows=None reads everything
        records, stats = prepare_records(track(rows, description=f"prepare {name}"), name, spec.format)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    write_jsonl(out_jsonl, records)
    write_json(report_json, {"dataset": name, "path": spec.path, "format": spec.format, **stats})
    dropped = ", ".join(f"{reason} {n}" for reason, n in stats["dropped"].items()) or "none"
    print(f"prepare {name}: kept {stats['rows_kept']}/{stats['rows_read']} rows; dropped: {dropped}")


if __name__ == "__main__":
    main(*sys.argv[1:])
