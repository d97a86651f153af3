"""Reading draft checkpoints: the one place that knows a saved draft's files.

A draft directory in speculators format holds config.json and model.safetensors (or shards named
by model.safetensors.index.json); the draft vocabulary lives beside the target as d2t.npy /
t2d.npy (models/vocab). From here come the weights, the draft's architecture (which norms it
has), the facts preflight checks without loading weights, a content hash of the directory, and
the draft itself loaded for training, evaluation or benchmarking with the verifier tensors it
does not store restored from the target.

Light at import: torch, numpy and safetensors are imported where they are used, so the serving
preflight (draftline/draft/preflight.py) reads a draft's facts without loading torch.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from draftline.core.io import file_sha256
from draftline.draft.init_checks import InitMismatch
from draftline.draft.methods import of_config
from draftline.draft.methods.eagle3 import ARCHITECTURES, ORIGINAL_NORMS
from draftline.targets.model import read_verifier_tensors

if TYPE_CHECKING:
    import torch

    from draftline.core.card import TargetCard
    from draftline.draft.methods import Drafter


# ---------------------------------------------------------------- files of a draft


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """model.safetensors, or the shards its index names."""
    # safetensors / torch load on first use: the probe and preflight read draft facts without them
    from safetensors.torch import load_file

    directory = Path(directory)
    if (directory / "model.safetensors").is_file():
        return load_file(str(directory / "model.safetensors"))
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weights = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            weights.update(load_file(str(directory / shard)))
        return weights
    raise InitMismatch(f"train.init: no model.safetensors in {directory}")


def load_vocab(vocab_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d): d2t[i] is the offset of draft token i (target id = i + d2t[i]); t2d a bool mask."""
    import numpy as np
    import torch

    vocab_dir = Path(vocab_dir)
    return torch.from_numpy(np.load(vocab_dir / "d2t.npy")), torch.from_numpy(
        np.load(vocab_dir / "t2d.npy")
    )


def dir_sha256(directory: Path, patterns=("*.json", "*.safetensors")) -> str:
    """Hash of a checkpoint directory's config and weight files (names and contents)."""
    h = hashlib.sha256()
    for pattern in patterns:
        for path in sorted(Path(directory).glob(pattern)):
            h.update(f"{path.name}:{file_sha256(path)}\n".encode())
    return h.hexdigest()


def architecture_of(config) -> str | None:
    """The ARCHITECTURES name (train.architecture, the EAGLE-3 norm layouts:
    draftline/draft/methods/eagle3.py) of a draft config (object or dict), None for another
    combination."""
    get = config.get if isinstance(config, dict) else (lambda key: getattr(config, key, None))
    if get("fc_norm"):
        return None
    flags = {key: bool(get(key)) for key in ARCHITECTURES[ORIGINAL_NORMS]}
    return next((name for name, arch in ARCHITECTURES.items() if arch == flags), None)


# ---------------------------------------------------------------- facts for preflight


@dataclass(frozen=True)
class DraftFacts:
    """What preflight needs to know about a draft checkpoint."""

    path: str
    layout: str  # "speculators" (Eagle3DraftModel config) or "eagle" (flat LlamaForCausalLMEagle3-style config)
    algorithm: str  # the drafter's name (speculators_model_type), "eagle" for an EAGLE-1/2 draft
    architectures: tuple[str, ...]
    aux_layer_ids: tuple[int, ...] | None  # as written in the config, in that layout's convention
    fc_in_features: int | None  # fc input width = 3 x target hidden size for EAGLE-3
    target_hidden_size: int | None  # what the config says the target's hidden size is
    vocab_size: int | None  # target vocabulary the draft embeds
    draft_vocab_size: int | None
    d2t: list[int] | None
    t2d_len: int | None
    t2d_count: int | None
    t2d_true: frozenset[int] | None
    speculative_tokens: int | None


