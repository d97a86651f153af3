"""Training-step overhead: our loop's optimizer step vs a bare Eagle3DraftModel step, same batches.

    python overhead/train_step.py --out reports/overhead/train_step.json      # after `make repro`

Uses the default pipeline's tokenized rows and hidden states. "ours" is the median step time of
draftline.training.train_draft (speculators' ArrowDataset + Multipack plan + CollateFn read from disk
each step, the TTT forward/loss, backward, clipping, AdamW, schedule, metric sums, periodic
resume checkpoints); "bare" is forward + backward + AdamW step on the same packed batches,
collated in memory beforehand. Both start from the same weights. Target: ratio <= 1.10.
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from draftline.card import TargetCard
from draftline.config import TrainConfig
from draftline.draft_data import epoch_batches, hidden_states_dtype, make_dataset, make_loader
from draftline.draft_metrics import run_batch
from draftline.draft_model import build_draft
from draftline.train_state import seed_everything
from draftline.training import train_draft


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--card", default="models/target/card.json")
    ap.add_argument("--vocab", default="models/vocab")
    ap.add_argument("--tokenized", default="datasets/tokenized")
    ap.add_argument("--hidden-states", default="datasets/hidden_states")
    ap.add_argument("--out", default="reports/overhead/train_step.json")
    args = ap.parse_args()
    if not Path(args.hidden_states).is_dir():
        raise SystemExit("error: no hidden states; run `make repro` first")
    from speculators.losses import resolve_loss_config

    card = TargetCard.load(args.card)
    cfg = TrainConfig(epochs=1, val_fraction=0.05)
    device, dtype = "cpu", hidden_states_dtype("cpu")

    seed_everything(0)
    model = build_draft(card, Path(args.vocab), cfg.num_layers, cfg.ttt_steps)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    with tempfile.TemporaryDirectory() as tmp:
        ours = train_draft(
            model,
            cfg,
            Path(args.tokenized),
            Path(args.hidden_states),
            device,
            state_dir=Path(tmp),
            fingerprint="bench",
            say=lambda *_: None,
        )

    # bare: the same packing plan, collated up front, then only the model step
    model.load_state_dict(initial)
    train_set = make_dataset(
        Path(args.tokenized),
        Path(args.hidden_states),
        "train",
        1 - cfg.val_fraction,
        cfg.pack_len,
        dtype,
    )
    batches = list(
        make_loader(
            train_set,
            epoch_batches(train_set, cfg.pack_len, cfg.seed, 0),
            cfg.pack_len,
            model.config.transformer_layer_config.hidden_size,
            dtype,
        )
    )
    loss_config = resolve_loss_config("kl_div", "eager")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr)
    model.train()
    bare = []
    for batch in batches:
        start = time.perf_counter()
        _, loss, _ = run_batch(
            model, batch, device, cfg.ttt_steps, cfg.ttt_step_loss_decay, loss_config
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        bare.append(time.perf_counter() - start)
    bare_median = statistics.median(bare)
    result = {
        "steps": len(bare),
        "pack_len": cfg.pack_len,
        "ours_step_s": ours["step_seconds"],
        "bare_step_s": round(bare_median, 4),
        "ratio_ours_over_bare": round(ours["step_seconds"] / bare_median, 3),
        "target_ratio": 1.10,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
