"""A trained draft in the layout SGLang loads EAGLE-3 drafts from.

    draftline export-sglang models/draft models/target/card.json models/draft_sglang

SGLang picks the draft class from config.json `architectures` and serves EAGLE-3 with
`LlamaForCausalLMEagle3` (python/sglang/srt/models/llama_eagle3.py): a flat Llama config with
`draft_vocab_size`, weights `embed_tokens`, `fc`, `midlayer.*` (the one decoder layer, attention
over [embedding, hidden] = 2H), `norm`, `lm_head`, `d2t` (offsets: target id = i + d2t[i]) and
`t2d`. That class implements the original EAGLE-3 decoder only: no norm over the aux states
before `fc`, the residual taken before the hidden norm, the pre-norm state carried to the next
step, and its `load_weights` skips every name it does not know without a word. A draft with
speculators' extra norms (train.architecture: speculators, the default) would therefore load and
serve another function than the one trained, so it is refused here: train with
`train.architecture: eagle3`. SGLang's further decoder layers also differ from speculators' (no
input norm, residual carried between layers), so only one-layer drafts are exported.

SGLang reads `eagle_config.eagle_aux_hidden_state_layer_ids` as layer *outputs*; the card's ids
are layer inputs (vLLM's convention), so id i is written as i - 1.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path

from draftline.core.card import TargetCard
from draftline.core.errors import DraftlineError, entry_point
from draftline.draft.checkpoint import ORIGINAL_NORMS, architecture_of, read_weights
from draftline.draft.methods import drafter, names, serving, titles

# named, not __name__: under `python -m` this module is __main__, outside the draftline loggers
log = logging.getLogger("draftline.draft.sglang_export")

LAYER_PREFIX = "layers.0."
SGLANG_LAYER_PREFIX = "midlayer."
KEPT = {"embed_tokens.weight", "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"}
LAYER_WEIGHTS = {
    "input_layernorm.weight",
    "hidden_norm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
}


class SglangExportError(DraftlineError, ValueError):
    """SGLang's LlamaForCausalLMEagle3 cannot compute this draft; the message says what differs."""


def check_exportable(config: dict, card: TargetCard) -> None:
    """Raise SglangExportError when SGLang's LlamaForCausalLMEagle3 cannot compute this draft."""
    kind = config.get("speculators_model_type")
    if kind not in names() or not drafter(kind).sglang:
        raise SglangExportError(
            f"not a speculators {titles(serving('sglang'))} draft (speculators_model_type {kind!r})"
        )
    if architecture_of(config) != ORIGINAL_NORMS:
        flags = {
            k: config.get(k)
            for k in ("norm_before_fc", "fc_norm", "norm_before_residual", "norm_output")
        }
        raise SglangExportError(
            f"the draft has speculators' extra norms {flags}; SGLang's LlamaForCausalLMEagle3 has none of them "
            "and would skip their weights silently, serving another function: train it with "
            "train.architecture: eagle3"
        )
    layers = config["transformer_layer_config"]["num_hidden_layers"]
    if layers != 1:
        raise SglangExportError(
            f"the draft has {layers} decoder layers; SGLang's LlamaForCausalLMEagle3 runs "
            "layers after the first differently from speculators: train.num_layers: 1"
        )
    if min(card.aux_ids) < 1:
        raise SglangExportError(
            f"aux layer id 0 (the embeddings) has no SGLang id (it counts layer outputs); "
            f"card ids {card.aux_ids}"
        )


def sglang_config(config: dict, card: TargetCard, dtype: str) -> dict:
    """config.json for LlamaForCausalLMEagle3 from a speculators EAGLE-3 config."""
    layer = config["transformer_layer_config"]
    rope = dict(layer.get("rope_parameters") or {})
    rope_theta = rope.pop("rope_theta", layer.get("rope_theta", 10000.0))
    rope_scaling = layer.get("rope_scaling") or (
        rope if rope.get("rope_type", "default") != "default" else None
    )
    keys = (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "hidden_act",
        "rms_norm_eps",
        "max_position_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    )
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        **{k: layer.get(k) for k in keys},
        "num_hidden_layers": 1,
        "vocab_size": layer["vocab_size"],
        "draft_vocab_size": config["draft_vocab_size"],
        "target_hidden_size": card.hidden_size,
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": [i - 1 for i in card.aux_ids],
            "use_aux_hidden_state": True,
        },
    }


def sglang_weights(weights: dict) -> dict:
    """speculators' names -> LlamaForCausalLMEagle3's; refuses any weight SGLang would drop."""
    out, unknown = {}, []
    for name, tensor in weights.items():
        if name in KEPT:
            out[name] = tensor
        elif name.startswith(LAYER_PREFIX) and name[len(LAYER_PREFIX) :] in LAYER_WEIGHTS:
            out[SGLANG_LAYER_PREFIX + name[len(LAYER_PREFIX) :]] = tensor
        elif not name.startswith(
            "verifier_"
        ):  # the target's own head and norm: SGLang takes them from the target
            unknown.append(name)
    if unknown:
        raise SglangExportError(
            f"weights SGLang's LlamaForCausalLMEagle3 has no place for: {sorted(unknown)[:8]}"
        )
    missing = sorted({*KEPT, *(SGLANG_LAYER_PREFIX + w for w in LAYER_WEIGHTS)} - set(out))
    if missing:
        raise SglangExportError(f"the draft lacks weights SGLang needs: {missing[:8]}")
    return out


def export_sglang(draft_dir: str | Path, card: TargetCard, out_dir: str | Path) -> Path:
    """Write the SGLang copy of the draft in draft_dir to out_dir (replaced whole); returns out_dir."""
    # safetensors / torch load on first use: benchmark.run imports this module for every engine
    from safetensors.torch import save_file

    draft_dir, out_dir = Path(draft_dir), Path(out_dir)
    config = json.loads((draft_dir / "config.json").read_text())
    check_exportable(config, card)
    weights = sglang_weights(read_weights(draft_dir))
    dtype = str(weights["fc.weight"].dtype).removeprefix("torch.")
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(
        {k: v.contiguous() for k, v in weights.items()},
        str(tmp / "model.safetensors"),
        metadata={"format": "pt"},
    )
    (tmp / "config.json").write_text(
        json.dumps(sglang_config(config, card, dtype), indent=2) + "\n"
    )
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


@entry_point
def main(argv: list[str]) -> None:
    if len(argv) != 3:
        raise DraftlineError("usage: draftline export-sglang DRAFT_DIR CARD_JSON OUT_DIR")
    try:
        out = export_sglang(argv[0], TargetCard.load(argv[1]), argv[2])
    except (SglangExportError, FileNotFoundError) as err:
        raise SglangExportError(f"error: {argv[0]} cannot be served by SGLang: {err}") from None
    log.info(
        f"{out}: serve with --speculative-algorithm EAGLE3 --speculative-draft-model-path {out.resolve()}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
