"""Stage `check_params`: params.yaml validated before DVC runs, and deletes the outputs of, any stage.

    python -m stages.check_params datasets/sources.yaml models/draft reports/params_check.txt

DVC deletes a stage's non-persist outputs before it runs the stage's command, and a stage with a
persist output (train) skips the run cache, so a check inside a stage comes too late: a typo in
`train` would cost `models/draft`. Every other stage depends on this stage's output, so `dvc
repro` (and `dvc exp run`) runs it first whenever params.yaml or the validation code changed: a
bad key stops the run here, in about a second, naming it, before any output is touched. The output
is the same text for every valid params.yaml, so passing never makes another stage stale: a typo
and then its fix reruns only this stage.

Checks: every section (draftline/config.py: unknown keys, bad values, plain dataset names, aux
layer ids against the target's layer count when it is known offline, credentials in URLs, ports);
datasets/sources.yaml in step with `datasets` (the prepare@<name> deps in dvc.yaml); train.init not
inside the draft output that a train run replaces.
"""

import sys
from pathlib import Path

from draftline.config import stage_params
from draftline.threads import apply_thread_policy

STAMP = "params.yaml is valid: checked by stages/check_params.py before any other stage runs.\n"


def sources_problems(datasets: dict, sources_path: Path) -> list[str]:
    import yaml

    from draftline.formats import dvc_source_dep

    fix = "run `python -m stages.prepare --write-sources datasets/sources.yaml`"
    try:
        listed = (yaml.safe_load(sources_path.read_text()) or {}).get("datasets") or {}
    except (OSError, yaml.YAMLError, AttributeError) as err:
        return [f"{sources_path}: unreadable ({err}); {fix}"]
    problems = []
    if missing := sorted(set(datasets) - set(listed)):
        problems.append(f"{sources_path} lacks datasets {missing}; {fix}")
    if extra := sorted(set(listed) - set(datasets)):
        problems.append(f"{sources_path} still lists datasets {extra} that params.yaml no longer has; {fix}")
    for name in sorted(set(datasets) & set(listed)):
        want, have = dvc_source_dep(datasets[name].path), (listed[name] or {}).get("source_dep")
        if want != have:
            problems.append(f"datasets.{name}: its source is {datasets[name].path!r} but {sources_path} makes "
                            f"prepare@{name} depend on {have!r}; {fix}")
    return problems


def init_problem(init: str | None, draft_dir: Path) -> str | None:
    if init is None:
        return None
    init_path, out = Path(init).resolve(), draft_dir.resolve()
    if init_path == out or out in init_path.parents:
        return (f"train.init: {init} is the train stage's own output, which a train run replaces; copy a "
                "previous draft elsewhere (e.g. models/init/) and point to it")
    return None


def main(sources_yaml: str, draft_dir: str, out_path: str) -> None:
    params = stage_params()  # every section; exits 2 naming each bad key
    apply_thread_policy("check_params")  # as every stage does (draftline/threads.py); torch is never loaded here
    problems = sources_problems(params.datasets, Path(sources_yaml))
    if problem := init_problem(params.train.init, Path(draft_dir)):
        problems.append(problem)
    if problems:
        raise SystemExit("error: " + "\n  ".join(["params.yaml does not fit the workspace:", *problems]))
    out = Path(out_path)
    if not out.exists() or out.read_text() != STAMP:  # same bytes for every valid params.yaml
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(STAMP)
    print(f"check_params: params.yaml is valid ({len(params.datasets)} datasets)")


if __name__ == "__main__":
    main(*sys.argv[1:])
