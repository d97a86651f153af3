"""Stage `prepare`: one dataset of params.yaml -> normalized records + a drop report
(draftline/data/sources.py; record and report schemas: draftline/data/formats.py).

    python -m stages.prepare sharegpt_sample datasets/prepared/sharegpt_sample.jsonl reports/prepare/sharegpt_sample.json
    python -m stages.prepare --write-sources datasets/sources.yaml   # after adding/renaming a dataset

`--source-dep PATH` (what dvc.yaml passes) is checked against the dataset's source, so a stale
datasets/sources.yaml (see --write-sources and docs/datasets.md) fails instead of tracking the wrong
file. The report is written before the stage fails on more malformed rows than
datasets.<name>.max_drop_share.
"""

import sys
from pathlib import Path

from draftline.core.config import stage_sections
from draftline.core.errors import entry_point
from draftline.core.threads import apply_thread_policy
from draftline.data.config import DATASET_NAME, Datasets


@entry_point
def write_sources(path: str = "datasets/sources.yaml") -> None:
    from draftline.data.workspace import write_sources as write_sources_file

    params = stage_sections(datasets=Datasets)
    apply_thread_policy("prepare")  # before torch loads: draftline/core/threads.py
    print(f"{path}: source deps of {write_sources_file(params.datasets, path)} datasets")


@entry_point
def main(name: str, out_jsonl: str, report_json: str, *options: str) -> None:
    params = stage_sections(datasets=Datasets)
    if not DATASET_NAME.fullmatch(name):
        raise SystemExit(f"error: {name!r} is not a plain dataset name (letters, digits, _ and -)")
    apply_thread_policy("prepare")  # before torch loads: draftline/core/threads.py
    if name not in params.datasets:
        raise SystemExit(
            f"error: unknown dataset {name!r}; params.yaml datasets: {', '.join(sorted(params.datasets))}"
        )
    spec = params.datasets[name]
    if options and (len(options) != 2 or options[0] != "--source-dep"):
        raise SystemExit(
            f"error: unknown options {' '.join(options)}; usage: NAME OUT_JSONL REPORT_JSON [--source-dep PATH]"
        )
    from draftline.core.io import write_json
    from draftline.data.sources import Paths, drop_share_problem, run
    from draftline.data.workspace import inside_workspace, source_dep_problem

    if options and (problem := source_dep_problem(name, spec, options[1])):
        raise SystemExit(f"error: {problem}")
    try:
        out_path, report_path = inside_workspace(out_jsonl, report_json)
        report = run(params, Paths(name, Path(out_jsonl)))
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    write_json(report_json, report)
    if problem := drop_share_problem(name, spec, report):
        raise SystemExit(f"error: {problem}")
    dropped = ", ".join(f"{reason} {n}" for reason, n in report["dropped"].items()) or "none"
    print(
        f"prepare {name}: kept {report['rows_kept']}/{report['rows_read']} rows -> {out_path}; dropped: {dropped}; "
        f"report {report_path}"
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write-sources"]:
        write_sources(*sys.argv[2:3])
    else:
        main(*sys.argv[1:])
