"""The EAGLE-3 draft model: speculators' Eagle3DraftModel built from the target card (or its first
layer started from a target decoder layer), and saved in the format vLLM serves.

What comes from the target: the draft decoder's shape (create_transformer_layer_config over the
target's config), the token embeddings, the lm_head rows of the draft vocabulary (t2d), and the
target's final norm (`verifier_norm`, used to turn the stored last hidden state into the teacher
logits). Embeddings and lm_head are frozen unless train.train_embeddings / train.train_lm_head;
the verifier norm and lm_head are always frozen.

Fine-tuning an existing checkpoint (train.init) is draftline/draft/pretrained.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from draftline.draft.checkpoint import load_verifier_tensors, load_vocab
from draftline.draft.forward import eager_masks
from draftline.draft.methods import drafter
from draftline.targets.model import _checkpoint_file, card_tokenizer, checkpoint_weight_map

if TYPE_CHECKING:
    from draftline.core.card import TargetCard
    from draftline.draft.spec import DraftSpec


# ---------------------------------------------------------------- building the draft


def draft_layer_config(card: TargetCard, num_layers: int, arch: str = "llama"):
    """The draft's decoder config (llama for EAGLE-3 and P-EAGLE, qwen3 for DFlash, whose decoder
    layer is Qwen3's), shaped from the target (full attention everywhere)."""
    # speculators (with transformers) loads on first use: importing the draft model needs only torch
    from speculators.train.cli import create_transformer_layer_config

    return create_transformer_layer_config(
        verifier_name_or_path=card.model,
        num_layers=num_layers,
        draft_arch=arch,
        hidden_act="silu",
        sliding_window=4096,
        full_attention_indices=list(range(num_layers)),
        trust_remote_code=card.trust_remote_code,
    )


def speculators_config(card: TargetCard, speculative_tokens: int, algorithm: str):
    """Algorithm, greedy proposal with its token count, and the verifier: what vLLM reads."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    return SpeculatorsConfig(
        algorithm=algorithm,
        proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=speculative_tokens)],
        default_proposal_method="greedy",
        verifier=VerifierConfig.from_pretrained(card.model, revision=card.revision),
    )


def set_trainable(model, train_embeddings: bool, train_lm_head: bool) -> None:
    model.embed_tokens.weight.requires_grad_(train_embeddings)
    model.lm_head.weight.requires_grad_(train_lm_head)
    model.verifier_lm_head.weight.requires_grad_(False)
    model.verifier_norm.weight.requires_grad_(False)
    if hasattr(model.config, "embed_requires_grad"):  # DFlash's embeddings are the target's
        model.config.embed_requires_grad = train_embeddings


def mask_token_id(card: TargetCard, cfg: DraftSpec) -> int:
    """The token P-EAGLE's and DFlash's masked draft positions read: train.mask_token_id, else the
    tokenizer's mask token, else the first embedding row past the tokenizer (one it never emits),
    else its pad / eos / unk token (speculators' order of resolve_mask_token_id)."""
    if cfg.mask_token_id is not None:
        if cfg.mask_token_id >= card.vocab_size:
            raise ValueError(
                f"train.mask_token_id: {cfg.mask_token_id} is past the target's vocabulary "
                f"({card.vocab_size} rows)"
            )
        return cfg.mask_token_id
    tokenizer = card_tokenizer(card)
    if tokenizer.mask_token_id is not None:
        return int(tokenizer.mask_token_id)
    if len(tokenizer) < card.vocab_size:
        return len(tokenizer)
    for name in ("pad_token_id", "eos_token_id", "unk_token_id"):
        if getattr(tokenizer, name, None) is not None:
            return int(getattr(tokenizer, name))
    raise ValueError(
        f"train.mask_token_id: target {card.model!r} has no mask, pad, eos or unk token and no "
        "embedding row past its tokenizer; set the id to use"
    )


def method_mask_token_id(card: TargetCard, cfg: DraftSpec) -> int | None:
    """mask_token_id for a method whose draft positions read a mask token, else None (the
    tokenizer is not read)."""
    return mask_token_id(card, cfg) if drafter(cfg.method).masked else None


def method_config_fields(card: TargetCard, cfg: DraftSpec) -> dict:
    """The fields of train.method's speculators config beyond the shared ones."""
    return drafter(cfg.method).config_fields(card, cfg, method_mask_token_id(card, cfg))


def build_draft(card: TargetCard, vocab_dir: Path, cfg: DraftSpec, attn_impl: str = "eager"):
    """A fresh draft of train.method and the train params' shape (decoder layers, norms,
    speculative tokens, what is trainable) with embeddings, lm_head (masked to the draft vocab)
    and norm from the target."""
    # what speculators' <Method>DraftModel.from_training_args builds, with the verifier tensors
    # taken from the card's names (load_verifier_tensors)
    method = drafter(cfg.method)
    model_class, config_class = method.classes()
    d2t, t2d = load_vocab(vocab_dir)
    layer_config = draft_layer_config(card, cfg.num_layers, method.decoder)
    layer_config._attn_implementation = attn_impl  # noqa: SLF001
    config = config_class(
        transformer_layer_config=layer_config,
        draft_vocab_size=int(d2t.shape[0]),
        speculators_config=speculators_config(card, method.speculative_tokens(cfg), method.name),
        **method_config_fields(card, cfg),
    )
    model = model_class(config)
    model.load_vocab_mappings(t2d, d2t)
    load_verifier_tensors(model, card)
    set_trainable(model, cfg.train_embeddings, cfg.train_lm_head)
    eager_masks(model)
    return model


LAYER_PARTS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
    "input_layernorm",
    "post_attention_layernorm",
)


