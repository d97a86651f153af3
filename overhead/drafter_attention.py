"""CPU attention for the drafters (train.method): one training step (forward, loss, backward) of
each method's speculators model with eager attention, as the builtin loop runs it on CPU, against
flex attention, as speculators' trainer runs it on a GPU (create_block_mask and flex_attention,
compiled by inductor's CPU backend here).

    python overhead/drafter_attention.py --out reports/overhead/drafter_attention.json   # after make repro

The default run's tokenized rows and hidden states packed as train packs them (train.pack_len);
both sides built from the same seed, so their losses are compared too. The first call of each
side is timed apart (flex: the compile); then the sides alternate round by round
(devtools/ab_timing.py), median per side, under the train stage's thread policy. A side that fails
is recorded with its error.
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # devtools/ is not installed

from devtools.ab_timing import alternate, loadavg, machine_load, medians, timed
from draftline.core.threads import apply_thread_policy

SIDES = {"eager": "eager", "flex": "simple_flex_attention"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--card", default="models/target/card.json")
    parser.add_argument("--vocab", default="models/vocab")
    parser.add_argument("--tokenized", default="datasets/tokenized")
    parser.add_argument("--hs", default="datasets/hidden_states")
    parser.add_argument("--pack-len", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    apply_thread_policy("train")
    at_start = loadavg()

    import torch

    from draftline.core.card import TargetCard
    from draftline.draft.forward import device_loss_config, run_batch
    from draftline.draft.methods import Forward, names
    from draftline.draft.model import build_draft
    from draftline.train.config import TrainConfig
    from draftline.train.data import (
        TrainingData,
        epoch_batches,
        layout_of,
        make_dataset,
        make_loader,
    )

    card = TargetCard.load(Path(args.card))
    data = TrainingData(Path(args.tokenized), Path(args.hs))
    train_set = make_dataset(data, "train", 0.9, args.pack_len, "cpu")
    plan = epoch_batches(train_set, args.pack_len, 0, 0)
    loss_config = device_loss_config("cpu")
    report = {"pack_len": args.pack_len, "rounds": args.rounds, "methods": {}}
    for method in names():
        cfg = TrainConfig(method=method, pack_len=args.pack_len)
        hidden = card.hidden_size
        batch = next(iter(make_loader(train_set, plan[:1], layout_of(cfg, hidden), "cpu")))
        forward = Forward.for_training(cfg)
        models, first, losses, errors = {}, {}, {}, {}
        for side, attn in SIDES.items():
            torch.manual_seed(0)
            models[side] = build_draft(card, Path(args.vocab), cfg, attn).train()

        def step(side, models=models, batch=batch, forward=forward):
            torch.manual_seed(1)  # the same COD / anchor sampling on both sides
            _, loss, _ = run_batch(models[side], batch, "cpu", forward, loss_config)
            loss.backward()
            models[side].zero_grad(set_to_none=True)
            return float(loss)

        for side in SIDES:
            began = time.perf_counter()
            try:
                losses[side] = step(side)
                first[side] = round(time.perf_counter() - began, 3)
            except Exception as err:  # noqa: BLE001 - a side that cannot run on CPU is the finding
                errors[side] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
        runnable = {side: timed(lambda s=side: step(s)) for side in SIDES if side not in errors}
        times = medians(alternate(runnable, args.rounds)) if runnable else {}
        entry = {
            "first_call_s": first,
            "step_median_s": {side: round(t, 4) for side, t in times.items()},
            "loss": losses,
            "errors": errors,
        }
        if "eager" in times and "flex" in times:
            entry["flex_over_eager"] = round(times["flex"] / times["eager"], 3)
        report["methods"][method] = entry
        print(f"drafter_attention: {method}: {json.dumps(entry)}", flush=True)
    report["machine"] = machine_load(at_start)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
