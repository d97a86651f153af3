"""Building the target card (`draftline/core/card.py`, the fields and their meaning) from a model, and
loading the target it names: config, tokenizer, model, verifier tensors.

Shapes come from the text model's config (`get_text_config()`): a multimodal wrapper (Kimi-K2.5,
Qwen-VL...) keeps its language model under `text_config`, and that is the model the draft serves.
`config_model_type` is the top-level config's type when it differs (the wrapper's).

`trust_remote_code` is the user's explicit choice (target.trust_remote_code): every stage loads
config, tokenizer and model with the card's value, and the launched servers get the matching flag.
A target whose config or tokenizer ships as code (`auto_map`) fails at the `target` stage without
it, with a message naming the param.

`verifier_tensors`: the checkpoint names of the token embeddings, the lm_head (null when tied to the
embeddings) and the final norm of the language model, found in the safetensors index (or single
file) by name, never by loading the model. The draft takes these tensors from exactly these names
(`read_verifier_tensors`); speculators' own loader matches by suffix and silently falls back to a
norm of ones when it finds none.

Aux layer ids follow vLLM's `eagle_aux_hidden_state_layer_ids`: id i is the hidden state that
*enters* decoder layer i (HF `output_hidden_states[i]`, 0 = embeddings). Id N (the number of
layers) would be the final output; speculators accepts ids in [0, N].
"""

from __future__ import annotations

import json
from pathlib import Path

from draftline.core.aux_layers import resolve_aux_layer_ids
from draftline.core.card import TargetCard
from draftline.core.io import text_sha256

TRUST_PARAM = "target.trust_remote_code"


class RemoteCodeRequired(ValueError):
    """The target's config, tokenizer or model ships as code and target.trust_remote_code is false."""


def _remote_code_guard(what: str, model: str, trust_remote_code: bool, load):
    """load(), with transformers' "needs trust_remote_code" error turned into one naming our param."""
    try:
        return load()
    except ValueError as err:
        if trust_remote_code or "trust_remote_code" not in str(err):
            raise
        raise RemoteCodeRequired(
            f"{TRUST_PARAM}: the {what} of target {model!r} ships as custom code (auto_map); running it is "
            f"your explicit choice: read the code, then set {TRUST_PARAM}: true"
        ) from None


def load_config(model: str, revision: str | None = None, trust_remote_code: bool = False):
    """The target's top-level config (a multimodal wrapper's, for those)."""
    # transformers loads on first use: the card and checkpoint maps are read without it
    from transformers import AutoConfig

    return _remote_code_guard(
        "config",
        model,
        trust_remote_code,
        lambda: AutoConfig.from_pretrained(
            model, revision=revision, trust_remote_code=trust_remote_code
        ),
    )


def text_config_of(config):
    """The language model's config: config.text_config for a multimodal wrapper, else config itself."""
    return config.get_text_config(decoder=True)


def text_num_layers(
    model: str, revision: str | None = None, trust_remote_code: bool = False
) -> int:
    """Decoder layers of the target's language model (what aux layer ids index)."""
    return text_config_of(load_config(model, revision, trust_remote_code)).num_hidden_layers


