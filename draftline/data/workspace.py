"""The DVC workspace a stage runs in: datasets/sources.yaml (each dataset's source dep for its
`prepare@<name>` stage), and the checks that params and stage paths fit the workspace (sources.yaml
in step with `datasets`, local dataset files there, outputs inside the workspace, train.init
outside the draft a train run replaces and readable)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from draftline.core.io import atomic_path
from draftline.data.sources import missing_source_problem, source_dep
from draftline.draft.init_checks import local_init_problem

if TYPE_CHECKING:
    from draftline.data.config import DatasetSpec

WRITE_SOURCES = "python -m stages.prepare --write-sources datasets/sources.yaml"
SOURCES_HEADER = f"""\
# Generated from params.yaml by `{WRITE_SOURCES}`; do not edit.
# dvc.yaml loads it as vars, which merge into `datasets`: each prepare@<name> stage depends on
# ${{item.source_dep}}, the local source file or directory. A hub dataset id is no file, so its stage
# depends on its code fingerprint, reports/code/prepare.json (already a dep), instead; its hub id, config, split and revision are
# the params key datasets.<name>, and the report records the commit the id resolved to.
"""


def write_sources(datasets: dict[str, DatasetSpec], path: str) -> int:
    """Write the sources file of `datasets` to `path`; the number of datasets it lists."""
    import yaml

    deps = {name: {"source_dep": source_dep(spec)} for name, spec in sorted(datasets.items())}
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        f.write(SOURCES_HEADER + yaml.safe_dump({"datasets": deps}, sort_keys=True))
    return len(deps)


def source_dep_problem(name: str, spec: DatasetSpec, dep: str) -> str | None:
    """Why the source dep dvc.yaml passes to prepare@<name> is not the dataset's, or None."""
    if dep == source_dep(spec):
        return None
    return (
        f"dvc.yaml makes prepare@{name} depend on {dep!r}, but its source is "
        f"{source_name(spec)!r}: datasets/sources.yaml is stale; run `{WRITE_SOURCES}`"
    )


def source_name(spec: DatasetSpec) -> str:
    """A dataset's source as the user wrote it: its path, or `builtin:<name>`."""
    return spec.path if spec.builtin is None else f"builtin:{spec.builtin}"


def sources_problems(datasets: dict[str, DatasetSpec], sources_path: Path) -> list[str]:
    """What is out of step between `datasets` and the sources file (one line each); [] when none."""
    import yaml

    fix = f"run `{WRITE_SOURCES}`"
    try:
        listed = (yaml.safe_load(sources_path.read_text()) or {}).get("datasets") or {}
    except (OSError, yaml.YAMLError, AttributeError) as err:
        return [f"{sources_path}: unreadable ({err}); {fix}"]
    problems = []
    if missing := sorted(set(datasets) - set(listed)):
        problems.append(f"{sources_path} lacks datasets {missing}; {fix}")
    if extra := sorted(set(listed) - set(datasets)):
        problems.append(
            f"{sources_path} still lists datasets {extra} that params.yaml no longer has; {fix}"
        )
    for name in sorted(set(datasets) & set(listed)):
        want, have = source_dep(datasets[name]), (listed[name] or {}).get("source_dep")
        if want != have:
            problems.append(
                f"datasets.{name}: its source is {source_name(datasets[name])!r} but {sources_path} makes "
                f"prepare@{name} depend on {have!r}; {fix}"
            )
    return problems


def dataset_file_problems(datasets: dict[str, DatasetSpec]) -> list[str]:
    """The local dataset files that are not there, one line each naming datasets.<name>.path (DVC
    would stop at prepare@<name> naming the file only). A file DVC tracks (a .dvc file beside it
    or beside a folder above it) is left to `dvc pull` / `dvc repro --pull` to fetch."""
    problems = []
    for name, spec in sorted(datasets.items()):
        if spec.builtin is not None:
            continue  # generated: no file
        path = Path(spec.path)
        if any(p.with_name(p.name + ".dvc").is_file() for p in (path, *path.parents) if p.name):
            continue
        if problem := missing_source_problem(name, spec):
            problems.append(problem)
    return problems


def init_problem(init: str | None, draft_dir: Path) -> str | None:
    """Why train.init cannot be used (it lies inside the draft output a train run replaces), or None."""
    if init is None:
        return None
    init_path, out = Path(init).resolve(), draft_dir.resolve()
    if init_path == out or out in init_path.parents:
        return (
            f"train.init: {init} is the train stage's own output, which a train run replaces; copy a "
            "previous draft elsewhere (e.g. models/init/) and point to it"
        )
    if Path(init).is_dir():  # a local checkpoint: its config and weight headers read now
        return local_init_problem(init)  # named as the user wrote it
    return None


def params_problems(
    datasets: dict[str, DatasetSpec], init: str | None, sources_path: Path, draft_dir: Path
) -> list[str]:
    """Every way a valid params.yaml (its `datasets` and train.init) does not fit the workspace
    (check_params); [] when it fits. It takes those, not the whole Params: params.py builds on
    this package's sections."""
    problems = sources_problems(datasets, sources_path)
    problems += dataset_file_problems(datasets)
    if problem := init_problem(init, draft_dir):
        problems.append(problem)
    return problems


def inside_workspace(*paths: str) -> list[Path]:
    """The paths resolved (symlinks, `..`); ValueError naming any that lands outside the current
    directory, the workspace DVC runs the stage in."""
    root, resolved = Path.cwd().resolve(), [Path(p).resolve() for p in paths]
    if outside := [str(p) for p in resolved if root != p and root not in p.parents]:
        raise ValueError(f"outputs outside the workspace {root}: {', '.join(outside)}")
    return resolved
