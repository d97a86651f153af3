"""Stage `train`: the EAGLE-3 draft (speculators' Eagle3DraftModel), from scratch or fine-tuned.

    python -m stages.train models/target/card.json models/vocab datasets/tokenized \
        datasets/hidden_states models/draft reports/train.json models/draft_checkpoints

Small CPU variant: `dvc exp run -S train.epochs=1 -S train.pack_len=1024`.

models/draft is a persist output too: it is replaced only once a run has trained its successor.
backend builtin: our loop on CPU (float32) or one GPU (bf16 autocast). Its resume state lives in
models/draft_checkpoints/, a `persist: true` output: DVC neither deletes it before a run nor
loses it when a run dies, so a killed `dvc repro` continues from the last saved step. A finished
run leaves only last_run.json there. backend speculators: runs `torchrun -m speculators.train`
(command in reports/train/command.txt) with its checkpoints in models/draft_checkpoints/speculators
(speculators resumes from them itself), then keeps the epoch with the best validation tau_sim.

Writes models/draft/ in speculators format (loads with Eagle3DraftModel.from_pretrained; vLLM serves
it with "method": "eagle3") plus meta.json; per-epoch loss, per-position accuracy and tau_sim go
to dvclive (reports/train/, see `dvc plots show`). The kept weights are those of the epoch with
the best validation tau_sim, not the lowest loss.
"""

import sys
from pathlib import Path

from draftline.core.config import stage_sections
from draftline.core.threads import apply_thread_policy
from draftline.train.config import TrainConfig


def refuse_own_output_as_init(init: str | None, out_dir: Path) -> None:
    if init is None:
        return
    init_path, out = Path(init).resolve(), out_dir.resolve()
    if init_path == out or out in init_path.parents:
        raise SystemExit(
            f"error: train.init: {init} is this stage's own output, which a train run replaces; "
            "copy a previous draft elsewhere (e.g. models/init/) and point to it"
        )


def main(
    card_path: str,
    vocab_dir: str,
    tokenized_dir: str,
    hs_dir: str,
    out_dir: str,
    report_path: str,
    state_dir: str = "models/draft_checkpoints",
) -> None:
    params = stage_sections(train=TrainConfig)
    apply_thread_policy("train")  # before torch loads: draftline/core/threads.py
    refuse_own_output_as_init(params.train.init, Path(out_dir))
    from draftline.core.io import write_metrics
    from draftline.draft.checkpoint import InitMismatch
    from draftline.train.data import DataMismatch
    from draftline.train.resume import finish_state
    from draftline.train.run import Paths, run

    live = Path(report_path).with_suffix("")
    paths = Paths(
        *map(Path, (card_path, vocab_dir, tokenized_dir, hs_dir, out_dir)), live, Path(state_dir)
    )
    try:
        done = run(params, paths)
    except (InitMismatch, DataMismatch) as err:
        raise SystemExit(f"error: {err}") from None
    write_metrics(report_path, done.report, ["val_tau_sim", "val_loss"])
    if done.last_run is not None:
        finish_state(paths.state, done.last_run)


if __name__ == "__main__":
    main(*sys.argv[1:])
