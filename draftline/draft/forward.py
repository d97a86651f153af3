"""The draft's multi-step (TTT) forward over a packed batch, the one training, best-epoch
selection and evaluation's tau_sim all run: speculators' Eagle3DraftModel.forward, the batch
layout it reads (speculators' CollateFn with shift_batch), and the precision and loss it runs
with on a device. CPU runs float32 and the eager loss; a GPU bf16 autocast (float32 master
weights) and the fused loss, as speculators does. Its metrics: draftline/draft/metrics.py.
"""

from __future__ import annotations

import torch

MODEL_INPUTS = (
    "hidden_states",
    "input_ids",
    "verifier_last_hidden_states",
    "loss_mask",
    "position_ids",
    "document_ids",
)


def hidden_states_dtype(device: str) -> torch.dtype:
    return torch.float32 if device == "cpu" else torch.bfloat16


def autocast(device: str):
    """bf16 autocast on a GPU (master weights stay float32); plain float32 on CPU."""
    if device == "cpu":
        return torch.autocast("cpu", enabled=False)
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)


def device_loss_config(device: str):
    """speculators' kl_div loss: the eager implementation on CPU (it needs no Triton), the fused
    one on a GPU."""
    from speculators.losses import resolve_loss_config

    return resolve_loss_config("kl_div", "eager" if device == "cpu" else "fused")


def pack_collate(pack_len: int, hidden_size: int, dtype: torch.dtype):
    """speculators' CollateFn with shift_batch: rows (input_ids, loss_mask, hidden states) into one
    packed batch of pack_len tokens, in the layout the forward reads."""
    # speculators loads on first use: importing the forward needs only torch
    from speculators.models.eagle3 import shift_batch
    from speculators.train.data import CollateFn

    return CollateFn(
        pack_len, hidden_size, num_target_layers=3, dtype=dtype, preprocess=shift_batch
    )


def run_batch(model, batch: dict, device: str, ttt_steps: int, decay: float, loss_config):
    """The forward over one packed batch: (draft tokens, loss, metrics), the metrics the raw
    `*_sum` / `*_total` counts draftline/draft/metrics.py sums."""
    # non_blocking: a pinned pack (make_loader on CUDA) is copied while the host goes on
    inputs = {k: batch[k].to(device, non_blocking=True) for k in MODEL_INPUTS}
    return model(**inputs, ttt_steps=ttt_steps, ttt_step_loss_decay=decay, loss_config=loss_config)