def load_tokenizer(model: str, revision: str | None = None, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    return _remote_code_guard(
        "tokenizer",
        model,
        trust_remote_code,
        lambda: AutoTokenizer.from_pretrained(
            model, revision=revision, trust_remote_code=trust_remote_code
        ),
    )


def card_tokenizer(card: TargetCard):
    """The target's tokenizer, loaded as the card says (revision, trust_remote_code)."""
    return load_tokenizer(card.model, card.revision, card.trust_remote_code)


def build_card(
    model: str,
    source: str,
    revision: str | None,
    aux_layer_ids: list[int] | None,
    extra: dict,
    trust_remote_code: bool = False,
) -> TargetCard:
    """Read the model's config, tokenizer and safetensors index (local dir or hub id) into a card."""
    config = load_config(model, revision, trust_remote_code)
    text_config = text_config_of(config)
    tokenizer = load_tokenizer(model, revision, trust_remote_code)
    template = tokenizer.chat_template
    if not template:
        raise ValueError(f"target {model!r} has no chat template; a chat model is required")
    if not isinstance(template, str):  # named templates: hash them all in a stable order
        template = "\n".join(f"{k}:{v}" for k, v in sorted(dict(template).items()))
    num_layers = text_config.num_hidden_layers
    tied = bool(
        getattr(text_config, "tie_word_embeddings", False)
        or getattr(config, "tie_word_embeddings", False)
    )
    norm_eps = getattr(text_config, "rms_norm_eps", None) or getattr(
        text_config, "layer_norm_eps", None
    )
    card = {
        "model": str(model),
        "source": source,
        "revision": revision,
        "trust_remote_code": bool(trust_remote_code),
        "architecture": (config.architectures or ["?"])[0],
        "model_type": text_config.model_type,
        "config_model_type": config.model_type,
        "num_layers": num_layers,
        "hidden_size": text_config.hidden_size,
        "vocab_size": text_config.vocab_size,
        "norm_eps": norm_eps,
        "tie_word_embeddings": tied,
        "eos_token_id": tokenizer.eos_token_id,
        "aux_layer_ids": resolve_aux_layer_ids(aux_layer_ids, num_layers),
        "chat_template_sha256": text_sha256(template),
    }
    card["quantization"] = quantization_of(config)
    card["verifier_tensors"] = find_verifier_tensors(model, revision, card)
    return TargetCard.from_dict({**card, **extra})


def quantization_of(config) -> dict | None:
    """The checkpoint's quantization as its config declares it ({"quant_method", "format"}), e.g.
    compressed-tensors pack-quantized for published INT4 MoE targets; None for plain weights.
    vLLM and SGLang read it from config.json themselves (no --quantization flag is passed)."""
    quant = getattr(config, "quantization_config", None)
    if quant is None:
        return None
    quant = quant if isinstance(quant, dict) else quant.to_dict()
    return {"quant_method": quant.get("quant_method"), "format": quant.get("format")}


# ---- verifier tensors: embeddings, lm_head, final norm, by name from the checkpoint -------------

_EMBED_SUFFIXES = (
    "embed_tokens.weight",
    "tok_embeddings.weight",
    "embeddings.word_embeddings.weight",
    "wte.weight",
)
_HEAD_SUFFIXES = ("lm_head.weight", "output.weight")
_NORM_NAMES = ("norm.weight", "final_layernorm.weight", "norm_f.weight", "ln_f.weight")


def _checkpoint_file(model: str, name: str, revision: str | None) -> Path | None:
    """A file of a local checkpoint directory or of a hub repository (None when it has none)."""
    root = Path(model)
    if root.is_dir():
        return root / name if (root / name).is_file() else None
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        return Path(hf_hub_download(model, name, revision=revision))
    except EntryNotFoundError:
        return None


def checkpoint_weight_map(model: str, revision: str | None = None) -> dict[str, str]:
    """{tensor name: file} from model.safetensors.index.json, or from the single model.safetensors."""
    from safetensors import safe_open

    index = _checkpoint_file(model, "model.safetensors.index.json", revision)
    if index is not None:
        return dict(json.loads(index.read_text())["weight_map"])
    single = _checkpoint_file(model, "model.safetensors", revision)
    if single is None:
        raise FileNotFoundError(
            f"target {model!r}: no model.safetensors.index.json or model.safetensors; the verifier "
            "tensors (embeddings, lm_head, final norm) are read from safetensors checkpoints"
        )
    with safe_open(str(single), framework="pt") as f:
        return dict.fromkeys(f.keys(), "model.safetensors")


def _shape(model: str, revision: str | None, weight_map: dict[str, str], name: str) -> list[int]:
    """A tensor's shape from its file's header: a local or cached file is opened; a hub shard not
    downloaded yet has its header read alone (an HTTP range request, not the shard's gigabytes)."""
    from safetensors import safe_open

    filename = weight_map[name]
    if not Path(model).is_dir():
        from huggingface_hub import parse_safetensors_file_metadata, try_to_load_from_cache

        cached = try_to_load_from_cache(model, filename, revision=revision)
        if not isinstance(cached, str):
            return list(
                parse_safetensors_file_metadata(model, filename, revision=revision)
                .tensors[name]
                .shape
            )
    with safe_open(str(_checkpoint_file(model, filename, revision)), framework="pt") as f:
        return list(f.get_slice(name).get_shape())


def find_verifier_tensors(model: str, revision: str | None, card: dict) -> dict:
    """Checkpoint names of the language model's embeddings, lm_head (None = tied) and final norm.

    The embeddings are the shortest name ending in embed_tokens.weight (or a known alias) whose
    shape is [vocab, hidden]; the final norm is the norm directly under the same prefix
    (`language_model.model.` for a wrapper, `model.` for a plain causal LM), so a vision tower's
    or an MTP layer's norm never matches; lm_head the shortest name ending in lm_head.weight with
    shape [vocab, hidden]. Each choice is checked against the text config's shapes.
    """
    weight_map = checkpoint_weight_map(model, revision)
    V, H = card["vocab_size"], card["hidden_size"]

    def shortest(suffixes, shape):
        found = sorted(
            (k for k in weight_map if k.endswith(suffixes) and ".layers." not in k), key=len
        )
        return next((k for k in found if _shape(model, revision, weight_map, k) == shape), None)

    embed = shortest(_EMBED_SUFFIXES, [V, H])
    if embed is None:
        raise ValueError(
            f"target {model!r}: no token embeddings of shape [{V}, {H}] (a name ending in "
            f"{' / '.join(_EMBED_SUFFIXES)}) in its safetensors checkpoint"
        )
    prefix = embed[: len(embed) - len(next(s for s in _EMBED_SUFFIXES if embed.endswith(s)))]
    norm = next(
        (
            prefix + n
            for n in _NORM_NAMES
            if prefix + n in weight_map and _shape(model, revision, weight_map, prefix + n) == [H]
        ),
        None,
    )
    if norm is None:
        raise ValueError(
            f"target {model!r}: no final norm of shape [{H}] next to its embeddings "
            f"({' / '.join(prefix + n for n in _NORM_NAMES)}) in its safetensors checkpoint"
        )
    head = shortest(_HEAD_SUFFIXES, [V, H])
    if head is None and not card["tie_word_embeddings"]:
        raise ValueError(
            f"target {model!r}: no lm_head of shape [{V}, {H}] in its safetensors checkpoint, and its "
            "config does not tie the word embeddings"
        )
    return {"embed_tokens": embed, "lm_head": head, "norm": norm}


def read_verifier_tensors(card: TargetCard) -> dict:
    """{"embed_tokens", "lm_head", "norm"} tensors of the card's target, read by their recorded
    names (lm_head = the embeddings when tied); only these tensors are read."""
    from safetensors import safe_open

    names = card.verifier_tensors
    weight_map = checkpoint_weight_map(card.model, card.revision)
    out = {}
    for role in ("embed_tokens", "lm_head", "norm"):
        name = names[role] or names["embed_tokens"]
        if name not in weight_map:
            raise ValueError(
                f"target {card.model!r}: tensor {name!r} recorded in the card is not in its checkpoint; "
                "rerun the target stage"
            )
        with safe_open(
            str(_checkpoint_file(card.model, weight_map[name], card.revision)), framework="pt"
        ) as f:
            out[role] = f.get_tensor(name)
    return out


def load_target_model(
    card: TargetCard, device: str = "cpu", dtype=None, device_map: str | None = None
):
    """The target in eval mode: on `device`, or spread over the GPUs by `device_map` ("auto",
    "balanced", ... as accelerate takes them) when it is larger than one GPU. float32 by default."""
    import torch
    from transformers import AutoModelForCausalLM

    trust = card.trust_remote_code
    kwargs = {
        "revision": card.revision,
        "dtype": dtype or torch.float32,
        "trust_remote_code": trust,
    }
    if device_map is not None:
        kwargs["device_map"] = device_map
    model = _remote_code_guard(
        "model",
        card.model,
        trust,
        lambda: AutoModelForCausalLM.from_pretrained(card.model, **kwargs),
    )
    if device_map is None:
        model.to(device)
    return model.eval()


def load_target(card: TargetCard, device: str = "cpu", dtype=None, device_map: str | None = None):
    """(model, tokenizer) for a card, the model as `load_target_model` gives it."""
    return load_target_model(card, device, dtype, device_map), card_tokenizer(card)
