"""Draft metrics shared by training and evaluation: one TTT forward over a packed batch, the
`*_sum` / `*_total` counts it returns summed, and their summary (loss, per-position accuracy and
the simulated acceptance length tau_sim)."""

from __future__ import annotations

import torch

from draftline.train.data import autocast, hidden_states_dtype, make_loader

MODEL_INPUTS = (
    "hidden_states",
    "input_ids",
    "verifier_last_hidden_states",
    "loss_mask",
    "position_ids",
    "document_ids",
)


def run_batch(model, batch: dict, device: str, ttt_steps: int, decay: float, loss_config):
    # non_blocking: a pinned pack (make_loader on CUDA) is copied while the host goes on
    inputs = {k: batch[k].to(device, non_blocking=True) for k in MODEL_INPUTS}
    return model(**inputs, ttt_steps=ttt_steps, ttt_step_loss_decay=decay, loss_config=loss_config)


def summarize(metric_sums: dict[str, float], ttt_steps: int) -> dict:
    """Per-position accuracy acc_k = P(steps 0..k all correct) = prod_{i<=k} of the conditional
    acceptance, and the simulated acceptance length tau_sim = 1 + sum_k acc_k."""

    def ratio(name):
        total = metric_sums.get(f"{name}_total", 0.0)
        return metric_sums.get(f"{name}_sum", 0.0) / total if total else 0.0

    acc = [ratio(f"full_acc_{k}") for k in range(ttt_steps)]
    return {
        "loss": ratio("loss"),
        "position_accuracy": [round(a, 4) for a in acc],
        "tau_sim": round(1 + sum(acc), 4),
    }


def accumulate(sums: dict[str, float], metrics: dict) -> None:
    for key, value in metrics.items():
        if key.endswith("_sum") or key.endswith("_total"):
            sums[key] = sums.get(key, 0.0) + float(value)


@torch.no_grad()
def validate(
    model,
    dataset,
    batches,
    pack_len: int,
    device: str,
    ttt_steps: int,
    decay: float,
    loss_config,
    workers: int = 0,
) -> dict:
    return validate_many(
        [model], dataset, batches, pack_len, device, ttt_steps, decay, loss_config, workers
    )[0]


@torch.no_grad()
def validate_many(
    models,
    dataset,
    batches,
    pack_len: int,
    device: str,
    ttt_steps: int,
    decay: float,
    loss_config,
    workers: int = 0,
) -> list[dict]:
    """Each model's summary over the packs of `batches`, in one pass: every pack is read once
    (make_loader, `workers` threads ahead) and goes through all the models."""
    for model in models:
        model.eval()
    hidden_size = models[0].config.transformer_layer_config.hidden_size
    dtype = hidden_states_dtype(device)
    pin = torch.device(device).type == "cuda"
    sums: list[dict[str, float]] = [{} for _ in models]
    with autocast(device):
        for batch in make_loader(dataset, batches, pack_len, hidden_size, dtype, workers, pin):
            for model, model_sums in zip(models, sums):
                _, _, metrics = run_batch(model, batch, device, ttt_steps, decay, loss_config)
                accumulate(model_sums, metrics)
    return [summarize(model_sums, ttt_steps) for model_sums in sums]