def _peek_tensors(draft_dir: Path) -> dict:
    """d2t, t2d and fc.weight shape from the safetensors files, without loading other weights."""
    from safetensors import safe_open

    out: dict = {}
    for file in sorted(draft_dir.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            for key in f.keys():
                name = key.split(".", 1)[1] if key.startswith("model.") else key
                if name in ("d2t", "t2d"):
                    out[name] = f.get_tensor(key)
                elif name == "fc.weight":
                    out["fc_shape"] = tuple(f.get_slice(key).get_shape())
    return out


def draft_method(draft_dir: str | Path) -> Drafter:
    """The drafter of a checkpoint (draftline/draft/methods/): its speculators_model_type's, or
    the one whose checkpoints name none for a checkpoint in another layout (EAGLE/SpecForge;
    preflight checks it is one)."""
    config_path = Path(draft_dir) / "config.json"
    if not config_path.exists():
        return of_config({})  # a hub id or a path the engine resolves: checked where it is read
    return of_config(json.loads(config_path.read_text()))


def read_draft_facts(draft_dir: str | Path) -> DraftFacts:
    draft_dir = Path(draft_dir)
    config_path = draft_dir / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(
            f"{config_path}: no draft config (is this a draft checkpoint directory?)"
        )
    with open(config_path) as f:
        cfg = json.load(f)
    weights = _peek_tensors(draft_dir)
    architectures = tuple(cfg.get("architectures") or ())
    if "speculators_model_type" in cfg:
        layer = cfg.get("transformer_layer_config") or {}
        layout, algorithm = "speculators", cfg["speculators_model_type"]
        # DFlash names them aux_hidden_state_layer_ids (same convention; vLLM shifts them itself)
        aux = cfg.get("eagle_aux_hidden_state_layer_ids") or cfg.get("aux_hidden_state_layer_ids")
        hidden = cfg.get("target_hidden_size") or layer.get("hidden_size")
        vocab = layer.get("vocab_size")
        methods = (cfg.get("speculators_config") or {}).get("proposal_methods") or [{}]
        spec_tokens = methods[0].get("speculative_tokens")
    else:
        layout, unnamed = "eagle", of_config(cfg)
        # EAGLE-1/2 drafts ("eagle") are no drafter's
        algorithm = unnamed.name if unnamed.reads_flat_config(cfg) else "eagle"
        aux = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        hidden = cfg.get("target_hidden_size") or cfg.get("hidden_size")
        vocab, spec_tokens = cfg.get("vocab_size"), None
    d2t, t2d = weights.get("d2t"), weights.get("t2d")
    return DraftFacts(
        path=str(draft_dir.resolve()),
        layout=layout,
        algorithm=str(algorithm).lower(),
        architectures=architectures,
        aux_layer_ids=tuple(int(i) for i in aux) if aux else None,
        fc_in_features=weights["fc_shape"][1] if "fc_shape" in weights else None,
        target_hidden_size=hidden,
        vocab_size=vocab,
        draft_vocab_size=cfg.get("draft_vocab_size"),
        d2t=d2t.tolist() if d2t is not None else None,
        t2d_len=int(t2d.numel()) if t2d is not None else None,
        t2d_count=int(t2d.bool().sum()) if t2d is not None else None,
        t2d_true=frozenset(int(i) for i in t2d.bool().nonzero().flatten().tolist())
        if t2d is not None
        else None,
        speculative_tokens=spec_tokens,
    )


# ---------------------------------------------------------------- loading a saved draft


def load_verifier_tensors(
    model, card: TargetCard, embed: bool = True, lm_head: bool = True
) -> None:
    """The target's embeddings, lm_head rows of the draft vocabulary (t2d) and final norm, read by
    the names the card recorded (draftline.targets.model.read_verifier_tensors). Replaces speculators'
    load_verifier_weights, which matches names by suffix, falls back to a norm of ones, and reads
    the verifier's config without trust_remote_code. embed / lm_head False keep the model's own
    (trained) ones; verifier_lm_head and verifier_norm always come from the target."""
    import torch

    tensors = read_verifier_tensors(card)
    H = model.hidden_size
    if tensors["norm"].shape != (H,) or tensors["embed_tokens"].shape[1] != H:
        raise ValueError(
            f"target {card.model!r}: verifier tensors {card.verifier_tensors} do not fit a draft of "
            f"hidden size {H}"
        )
    head = tensors["lm_head"]
    if model.use_draft_vocab:
        head = head[model.t2d.to(dtype=torch.bool, device=head.device)]
    with torch.no_grad():
        if embed:
            model.embed_tokens.weight.copy_(tensors["embed_tokens"])
        if lm_head:
            model.lm_head.weight.copy_(head)
        model.verifier_lm_head.weight.copy_(head)
        model.verifier_norm.weight.copy_(tensors["norm"])


def load_saved_draft(directory: Path, card: TargetCard, attn_impl: str = "eager"):
    """A draft saved in speculators format, of the method its config names (EAGLE-3, P-EAGLE,
    DFlash: draftline/draft/methods/), with the verifier tensors it does not store restored from
    the card's target (speculators' from_pretrained would read the verifier's config without
    trust_remote_code and match its tensors by suffix)."""
    from draftline.draft.forward import eager_masks

    raw = json.loads((Path(directory) / "config.json").read_text())
    model_class, config_class = of_config(raw).classes()
    config = config_class.from_pretrained(str(directory))
    config.transformer_layer_config._attn_implementation = attn_impl  # noqa: SLF001
    model = model_class(config)
    eager_masks(model)
    weights = read_weights(directory)
    missing, unexpected = model.load_state_dict(
        {k: v.float() if v.is_floating_point() else v for k, v in weights.items()}, strict=False
    )
    missing = set(missing) - {
        "verifier_lm_head.weight",
        "verifier_norm.weight",
        "embed_tokens.weight",
        "input_norm.weight",
    }
    if missing or unexpected:
        raise ValueError(
            f"{directory}: weights do not fit its config: missing {sorted(missing)[:8]}, "
            f"unexpected {sorted(unexpected)[:8]}"
        )
    load_verifier_tensors(
        model,
        card,
        embed="embed_tokens.weight" not in weights,
        lm_head="lm_head.weight" not in weights,
    )
    return model


def load_draft(draft_dir: str | Path, card: TargetCard, device: str):
    """The saved draft with the target's verifier tensors restored, eager attention, eval mode."""
    # Eager attention from construction on: our incremental decoder passes dense float masks, and
    # the model's own TTT forward (tau_sim) picks its mask builder from this setting in __init__.
    return load_saved_draft(Path(draft_dir), card, "eager").to(device).eval()
