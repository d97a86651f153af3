"""The target card (`models/target/card.json`): the one place that knows its fields and what they mean.

Every stage after `target` reads the card through `TargetCard.load` and uses attributes, never
string keys. The `target` stage builds it (`draftline/targets/model.py`) and writes it with `write`; the
JSON keeps the field order below, so the file (and everything fingerprinted from it) is stable.

A leaf module: no torch, no transformers, nothing from the project but `io`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftline.core.io import read_json, write_json


@dataclass(frozen=True)
class TargetCard:
    # what `from_pretrained` loads: a local directory or a hub id
    model: str
    # how the target was obtained: "tiny", "gguf:<name>" or "hub-or-local"
    source: str
    revision: str | None
    # the user's explicit choice to run the code a target ships (target.trust_remote_code)
    trust_remote_code: bool
    # the top-level config's first architecture (a multimodal wrapper's, for such a target)
    architecture: str
    # the language model's config type (get_text_config()), and the top-level one
    model_type: str
    config_model_type: str | None
    # shapes of the language model the draft serves
    num_layers: int
    hidden_size: int
    vocab_size: int
    norm_eps: float | None
    tie_word_embeddings: bool
    eos_token_id: int | list[int] | None
    # inputs of these decoder layers feed the draft (vLLM's eagle_aux_hidden_state_layer_ids):
    # id i is the hidden state entering layer i, 0 = embeddings, N = the final output
    aux_layer_ids: tuple[int, ...]
    chat_template_sha256: str
    # the config's quantization_config summary, or None for a dense checkpoint
    quantization: dict | None
    # checkpoint tensor names: {"embed_tokens", "lm_head" (None when tied), "norm"}
    verifier_tensors: dict
    # how the target was built, kept at the card's top level: {"tiny_training": ...} or {"gguf": ...}
    build: dict = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "aux_layer_ids", tuple(int(i) for i in self.aux_layer_ids))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TargetCard:
        names = [f.name for f in dataclasses.fields(cls) if f.name != "build"]
        missing = [n for n in names if n not in data and n != "config_model_type"]
        if missing:
            raise ValueError(f"target card: missing {', '.join(missing)} (rerun the target stage)")
        known = {n: data.get(n) for n in names}
        return cls(**known, build={k: v for k, v in data.items() if k not in known})

    @classmethod
    def load(cls, path: str | Path) -> TargetCard:
        try:
            return cls.from_dict(read_json(path))
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None

    def to_dict(self) -> dict[str, Any]:
        """The card.json object: fields in declaration order, `build` entries after them."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "build"}
        out["aux_layer_ids"] = list(self.aux_layer_ids)
        return {**out, **self.build}

    def write(self, path: str | Path) -> None:
        write_json(path, self.to_dict())

    @property
    def aux_ids(self) -> list[int]:
        """aux_layer_ids as a list (JSON, command lines, comparisons with lists)."""
        return list(self.aux_layer_ids)
