"""P-EAGLE's facts for params and its section, train.peagle (draftline/draft/methods/peagle.py
holds what it does). Its decoder is EAGLE-3's, so the EAGLE-3 norm layouts apply."""

from __future__ import annotations

from draftline.core.config import Section, shaping
from draftline.draft.params.base import Method, register


class PEagleParams(Section):
    """train.peagle: P-EAGLE's parallel groups (speculators' COD sampling)."""

    # parallel draft positions trained (K); the draft's speculative_tokens (vLLM serves up to it)
    depths: int = shaping(8, ge=2)
    # depth d keeps max(ratio**d, ratio_min) of the positions (geometric down-sampling)
    down_sample_ratio: float = shaping(0.7, gt=0, lt=1)
    down_sample_ratio_min: float = shaping(0.2, gt=0, lt=1)
    max_anchors: int = shaping(512, ge=1)  # chain starts sampled per pack


@register
class PEagleMethod(Method):
    name = "peagle"
    title = "P-EAGLE"
    label = "P-EAGLE (parallel)"
    params = PEagleParams
    eagle_layout = True
    weighting = (
        "weighs its parallel depths alike (train.peagle's down-sampling sets how many positions "
        "each depth trains)"
    )
