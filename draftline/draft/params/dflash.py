"""DFlash's facts for params and its section, train.dflash (draftline/draft/methods/dflash.py
holds what it does). Its decoder is its own and reads the target's embeddings."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from draftline.core.config import Section, shaping
from draftline.draft.params.base import Method, TrainChoices, register, train_value


class DFlashParams(Section):
    """train.dflash: DFlash's blocks (speculators' anchored-block training)."""

    # tokens per draft block: the anchor (the bonus token) and block_size - 1 drafted in one
    # forward; speculators' trainer default
    block_size: int = shaping(16, ge=2)
    max_anchors: int = shaping(512, ge=1)  # blocks sampled per pack
    # how the loss weighs the block's positions (speculators' --per-position-loss-weight):
    # fixed-exp-decay, position d by exp(-(d - 1) / gamma); dpace (D-PACE, speculators' own default
    # for DFlash), each position by the draft's smoothed confidence of reaching it, read from its
    # cross-entropy, so it needs train.loss ce
    position_weight: Literal["fixed-exp-decay", "dpace"] = shaping("fixed-exp-decay")
    gamma: float = shaping(4.0, gt=0)  # fixed-exp-decay's decay length, in positions
    # dpace's smoothing of the per-position confidence q: (1 - alpha) q + alpha (speculators')
    dpace_alpha: float = shaping(0.5, gt=0, le=1)

    @model_validator(mode="after")
    def _constants_of_its_weighting(self):
        """A constant of the weighting not chosen is refused, not silently unused."""
        unused = {"fixed-exp-decay": "dpace_alpha", "dpace": "gamma"}[self.position_weight]
        if getattr(self, unused) != type(self).model_fields[unused].default:
            raise ValueError(
                f"{unused}: a constant of the other weighting; position_weight "
                f"{self.position_weight} does not read it"
            )
        return self


@register
class DFlashMethod(Method):
    name = "dflash"
    title = "DFlash"
    label = "DFlash (block)"
    params = DFlashParams
    position_weights = {
        f"dflash.{name}": DFlashParams.model_fields[name].default
        for name in ("position_weight", "gamma", "dpace_alpha")
    }
    weighting = "weighs its block positions by train.dflash.position_weight"

    def check_train(self, cfg: TrainChoices) -> None:
        super().check_train(cfg)
        if train_value(cfg, "dflash.position_weight") == "dpace" and cfg.loss != "ce":
            raise ValueError(
                "dflash.position_weight: dpace reads the draft's confidence from its cross-entropy "
                f"and needs loss: ce (speculators refuses it with another), not loss: {cfg.loss}"
            )
        if cfg.train_embeddings:
            raise ValueError(
                "train_embeddings: a DFlash draft reads the target's embeddings (its checkpoint "
                "and vLLM keep none of its own)"
            )
