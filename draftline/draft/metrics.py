"""The draft's metrics, the same in training, best-epoch selection and evaluation: the
`*_sum` / `*_total` counts its TTT forward returns (draftline/draft/forward.py) summed, and their
summary (loss, per-position accuracy and the simulated acceptance length tau_sim).

Light at import: torch loads where a forward runs (validate_many), so evaluation imports the
summary without it.
"""

from __future__ import annotations

from collections.abc import Iterable


def accumulate(sums: dict[str, float], metrics: dict) -> None:
    for key, value in metrics.items():
        if key.endswith("_sum") or key.endswith("_total"):
            sums[key] = sums.get(key, 0.0) + float(value)


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


def validate_many(
    models: list, packs: Iterable[dict], device: str, ttt_steps: int, decay: float, loss_config
) -> list[dict]:
    """Each model's summary over `packs` (packed batches, e.g. draftline/train/data.py make_loader),
    in one pass: every pack is read once and goes through all the models."""
    import torch

    from draftline.draft.forward import autocast, run_batch

    for model in models:
        model.eval()
    sums: list[dict[str, float]] = [{} for _ in models]
    with torch.no_grad(), autocast(device):
        for batch in packs:
            for model, model_sums in zip(models, sums):
                _, _, metrics = run_batch(model, batch, device, ttt_steps, decay, loss_config)
                accumulate(model_sums, metrics)
    return [summarize(model_sums, ttt_steps) for model_sums in sums]


def validate(model, packs: Iterable[dict], device: str, ttt_steps: int, decay: float, loss_config):
    """The model's summary over `packs` (validate_many of one model)."""
    return validate_many([model], packs, device, ttt_steps, decay, loss_config)[0]
