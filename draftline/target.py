"""The target card: everything downstream stages need to know about the target model.

`card.json` fields: model (what `from_pretrained` loads), source, revision, architecture,
model_type, num_layers, hidden_size, vocab_size, eos_token_id, aux_layer_ids,
chat_template_sha256, and for the tiny target its training stats.

Aux layer ids follow vLLM's `eagle_aux_hidden_state_layer_ids`: id i is the hidden state that
*enters* decoder layer i (HF `output_hidden_states[i]`, 0 = embeddings). Id N (the number of
layers) would be the final output; speculators accepts ids in [0, N].
"""

from __future__ import annotations


from draftline.io import text_sha256


def eagle3_default_aux_ids(num_layers: int) -> list[int]:
    return [2, num_layers // 2, num_layers - 3]


def resolve_aux_layer_ids(explicit: list[int] | None, num_layers: int) -> list[int]:
    """Explicit ids, or the EAGLE-3 rule; either must be 3 distinct ids in [0, num_layers]."""
    ids = list(explicit) if explicit is not None else eagle3_default_aux_ids(num_layers)
    origin = "target.aux_layer_ids" if explicit is not None else f"the EAGLE-3 default {ids}"
    if len(ids) != 3:
        raise ValueError(f"{origin}: EAGLE-3 needs exactly 3 aux layer ids, got {ids}")
    if len(set(ids)) != 3 or min(ids) < 0 or max(ids) > num_layers:
        hint = "" if explicit is not None else "; set target.aux_layer_ids explicitly"
        raise ValueError(
            f"{origin}: ids must be distinct and within [0, {num_layers}] for a target with "
            f"{num_layers} layers, got {ids}{hint}"
        )
    return sorted(ids)


def build_card(model: str, source: str, revision: str | None, aux_layer_ids: list[int] | None, extra: dict) -> dict:
    """Read the model's config and tokenizer (local dir or hub id) into a card."""
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(model, revision=revision)
    text_config = getattr(config, "text_config", None) or config
    tokenizer = AutoTokenizer.from_pretrained(model, revision=revision)
    template = tokenizer.chat_template
    if not template:
        raise ValueError(f"target {model!r} has no chat template; a chat model is required")
    if not isinstance(template, str):  # named templates: hash them all in a stable order
        template = "\n".join(f"{k}:{v}" for k, v in sorted(dict(template).items()))
    num_layers = text_config.num_hidden_layers
    return {
        "model": str(model),
        "source": source,
        "revision": revision,
        "architecture": (config.architectures or ["?"])[0],
        "model_type": text_config.model_type,
        "num_layers": num_layers,
        "hidden_size": text_config.hidden_size,
        "vocab_size": text_config.vocab_size,
        "eos_token_id": tokenizer.eos_token_id,
        "aux_layer_ids": resolve_aux_layer_ids(aux_layer_ids, num_layers),
        "chat_template_sha256": text_sha256(template),
        **extra,
    }


def load_target_model(card: dict, device: str = "cpu", dtype=None, device_map: str | None = None):
    """The target in eval mode: on `device`, or spread over the GPUs by `device_map` ("auto",
    "balanced", ... as accelerate takes them) when it is larger than one GPU. float32 by default."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs = {"revision": card.get("revision"), "dtype": dtype or torch.float32}
    if device_map is not None:
        kwargs["device_map"] = device_map
    model = AutoModelForCausalLM.from_pretrained(card["model"], **kwargs)
    if device_map is None:
        model.to(device)
    return model.eval()


def load_target(card: dict, device: str = "cpu", dtype=None, device_map: str | None = None):
    """(model, tokenizer) for a card, the model as `load_target_model` gives it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(card["model"], revision=card.get("revision"))
    return load_target_model(card, device, dtype, device_map), tokenizer


def resolve_device(choice: str) -> str:
    import torch

    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device: cuda requested but no CUDA device is available")
    return choice

