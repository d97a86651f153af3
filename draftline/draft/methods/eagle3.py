"""EAGLE-3: a chain; each of the k draft steps reads the one before (training unrolls them, TTT).

The one drafter the built-in decoder runs, SGLang serves (in the original EAGLE-3 layout,
draftline export-sglang) and train.init fine-tunes; checkpoints in the EAGLE/SpecForge layout are
its drafts. vLLM serves it as eagle3.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftline.draft.methods.base import Drafter, Forward, ratio, register
from draftline.draft.params import Eagle3Method

if TYPE_CHECKING:
    from draftline.core.card import TargetCard
    from draftline.draft.spec import DraftSpec, ServingSpec

# The EAGLE-3 decoder's norms (train.architecture; P-EAGLE's decoder has them too). speculators:
# its eagle3 defaults (a norm over the three aux states before fc, the hidden norm before the
# residual, the normed state carried to the next step); vLLM serves both. eagle3
# (ORIGINAL_NORMS): the original EAGLE-3 decoder, the one SGLang's LlamaForCausalLMEagle3
# implements (see draftline/draft/sglang_export.py).
ORIGINAL_NORMS = "eagle3"
ARCHITECTURES = {
    "speculators": {"norm_before_residual": True, "norm_before_fc": True, "norm_output": True},
    ORIGINAL_NORMS: {"norm_before_residual": False, "norm_before_fc": False, "norm_output": False},
}

# the EAGLE-3 decoder's fields vLLM reads from a saved config.json (P-EAGLE's too)
EAGLE_FIELDS = (
    "eagle_aux_hidden_state_layer_ids",
    "norm_before_residual",
    "norm_before_fc",
    "fc_norm",
    "norm_output",
)


def eagle_config_fields(card: TargetCard, cfg: DraftSpec) -> dict:
    """The EAGLE-3 decoder's config fields: its norms (train.architecture), embeddings trained or
    not, the aux layers it reads (P-EAGLE's decoder is the same)."""
    return {
        **ARCHITECTURES[cfg.architecture or "speculators"],
        "fc_norm": False,
        "embed_requires_grad": cfg.train_embeddings,
        "eagle_aux_hidden_state_layer_ids": card.aux_ids,
    }


def chain(k: int) -> Forward:
    """An EAGLE-3 draft unrolled k steps, undecayed (what the built-in decoder measures)."""
    return Forward(Eagle3.name, k, (("ttt_steps", k), ("ttt_step_loss_decay", 1.0)))


@register
class Eagle3(Eagle3Method, Drafter):
    module = "eagle3"
    model_class = "Eagle3DraftModel"
    config_class = "Eagle3SpeculatorConfig"
    decoder = "llama"
    unnamed_checkpoints = True
    vllm_reason = "vLLM's 'eagle' feeds the draft one hidden state instead of three"

    def vllm_speculative(self) -> dict:
        return {"method": self.name}

    def speculative_tokens(self, cfg: DraftSpec) -> int:
        return cfg.speculative_tokens or cfg.ttt_steps

    def config_fields(self, card: TargetCard, cfg: DraftSpec, mask: int | None) -> dict:
        return eagle_config_fields(card, cfg)

    def vllm_fields(self, config: dict) -> dict:
        return {key: config[key] for key in EAGLE_FIELDS}

    def speculators_args(self, cfg: DraftSpec, mask: int | None) -> list[str]:
        return []

    def training_forward(self, cfg: DraftSpec) -> Forward:
        kwargs = {"ttt_steps": cfg.ttt_steps, "ttt_step_loss_decay": cfg.ttt_step_loss_decay}
        return Forward(self.name, cfg.ttt_steps, tuple(kwargs.items()))

    def draft_forward(self, get, k: int) -> Forward:
        return chain(k)

    def accuracy(self, metric_sums: dict[str, float], positions: int) -> tuple[list[float], float]:
        """full_acc_k is P(steps 0..k all correct) already: each step reads the last."""
        acc = [ratio(metric_sums, f"full_acc_{k}") for k in range(positions)]
        return acc, 1 + sum(acc)

    def vllm_problems(self, cfg: ServingSpec) -> list[str]:
        if cfg.vllm.speculative_config.get("parallel_drafting"):
            return [
                "benchmark.vllm.speculative_config: parallel_drafting for an EAGLE-3 draft, which "
                "was trained to draft one token per forward (train.method peagle trains one for it)"
            ]
        return []

    def reads_flat_config(self, config: dict) -> bool:
        """An EAGLE/SpecForge config is EAGLE-3's when its architectures say so or it has a draft
        vocabulary (EAGLE-1/2 have neither)."""
        architectures = config.get("architectures") or ()
        return any("eagle3" in a.lower() for a in architectures) or "draft_vocab_size" in config
