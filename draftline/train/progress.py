"""Progress and reporting of a train run: the per-epoch metrics to dvclive and the log, the
progress lines of the builtin loop (steps, tokens/s, ETA), and the train stage's metrics report.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from draftline.train.config import TrainConfig

log = logging.getLogger(__name__)


def epoch_logger(live):
    def log_epoch(record):
        for split in ("train", "val"):
            if record.get(split) is None:
                continue
            live.log_metric(f"{split}/loss", record[split]["loss"])
            live.log_metric(f"{split}/tau_sim", record[split]["tau_sim"])
            for k, acc in enumerate(record[split]["position_accuracy"]):
                live.log_metric(f"{split}/position_accuracy/acc_{k}", acc)
        live.next_step()
        val = record["val"]
        log.info(
            f"epoch {record['epoch']}: val loss {val['loss']:.4f}  tau_sim {val['tau_sim']:.3f}  "
            f"acc {val['position_accuracy']}"
        )

    return log_epoch


PROGRESS_EVERY_S = 30.0


def step_reporter(every_s: float = PROGRESS_EVERY_S, clock=time.monotonic):
    """progress(p) for train_draft: a line at the first step, then every `every_s` seconds and at the
    last step of each epoch: steps, tokens/s and the ETA of the epoch and of the run (a CPU epoch
    can take minutes; the per-epoch line alone left the log silent that long)."""
    seen = {"last": None, "first_step": 0}

    def progress(p: dict) -> None:
        now = clock()
        if seen["last"] is None:
            seen["first_step"] = p["step"] - 1  # a resumed run times its own steps only
        elif now - seen["last"] < every_s and p["epoch_step"] < p["epoch_steps"]:
            return
        seen["last"] = now
        per_step = p["seconds"] / max(p["step"] - seen["first_step"], 1)
        tokens_per_s = p["tokens"] / p["seconds"] if p["seconds"] > 0 else 0.0
        log.info(
            f"train: epoch {p['epoch'] + 1}/{p['epochs']} step {p['epoch_step']}/{p['epoch_steps']} "
            f"(step {p['step']} of {p['total_steps']}), {tokens_per_s:,.0f} tok/s, "
            f"epoch ETA {clock_text(per_step * (p['epoch_steps'] - p['epoch_step']))}, "
            f"run ETA {clock_text(per_step * (p['total_steps'] - p['step']))} (validation aside)"
        )

    return progress


def clock_text(seconds: float) -> str:
    minutes, sec = divmod(int(round(seconds)), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{sec:02d}"


def train_report(cfg: TrainConfig, result: dict, source: dict) -> dict:
    """The train stage's metrics: the kept epoch's validation figures and how the run went."""
    best = result["best"]
    return {
        "best_epoch": best["epoch"],
        "val_tau_sim": best["val"]["tau_sim"],
        "val_position_accuracy": best["val"]["position_accuracy"],
        "val_loss": round(best["val"]["loss"], 5),
        "train_loss": round(best["train"]["loss"], 5) if best.get("train") else None,
        "epochs": cfg.epochs,
        "steps": result.get("steps"),
        "step_seconds": result.get("step_seconds"),
        "resumed_at": result.get("resumed_at"),
        "init": cfg.init,
        "hidden_states_mode": source["mode"],
        "hidden_states_format": source["format"],
        "target_forwards_per_epoch": result.get("target_forwards_per_epoch", 0),
    }