def init_layer_from_target(model, card: TargetCard, layer: int | str) -> str:
    """Start the draft's first decoder layer from target decoder layer `layer` (train.init_layer_from_target).

    The draft layer reads cat(norm(embedding), norm(hidden)): the target's q/k/v weights go to the
    hidden half (the embedding half keeps its random init, so the next token still gets in), o_proj,
    the MLP and both norms are copied (the target's input norm serves both halves). When `layer` is
    an aux layer, the fc starts as the pass-through of the state entering it. That is a start, not
    the target's computation: the draft at position p reads that state at position p-1 and predicts
    token p+1 (the target layer at p-1 works towards token p), the random embedding half adds to
    q/k/v, the target's later layers have no counterpart, and the draft's own norm before lm_head
    starts at ones (the target's final norm is verifier_norm, for the teacher logits only).
    Returns a note for the report."""
    from safetensors import safe_open

    if layer == "last_aux":
        layer = card.aux_layer_ids[-1]
    if not 0 <= layer < card.num_layers:
        raise ValueError(
            f"train.init_layer_from_target: {layer} is not a decoder layer of the target (0..{card.num_layers - 1})"
        )
    weight_map = checkpoint_weight_map(card.model, card.revision)
    suffix = f"layers.{layer}.self_attn.q_proj.weight"
    found = [
        n for n in weight_map if n.endswith(suffix) and "visual" not in n and "vision" not in n
    ]
    if len(found) != 1:
        raise ValueError(
            f"train.init_layer_from_target: no single `{suffix}` in {card.model!r}'s checkpoint ({found})"
        )
    prefix = found[0][: -len("self_attn.q_proj.weight")]
    draft = model.layers[0]
    H = card.hidden_size
    with torch.no_grad():
        for part in LAYER_PARTS:
            name = f"{prefix}{part}.weight"
            if name not in weight_map:
                raise ValueError(
                    f"train.init_layer_from_target: {name!r} is not in the target checkpoint"
                )
            with safe_open(
                str(_checkpoint_file(card.model, weight_map[name], card.revision)), framework="pt"
            ) as f:
                tensor = f.get_tensor(name).float()
            module = draft.get_submodule(part)
            if part.endswith(("q_proj", "k_proj", "v_proj")):
                if module.weight.shape != (tensor.shape[0], 2 * H):
                    raise ValueError(
                        f"train.init_layer_from_target: {part} {tuple(tensor.shape)} does not fit the draft's "
                        f"{tuple(module.weight.shape)}"
                    )
                module.weight[:, H:] = tensor
            else:
                if module.weight.shape != tensor.shape:
                    raise ValueError(
                        f"train.init_layer_from_target: {part} {tuple(tensor.shape)} does not fit the draft's "
                        f"{tuple(module.weight.shape)}"
                    )
                module.weight.copy_(tensor)
                if part == "input_layernorm":
                    draft.hidden_norm.weight.copy_(tensor)
        if layer in card.aux_layer_ids:
            slot = card.aux_layer_ids.index(layer)
            model.fc.weight.zero_()
            model.fc.weight[:, slot * H : (slot + 1) * H] = torch.eye(H)
            return f"decoder layer from target layer {layer}; fc passes aux slot {slot} through"
    return f"decoder layer from target layer {layer}; fc random (layer {layer} is not an aux layer)"


# ---------------------------------------------------------------- output


def vllm_speculator_fields(config: dict) -> dict:
    """What vLLM's speculators config reader takes from a speculators-format config.json
    (vllm/transformers_utils/configs/speculators: base.py, and update_eagle3 / update_peagle /
    update_dflash in algos.py), with the speculative config it turns the method into (each
    drafter's vllm_speculative) and the method's own fields."""
    spec = config["speculators_config"]
    layer = config["transformer_layer_config"]
    method = drafter(config["speculators_model_type"])
    return {
        "method": method.name,
        "vllm_method": method.vllm_speculative()["method"],
        "parallel_drafting": method.parallel,
        "num_speculative_tokens": spec["proposal_methods"][0]["speculative_tokens"],
        "verifier": spec["verifier"]["name_or_path"],
        "draft_model_type": layer["model_type"],
        "target_vocab_size": layer["vocab_size"],
        "hidden_size": layer["hidden_size"],
        "draft_vocab_size": config["draft_vocab_size"],
        **method.vllm_fields(config),
    }


def save_draft(model, out_dir: Path) -> dict:
    """Speculators format (config.json + model.safetensors); returns the fields vLLM will read."""
    out_dir = Path(out_dir)
    model.to("cpu").save_pretrained(out_dir)
    fields = vllm_speculator_fields(json.loads((out_dir / "config.json").read_text()))
    if fields["draft_model_type"] not in ("llama", "qwen3") or (
        drafter(fields["method"]).masked and fields.get("mask_token_id") is None
    ):
        raise ValueError(f"{out_dir}/config.json is not a speculator vLLM can serve: {fields}")
    return fields
