"""DFlash's facts for params and its section, train.dflash (draftline/draft/methods/dflash.py
holds what it does). Its decoder is its own and reads the target's embeddings."""

from __future__ import annotations

from draftline.core.config import Section, shaping
from draftline.draft.params.base import Method, TrainChoices, register


class DFlashParams(Section):
    """train.dflash: DFlash's blocks (speculators' anchored-block training)."""

    # tokens per draft block: the anchor (the bonus token) and block_size - 1 drafted in one
    # forward; speculators' trainer default
    block_size: int = shaping(16, ge=2)
    max_anchors: int = shaping(512, ge=1)  # blocks sampled per pack
    gamma: float = shaping(4.0, gt=0)  # per-position loss decay of the block (fixed-exp-decay)


@register
class DFlashMethod(Method):
    name = "dflash"
    title = "DFlash"
    label = "DFlash (block)"
    params = DFlashParams

    def check_train(self, cfg: TrainChoices) -> None:
        super().check_train(cfg)
        if cfg.train_embeddings:
            raise ValueError(
                "train_embeddings: a DFlash draft reads the target's embeddings (its checkpoint "
                "and vLLM keep none of its own)"
            )
