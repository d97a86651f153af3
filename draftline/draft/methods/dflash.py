"""DFlash: a block of block_size positions after the last accepted token, filled in one forward
from the target's context states (training samples anchored blocks). Its decoder layer is
Qwen3's, it reads the batch rows unshifted (its blocks start at an anchor token) and the target's
embeddings; vLLM serves it as dflash (parallel drafting implied: vLLM sets it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftline.draft.methods.base import Drafter, Forward, ratio, register
from draftline.draft.params import DFlashMethod, DFlashParams

if TYPE_CHECKING:
    from draftline.core.card import TargetCard
    from draftline.draft.spec import DraftSpec


def block_kwargs(d: DFlashParams) -> tuple[tuple[str, object], ...]:
    """The DFlash forward's own arguments: anchors sampled, and the loss's position weighting
    (speculators' per_position_loss_weight with its constant)."""
    kwargs = {
        "gamma": d.gamma,
        "max_anchors": d.max_anchors,
        "per_position_loss_weight": d.position_weight,
        "dpace_alpha": d.dpace_alpha,
    }
    return tuple(kwargs.items())


@register
class DFlash(DFlashMethod, Drafter):
    module = "dflash"
    model_class = "DFlashDraftModel"
    config_class = "DFlashSpeculatorConfig"
    decoder = "qwen3"
    shifted = False
    masked = True
    parallel = True
    vllm_reason = "a DFlash draft fills a block of masked positions; no other method reads it"

    def vllm_speculative(self) -> dict:
        return {"method": self.name}

    def speculative_tokens(self, cfg: DraftSpec) -> int:
        return cfg.dflash.block_size - 1  # the anchor is the bonus token, not a draft

    def config_fields(self, card: TargetCard, cfg: DraftSpec, mask: int | None) -> dict:
        return {
            "block_size": cfg.dflash.block_size,
            "aux_hidden_state_layer_ids": card.aux_ids,
            "mask_token_id": mask,
        }

    def vllm_fields(self, config: dict) -> dict:
        return {
            key: config[key]
            for key in ("aux_hidden_state_layer_ids", "block_size", "mask_token_id")
        }

    def speculators_args(self, cfg: DraftSpec, mask: int | None) -> list[str]:
        d = cfg.dflash
        return [
            "--block-size",
            str(d.block_size),
            "--max-anchors",
            str(d.max_anchors),
            # the position weighting, given always: speculators' own default for dflash (dpace,
            # with ce) is not ours (fixed-exp-decay, with train.loss's default kl_div)
            "--per-position-loss-weight",
            d.position_weight,
            "--dflash-decay-gamma",
            str(d.gamma),
            "--dpace-alpha",
            str(d.dpace_alpha),
            "--mask-token-id",
            str(mask),
        ]

    def training_forward(self, cfg: DraftSpec) -> Forward:
        return Forward(self.name, cfg.dflash.block_size - 1, block_kwargs(cfg.dflash))

    def draft_forward(self, get, k: int) -> Forward:
        """Its own blocks (block size - 1 positions, fixed at training, whatever k), with
        train.dflash's default loss weighting and anchors (the config records neither)."""
        return Forward(self.name, int(get("block_size")) - 1, block_kwargs(DFlashParams()))

    def accuracy(self, metric_sums: dict[str, float], positions: int) -> tuple[list[float], float]:
        """Each block's accepted run is counted (its `eal`, bonus token included): that is
        tau_sim; acc_k is each position's own accuracy."""
        acc = [ratio(metric_sums, f"position_{d}_acc") for d in range(1, positions + 1)]
        tau = ratio(metric_sums, "eal") if metric_sums.get("eal_total") else 1.0
        return acc, tau
