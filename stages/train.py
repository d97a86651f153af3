"""Stage `train`: the draft of train.method trained by params.train, from scratch or fine-tuned
(draftline/train/run.py).

    python -m stages.train models/target/card.json models/vocab datasets/tokenized \
        datasets/hidden_states models/draft reports/train.json models/draft_checkpoints

Small CPU variant: `dvc exp run -S train.epochs=1 -S train.pack_len=1024`.

Writes models/draft/ (speculators format, which vLLM serves with the speculative method its
drafter names, e.g. "method": "eagle3" for EAGLE-3, plus meta.json); reports/train.json (the kept
epoch's val_tau_sim and val_loss; the whole report in reports/train.detail.json);
reports/train/, dvclive's per-epoch curves (`dvc plots show`) and, with backend speculators, the
command it ran (command.txt); and models/draft_checkpoints/, the resume state (only
last_run.json once a run finishes). models/draft and
models/draft_checkpoints are `persist: true` outputs: DVC neither deletes them before a run nor
loses them when one dies, so a killed `dvc repro` continues from the last saved step and the last
draft stays until its successor replaces it.
"""

import argparse
import sys
from pathlib import Path

from draftline.core.config import stage_sections
from draftline.core.errors import entry_point
from draftline.core.threads import apply_thread_policy
from draftline.train.config import TrainConfig
from draftline.train.paths import Paths


def refuse_own_output_as_init(init: str | None, out_dir: Path) -> None:
    if init is None:
        return
    init_path, out = Path(init).resolve(), out_dir.resolve()
    if init_path == out or out in init_path.parents:
        raise SystemExit(
            f"error: train.init: {init} is this stage's own output, which a train run replaces; "
            "copy a previous draft elsewhere (e.g. models/init/) and point to it"
        )


def parse_paths(argv: list[str]) -> Paths:
    parser = argparse.ArgumentParser(prog="python -m stages.train", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    for name in ("card", "vocab", "tokenized", "hs", "out", "report"):
        parser.add_argument(name, type=Path)
    parser.add_argument("state", type=Path, nargs="?", default=Path("models/draft_checkpoints"))
    return Paths(**vars(parser.parse_args(argv)))


@entry_point
def main(*argv: str) -> None:
    paths = parse_paths(list(argv))
    params = stage_sections(train=TrainConfig)
    apply_thread_policy("train")  # before torch loads: draftline/core/threads.py
    refuse_own_output_as_init(params.train.init, paths.out)
    from draftline.core.io import write_metrics
    from draftline.draft.init_checks import InitMismatch
    from draftline.train.data import DataMismatch
    from draftline.train.resume import finish_state
    from draftline.train.run import run

    try:
        done = run(params, paths)
    except (InitMismatch, DataMismatch) as err:
        raise SystemExit(f"error: {err}") from None
    # step_seconds: a figure of this run only, kept in its record, out of the hashed report
    # (draftline/core/machine.py)
    write_metrics(paths.report, done.report, ["val_tau_sim", "val_loss"], ["step_seconds"])
    if done.last_run is not None:
        finish_state(paths.state, done.last_run)


if __name__ == "__main__":
    main(*sys.argv[1:])
