"""What a draft checkpoint says about itself (config.json, d2t/t2d and the fc shape; no weights
are loaded): the facts draftline/preflight.py checks against the target card and the engines."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SPECULATORS_EAGLE3 = "eagle3"


@dataclass(frozen=True)
class DraftFacts:
    """What preflight needs to know about a draft checkpoint."""

    path: str
    layout: str  # "speculators" (Eagle3DraftModel config) or "eagle" (flat LlamaForCausalLMEagle3-style config)
    algorithm: str  # "eagle3" for an EAGLE-3 draft
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


def _weights(draft_dir: Path) -> dict:
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


def read_draft_facts(draft_dir: str | Path) -> DraftFacts:
    draft_dir = Path(draft_dir)
    config_path = draft_dir / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{config_path}: no draft config (is this a draft checkpoint directory?)")
    with open(config_path) as f:
        cfg = json.load(f)
    weights = _weights(draft_dir)
    architectures = tuple(cfg.get("architectures") or ())
    if "speculators_model_type" in cfg:
        layer = cfg.get("transformer_layer_config") or {}
        layout, algorithm = "speculators", cfg["speculators_model_type"]
        aux = cfg.get("eagle_aux_hidden_state_layer_ids")
        hidden = cfg.get("target_hidden_size") or layer.get("hidden_size")
        vocab = layer.get("vocab_size")
        methods = (cfg.get("speculators_config") or {}).get("proposal_methods") or [{}]
        spec_tokens = methods[0].get("speculative_tokens")
    else:
        layout = "eagle"
        algorithm = "eagle3" if any("eagle3" in a.lower() for a in architectures) or "draft_vocab_size" in cfg else "eagle"
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
        t2d_true=frozenset(int(i) for i in t2d.bool().nonzero().flatten().tolist()) if t2d is not None else None,
        speculative_tokens=spec_tokens,
    )
