"""The draft's metrics, the same in training, best-epoch selection and evaluation: the
`*_sum` / `*_total` counts its TTT forward returns (draftline/draft/forward.py) summed, and their
summary (loss, per-position accuracy and the simulated acceptance length tau_sim).

Light at import: torch loads where a forward runs (validate_many), so evaluation imports the
summary without it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from draftline.draft.methods import Forward


def accumulate(sums: dict[str, float], metrics: dict) -> None:
    for key, value in metrics.items():
        if key.endswith("_sum") or key.endswith("_total"):
            sums[key] = sums.get(key, 0.0) + float(value)


def summarize(metric_sums: dict[str, float], forward: Forward) -> dict:
    """Loss, per-position accuracy and tau_sim (draftline/draft/methods/base.py summarize)."""
    from draftline.draft.methods import summarize as summarize_method

    return summarize_method(metric_sums, forward)


def validate_many(
    models: list, packs: Iterable[dict], device: str, forward: Forward, loss_config
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
                _, _, metrics = run_batch(model, batch, device, forward, loss_config)
                accumulate(model_sums, metrics)
    return [summarize(model_sums, forward) for model_sums in sums]


def validate(model, packs: Iterable[dict], device: str, forward: Forward, loss_config):
    """The model's summary over `packs` (validate_many of one model)."""
    return validate_many([model], packs, device, forward, loss_config)[0]
