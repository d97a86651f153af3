"""Stage `train`: the EAGLE-3 draft (speculators' Eagle3DraftModel) in our own loop.

    python -m stages.train models/target/card.json models/vocab datasets/tokenized \
        datasets/hidden_states models/draft reports/train.json

Writes models/draft/ in speculators format (config.json + model.safetensors; loads with
Eagle3DraftModel.from_pretrained) plus meta.json; per-epoch metrics go to dvclive (reports/train/).
The kept checkpoint is the epoch with the best validation tau_sim, not the lowest loss.
"""

import sys
from pathlib import Path

from draftline.config import stage_params


def main(card_path: str, vocab_dir: str, tokenized_dir: str, hs_dir: str, out_dir: str, report_path: str) -> None:
    params = stage_params()
    cfg = params.train
    from dvclive import Live

    from draftline.draft import build_draft, seed_everything, train_draft
    from draftline.io import file_sha256, read_json, write_json, write_meta
    from draftline.target import resolve_device

    card = read_json(card_path)
    device = resolve_device(cfg.device)
    seed_everything(cfg.seed)
    model = build_draft(card, Path(vocab_dir), cfg.num_layers, cfg.ttt_steps, attn_impl="eager" if device == "cpu" else "simple_flex_attention")

    with Live(dir=str(Path(report_path).with_suffix("")), save_dvc_exp=False, dvcyaml=None) as live:
        def log(record):
            for split in ("train", "val"):
                live.log_metric(f"{split}/loss", record[split]["loss"])
                live.log_metric(f"{split}/tau_sim", record[split]["tau_sim"])
                for k, acc in enumerate(record[split]["position_accuracy"]):
                    live.log_metric(f"{split}/acc_{k}", acc)
            live.next_step()
            print(f"epoch {record['epoch']}: train loss {record['train']['loss']:.3f}  "
                  f"val tau_sim {record['val']['tau_sim']:.3f}  val acc {record['val']['position_accuracy']}")

        result = train_draft(model, cfg, Path(tokenized_dir), Path(hs_dir), device, log)

    out = Path(out_dir)
    model.to("cpu")
    model.save_pretrained(out)
    write_meta(out, "train", cfg.model_dump(), target=card["model"], target_revision=card.get("revision"),
               tokenized_sha256=file_sha256(next(Path(tokenized_dir).glob("data-*.arrow"))))
    best = result["best"]
    write_json(report_path, {
        "best_epoch": best["epoch"],
        "val_tau_sim": best["val"]["tau_sim"],
        "val_position_accuracy": best["val"]["position_accuracy"],
        "val_loss": round(best["val"]["loss"], 5),
        "train_loss": round(best["train"]["loss"], 5),
        "epochs": cfg.epochs,
    })


if __name__ == "__main__":
    main(*sys.argv[1:])
