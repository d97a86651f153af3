"""P-EAGLE: all k draft tokens in one forward, the later positions reading a mask token and a
learnt mask state (training samples parallel groups, COD). Its decoder is EAGLE-3's; vLLM serves
it as eagle3 with parallel_drafting (vLLM's speculators reader maps peagle so).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftline.draft.methods.base import Drafter, Forward, ratio, register
from draftline.draft.methods.eagle3 import EAGLE_FIELDS, eagle_config_fields
from draftline.draft.params import PEagleMethod

if TYPE_CHECKING:
    from draftline.core.card import TargetCard
    from draftline.draft.spec import DraftSpec, ServingSpec


@register
class PEagle(PEagleMethod, Drafter):
    module = "peagle"
    model_class = "PEagleDraftModel"
    config_class = "PEagleSpeculatorConfig"
    decoder = "llama"
    masked = True
    parallel = True
    vllm_reason = "a P-EAGLE draft is an EAGLE-3 one drafting all its tokens in one forward"

    def vllm_speculative(self) -> dict:
        return {"method": "eagle3", "parallel_drafting": True}

    def speculative_tokens(self, cfg: DraftSpec) -> int:
        return cfg.peagle.depths

    def config_fields(self, card: TargetCard, cfg: DraftSpec, mask: int | None) -> dict:
        return {**eagle_config_fields(card, cfg), "mask_token_id": mask}

    def vllm_fields(self, config: dict) -> dict:
        return {key: config[key] for key in (*EAGLE_FIELDS, "mask_token_id")}

    def speculators_args(self, cfg: DraftSpec, mask: int | None) -> list[str]:
        p = cfg.peagle
        return [
            "--num-depths",
            str(p.depths),
            "--down-sample-ratio",
            str(p.down_sample_ratio),
            "--down-sample-ratio-min",
            str(p.down_sample_ratio_min),
            "--max-anchors",
            str(p.max_anchors),
            "--mask-token-id",
            str(mask),
        ]

    def training_forward(self, cfg: DraftSpec) -> Forward:
        p = cfg.peagle
        kwargs = {
            "num_depths": p.depths,
            "down_sample_ratio": p.down_sample_ratio,
            "down_sample_ratio_min": p.down_sample_ratio_min,
            "max_anchors": p.max_anchors,
        }
        return Forward(self.name, p.depths, tuple(kwargs.items()))

    def draft_forward(self, get, k: int) -> Forward:
        """k parallel depths, every position kept (no down-sampling)."""
        kwargs = {"num_depths": k, "down_sample_ratio": 0.999, "down_sample_ratio_min": 0.999}
        return Forward(self.name, k, tuple(kwargs.items()))

    def accuracy(self, metric_sums: dict[str, float], positions: int) -> tuple[list[float], float]:
        """Each depth reports its own accuracy: acc_k is their running product, which assumes
        the depths err independently."""
        acc, running = [], 1.0
        for d in range(positions):
            running *= ratio(metric_sums, f"position_{d}_acc")
            acc.append(running)
        return acc, 1 + sum(acc)

    def vllm_problems(self, cfg: ServingSpec) -> list[str]:
        if cfg.vllm.speculative_config.get("parallel_drafting") is False:
            return [
                "benchmark.vllm.speculative_config: parallel_drafting false for a P-EAGLE draft; "
                "drafting one token per forward feeds its later positions what they never saw"
            ]
        return []
