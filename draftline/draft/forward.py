"""The draft's forward over a packed batch, the one training, best-epoch selection and
evaluation's tau_sim all run: the method's speculators model forward (EAGLE-3's multi-step TTT,
P-EAGLE's parallel groups, DFlash's blocks: draftline/draft/methods/), the batch layout it
reads (speculators' CollateFn, with shift_batch where the method reads it), and the precision and
loss it runs with on a device. CPU runs float32 and the eager loss; a GPU bf16 autocast (float32 master
weights) and the fused loss, as speculators does. The loss is train.loss, speculators' own
(draftline/draft/params/objective.py). Its metrics: draftline/draft/metrics.py.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, NamedTuple

import torch

if TYPE_CHECKING:
    from draftline.draft.methods import Forward

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


def loss_spec(loss: str | dict[str, float]) -> str:
    """train.loss as speculators reads a loss (resolve_loss_config, `--loss-fn`): a name, or a
    weighted mix as a JSON object, its terms summed in the order given."""
    return loss if isinstance(loss, str) else json.dumps(loss)


def device_loss_config(device: str, loss: str | dict[str, float] = "kl_div"):
    """speculators' loss `loss` (train.loss; kl_div by default): its eager implementation on CPU
    (it needs no Triton), its fused one on a GPU."""
    from speculators.losses import resolve_loss_config

    return resolve_loss_config(loss_spec(loss), "eager" if device == "cpu" else "fused")


class PackLayout(NamedTuple):
    """A packed batch's shape: tokens per pack, the target's hidden size, and whether rows are
    shifted (speculators' shift_batch, which EAGLE-3 and P-EAGLE read; DFlash reads them as they
    are)."""

    pack_len: int
    hidden_size: int
    shifted: bool = True


def pack_collate(layout: PackLayout, dtype: torch.dtype):
    """speculators' CollateFn: rows (input_ids, loss_mask, hidden states) into one packed batch of
    layout.pack_len tokens, in the layout the forward reads."""
    # speculators loads on first use: importing the forward needs only torch
    from speculators.models.eagle3 import shift_batch
    from speculators.train.data import CollateFn

    return CollateFn(
        layout.pack_len,
        layout.hidden_size,
        num_target_layers=3,
        dtype=dtype,
        preprocess=shift_batch if layout.shifted else None,
    )


def self_attending_padding(create_mask):
    """The eager attention's float mask with a query row that may see no key (a padding position
    after the last document of a pack) let see itself. Flex attention gives such a row zeros; the
    eager softmax over a row of -inf gives NaN, which a zero loss mask does not remove (0 * NaN):
    P-EAGLE's loss on CPU is NaN without this. The row's output is masked out of the loss either
    way."""

    def create(*args, **kwargs):
        mask = create_mask(*args, **kwargs)
        if mask.dtype == torch.bool or mask.dim() < 2:
            return mask
        blind = torch.isinf(mask).all(dim=-1)
        if blind.any():
            n = min(mask.shape[-2], mask.shape[-1])
            eye = torch.eye(n, dtype=torch.bool, device=mask.device)
            diagonal = torch.zeros(mask.shape[-2:], dtype=torch.bool, device=mask.device)
            diagonal[:n, :n] = eye
            mask = mask.masked_fill(blind.unsqueeze(-1) & diagonal, 0.0)
        return mask

    return create


def eager_masks(model) -> None:
    """Padding rows of the eager float masks see themselves (self_attending_padding)."""
    if getattr(model, "_attn_impl", None) == "eager" and not getattr(
        model, "_draftline_padding", False
    ):
        model._create_mask_fn = self_attending_padding(model._create_mask_fn)  # noqa: SLF001
        model._draftline_padding = True  # noqa: SLF001


def run_batch(model, batch: dict, device: str, forward: Forward, loss_config):
    """The forward over one packed batch: (draft tokens, loss, metrics), the metrics the raw
    `*_sum` / `*_total` counts draftline/draft/metrics.py sums."""
    # non_blocking: a pinned pack (make_loader on CUDA) is copied while the host goes on
    inputs = {k: batch[k].to(device, non_blocking=True) for k in MODEL_INPUTS}
    return model(**inputs, **dict(forward.kwargs), loss_config=loss_config)
