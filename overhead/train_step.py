"""Training-step overhead: our loop's optimizer step vs a bare Eagle3DraftModel step, same batches.

    python overhead/train_step.py --out reports/overhead/train_step.json      # after `make repro`

Uses the default pipeline's tokenized rows and hidden states, one epoch of TrainConfig's defaults
(pack_len 1024, val_fraction 0.05 here). Each round starts both sides from the same weights, and
both are timed per optimizer step the same way: the wall time from the end of the first step to
the end of the last, over the steps in between (the cold first step is left out of both).

- ours: draftline.train.run.train_draft with a resume-state directory, as the train stage runs it:
  speculators' ArrowDataset + Multipack plan + CollateFn read from disk each step, the TTT
  forward/loss, backward, clipping, AdamW, schedule, metric sums, and the resume checkpoints it
  writes every `checkpoint_every_steps` steps, which fall between two steps and so are in the time
  (`checkpoints_timed`); the end-of-epoch validation and checkpoint come after the last step and
  are not;
- bare: forward + backward + AdamW (the same lr and weight decay) on the same packed batches,
  collated in memory beforehand, nothing written.

The sides alternate round by round (devtools/ab_timing.py), median per side, both under the train
stage's thread policy (draftline/core/threads.py); the load averages and CPU count are recorded.
`ours_step_median_s` is the median of ours' step-to-step times: a step without a checkpoint.
Target: ratio <= 1.10.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # devtools/ is not installed

from devtools.ab_timing import alternate, loadavg, machine_load, medians
from draftline.core.threads import apply_thread_policy


def per_step(stamps: list[float]) -> float:
    """Seconds per step from the end of the first step to the end of the last."""
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--card", default="models/target/card.json")
    ap.add_argument("--vocab", default="models/vocab")
    ap.add_argument("--tokenized", default="datasets/tokenized")
    ap.add_argument("--hidden-states", default="datasets/hidden_states")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of each side")
    ap.add_argument(
        "--pack-len",
        type=int,
        default=1024,
        help="tokens per packed batch (small data: more steps)",
    )
    ap.add_argument("--out", default="reports/overhead/train_step.json")
    args = ap.parse_args()
    if not Path(args.hidden_states).is_dir():
        raise SystemExit("error: no hidden states; run `make repro` first")
    at_start = loadavg()
    threads = apply_thread_policy("train")  # before torch loads, as the stage does
    import torch
    from speculators.losses import resolve_loss_config

    from draftline.core.card import TargetCard
    from draftline.draft.forward import run_batch
    from draftline.draft.methods import Forward
    from draftline.draft.model import build_draft
    from draftline.train.config import TrainConfig
    from draftline.train.data import (
        TrainingData,
        epoch_batches,
        layout_of,
        make_dataset,
        make_loader,
    )
    from draftline.train.resume import Resume, seed_everything
    from draftline.train.run import LoopCallbacks, train_draft

    card = TargetCard.load(args.card)
    cfg = TrainConfig(
        epochs=1, val_fraction=0.05, **({"pack_len": args.pack_len} if args.pack_len else {})
    )
    device = "cpu"
    data = TrainingData(Path(args.tokenized), Path(args.hidden_states))

    seed_everything(0)
    model = build_draft(card, Path(args.vocab), cfg)
    initial = {k: v.clone() for k, v in model.state_dict().items()}

    # bare: the same packing plan, collated up front, then only the model step
    train_set = make_dataset(data, "train", 1 - cfg.val_fraction, cfg.pack_len, device)
    batches = list(
        make_loader(
            train_set,
            epoch_batches(train_set, cfg.pack_len, cfg.seed, 0),
            layout_of(cfg, model.config.transformer_layer_config.hidden_size),
            device,
        )
    )
    if len(batches) < 2:
        raise SystemExit(
            f"error: {len(batches)} packed batch(es); per-step timing needs 2 (a smaller --pack-len)"
        )
    loss_config = resolve_loss_config("kl_div", "eager")
    ours_medians = []

    def ours() -> float:
        model.load_state_dict(initial)
        stamps = []
        with tempfile.TemporaryDirectory() as tmp:  # a fresh state directory: nothing to resume
            after_each_step = LoopCallbacks(step=lambda _p: stamps.append(time.perf_counter()))
            train_draft(model, cfg, data, device, Resume(Path(tmp), "bench"), after_each_step)
        ours_medians.append(statistics.median(b - a for a, b in zip(stamps, stamps[1:])))
        return per_step(stamps)

    def bare() -> float:
        model.load_state_dict(initial)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        model.train()
        stamps = []
        for batch in batches:
            _, loss, _ = run_batch(model, batch, device, Forward.for_training(cfg), loss_config)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            stamps.append(time.perf_counter())
        return per_step(stamps)

    times = alternate({"ours": ours, "bare": bare}, args.rounds)
    med = medians(times)
    steps = len(batches)
    result = {
        "steps": steps,
        "pack_len": cfg.pack_len,
        "rounds": args.rounds,
        "ours_step_s": round(med["ours"], 4),
        "bare_step_s": round(med["bare"], 4),
        "ratio_ours_over_bare": round(med["ours"] / med["bare"], 3),
        "target_ratio": 1.10,
        "checkpoint_every_steps": cfg.checkpoint_every_steps,
        "checkpoints_timed": (steps - 1) // cfg.checkpoint_every_steps,
        "ours_step_median_s": round(statistics.median(ours_medians), 4),
        "all_step_s": {k: [round(t, 4) for t in v] for k, v in times.items()},
        "threads": threads,
        **machine_load(at_start),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
