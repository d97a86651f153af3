"""Stage `check_params`: params.yaml validated before DVC runs, and deletes the outputs of, any
stage (draftline/params.py: every section; draftline/data/workspace.py: what must fit the workspace).

    python -m stages.check_params datasets/sources.yaml models/draft reports/params_check.txt

A stage of its own because DVC deletes a stage's non-persist outputs before it runs the stage's
command, and a stage with a persist output (train) skips the run cache, so a check inside a stage
comes too late: a typo in `train` would cost `models/draft`. Every other stage depends on this
stage's output, so `dvc repro` (and `dvc exp run`) runs it first whenever params.yaml or the
validation code changed. The output is the same text for every valid params.yaml, so passing never
makes another stage stale: a typo and then its fix reruns only this stage.
"""

import sys
from pathlib import Path

from draftline.core.errors import entry_point
from draftline.core.threads import apply_thread_policy
from draftline.params import load_params

STAMP = "params.yaml is valid: checked by stages/check_params.py before any other stage runs.\n"


@entry_point
def main(sources_yaml: str, draft_dir: str, out_path: str) -> None:
    params = load_params()  # every section; a ParamsError names each bad key
    # as every stage does (draftline/core/threads.py); torch is never loaded here
    apply_thread_policy("check_params")
    from draftline.data.workspace import params_problems

    if problems := params_problems(
        params.datasets, params.train.init, Path(sources_yaml), Path(draft_dir)
    ):
        raise SystemExit(
            "error: " + "\n  ".join(["params.yaml does not fit the workspace:", *problems])
        )
    out = Path(out_path)
    if not out.exists() or out.read_text() != STAMP:  # same bytes for every valid params.yaml
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(STAMP)
    print(f"check_params: params.yaml is valid ({len(params.datasets)} datasets)")


if __name__ == "__main__":
    main(*sys.argv[1:])
