"""Stage `prepare`: one dataset of params.yaml → normalized records + a drop report.

    python -m stages.prepare sharegpt_sample datasets/prepared/sharegpt_sample.jsonl reports/prepare/sharegpt_sample.json
    python -m stages.prepare --write-sources datasets/sources.yaml   # after adding/renaming a dataset

Reads `datasets.<NAME>` (a preset, a local .jsonl/.json/.parquet file or dataset directory, or a
hub dataset id; format, split, config name, revision, streaming, field mapping, filters). Rows are
streamed: read, converted, filtered and written one at a time. Rows that cannot be used are dropped
and counted by reason; a dataset with no usable row fails and leaves no output. Record and report
schemas: draftline/formats.py.

`--source-dep PATH` (what dvc.yaml passes) is checked against the dataset's source, so a stale
datasets/sources.yaml (see --write-sources and docs/datasets.md) fails instead of tracking the wrong file.
"""

import sys
from pathlib import Path

from draftline.config import DATASET_NAME, stage_params
from draftline.threads import apply_thread_policy

SOURCES_HEADER = """\
# Generated from params.yaml by `python -m stages.prepare --write-sources datasets/sources.yaml`; do not edit.
# dvc.yaml loads it as vars, which merge into `datasets`: each prepare@<name> stage depends on
# ${item.source_dep}, the local source file or directory. A hub dataset id is no file, so its stage
# depends on stages/prepare.py (already a dep) instead; its hub id, config, split and revision are
# the params key datasets.<name>, and the report records the commit the id resolved to.
"""


def write_sources(path: str = "datasets/sources.yaml") -> None:
    import yaml

    from draftline.formats import dvc_source_dep
    from draftline.io import atomic_path

    params = stage_params()
    apply_thread_policy("prepare")  # before torch loads: draftline/threads.py
    deps = {name: {"source_dep": dvc_source_dep(spec.path)} for name, spec in sorted(params.datasets.items())}
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        f.write(SOURCES_HEADER + yaml.safe_dump({"datasets": deps}, sort_keys=True))
    print(f"{path}: source deps of {len(deps)} datasets")


def inside_workspace(*paths: str) -> list[Path]:
    """The paths resolved (symlinks, `..`); SystemExit naming any that lands outside the current
    directory, the workspace DVC runs the stage in."""
    root, resolved = Path.cwd().resolve(), [Path(p).resolve() for p in paths]
    if outside := [str(p) for p in resolved if root != p and root not in p.parents]:
        raise SystemExit(f"error: outputs outside the workspace {root}: {', '.join(outside)}")
    return resolved


def main(name: str, out_jsonl: str, report_json: str, *options: str) -> None:
    params = stage_params()
    if not DATASET_NAME.fullmatch(name):
        raise SystemExit(f"error: {name!r} is not a plain dataset name (letters, digits, _ and -)")
    apply_thread_policy("prepare")  # before torch loads: draftline/threads.py
    if name not in params.datasets:
        raise SystemExit(f"error: unknown dataset {name!r}; params.yaml datasets: {', '.join(sorted(params.datasets))}")
    spec = params.datasets[name]
    if options and (len(options) != 2 or options[0] != "--source-dep"):
        raise SystemExit(f"error: unknown options {' '.join(options)}; usage: NAME OUT_JSONL REPORT_JSON [--source-dep PATH]")
    from rich.progress import Progress

    from draftline.formats import PrepareStats, dvc_source_dep, hub_revision, is_local, spec_records
    from draftline.io import write_json, write_jsonl

    if options and options[1] != dvc_source_dep(spec.path):
        raise SystemExit(f"error: dvc.yaml makes prepare@{name} depend on {options[1]!r}, but its source is "
                         f"{spec.path!r}: datasets/sources.yaml is stale; run "
                         "`python -m stages.prepare --write-sources datasets/sources.yaml`")
    out_path, report_path = inside_workspace(out_jsonl, report_json)
    stats = PrepareStats()
    try:
        with Progress(transient=True) as progress:
            task = progress.add_task(f"prepare {name}", total=spec.max_rows)
            records = spec_records(spec, name, stats)
            write_jsonl(out_jsonl, (progress.update(task, completed=stats.rows_read) or r for r in records))
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    write_json(report_json, {  # what made it (the resolved spec, the hub commit), then what came of it
        "dataset": name, **spec.model_dump(),
        "resolved_revision": None if is_local(spec.path) else hub_revision(spec.path, spec.name, spec.revision),
        **stats.as_dict(),
    })
    dropped = ", ".join(f"{reason} {n}" for reason, n in stats.as_dict()["dropped"].items()) or "none"
    print(f"prepare {name}: kept {stats.rows_kept}/{stats.rows_read} rows -> {out_path}; dropped: {dropped}; "
          f"report {report_path}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write-sources"]:
        write_sources(*sys.argv[2:3])
    else:
        main(*sys.argv[1:])
