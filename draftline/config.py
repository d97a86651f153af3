"""Typed, validated params.yaml.

Every section is a pydantic model with ``extra="forbid"``: an unknown key or a bad value fails
before any stage does work, with a message naming the dotted key. Stages call
``load_params()`` first thing, before importing torch, so a bad file fails in about a second.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TinyTargetConfig(Section):
    """The embedded chat model built when ``target.model: tiny``."""

    layers: int = Field(6, ge=4)  # decoder layers; aux ids need at least 4
    hidden_size: int = Field(128, ge=16)
    heads: int = Field(4, ge=1)
    kv_heads: int = Field(2, ge=1)
    intermediate_size: int = Field(384, ge=16)
    vocab_size: int = Field(640, ge=128)  # BPE vocabulary incl. special tokens
    corpus_conversations: int = Field(6000, ge=100)  # generated training conversations
    train_steps: int = Field(900, ge=1)
    batch_size: int = Field(32, ge=1)
    seq_len: int = Field(160, ge=32)  # training window, tokens
    lr: float = Field(3e-3, gt=0)
    seed: int = 1234

    @model_validator(mode="after")
    def _heads_divide(self):
        if self.hidden_size % self.heads or self.heads % self.kv_heads:
            raise ValueError("hidden_size must be divisible by heads, and heads by kv_heads")
        return self


class TargetConfig(Section):
    model: str = "tiny"  # "tiny", a hub model id, or a local directory
    revision: str | None = None  # hub revision pin (ignored for tiny / local paths)
    # Decoder-layer indices whose *input* is captured (vLLM's eagle_aux_hidden_state_layer_ids).
    # null = the EAGLE-3 rule [2, N//2, N-3]; give them explicitly when the rule is invalid.
    aux_layer_ids: list[int] | None = None
    tiny: TinyTargetConfig = TinyTargetConfig()


class DatasetSpec(Section):
    path: str  # local .jsonl/.json/.parquet file, or a hub dataset id
    format: Literal["auto", "sharegpt", "openai", "alpaca", "prompt"] = "auto"
    split: str = "train"
    name: str | None = None  # hub config name
    revision: str | None = None
    max_rows: int | None = Field(None, ge=1)


class MixConfig(Section):
    # Fraction of `samples` drawn from each dataset; must name exactly the `datasets` keys.
    weights: dict[str, float]
    eval_samples: int = Field(32, ge=1)  # held-out prompts for evaluate/benchmark
    long_threshold_tokens: int = Field(1024, ge=1)  # prompts above this go to the `long` partition


class RegenerateConfig(Section):
    backend: Literal["transformers"] = "transformers"
    continuous_batching: bool = False  # transformers serve --continuous-batching (see serving.py)
    cb_num_blocks: int = Field(16, ge=1)  # KV-cache blocks when continuous batching is on
    host: str = "127.0.0.1"
    port: int = Field(8011, ge=1024, le=65535)
    concurrency: int = Field(32, ge=1)  # short partition
    long_concurrency: int = Field(4, ge=1)  # long partition
    max_tokens: int = Field(128, ge=1)
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = 0
    startup_timeout_s: float = Field(180, gt=0)
    request_timeout_s: float = Field(120, gt=0)
    max_retries: int = Field(3, ge=0)
    max_failure_rate: float = Field(0.05, ge=0, le=1)


class TokenizeConfig(Section):
    max_length: int = Field(1024, ge=8)


class VocabConfig(Section):
    draft_vocab_size: int = Field(256, ge=2)


class HiddenStatesConfig(Section):
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    token_budget: int = Field(4096, ge=16)  # tokens per forward batch
    disk_margin: float = Field(1.1, ge=1.0)  # required free space = estimate x margin


class TrainConfig(Section):
    num_layers: int = Field(1, ge=1)
    epochs: int = Field(4, ge=1)
    lr: float = Field(3e-3, gt=0)
    warmup_steps: int = Field(10, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    ttt_steps: int = Field(3, ge=1)
    ttt_step_loss_decay: float = Field(1.0, gt=0)
    pack_len: int = Field(1024, ge=16)  # tokens per packed batch (speculators CollateFn max_len)
    val_fraction: float = Field(0.1, gt=0, lt=1)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    seed: int = 0


class EvaluateConfig(Section):
    k: int = Field(3, ge=1)  # draft tokens per verification step
    max_new_tokens: int = Field(96, ge=1)
    prompts: int | None = Field(None, ge=1)  # null = every eval prompt
    device: Literal["auto", "cpu", "cuda"] = "auto"


class BenchmarkConfig(Section):
    engine: Literal["hf"] = "hf"
    k: int = Field(3, ge=1)
    max_new_tokens: int = Field(96, ge=1)
    prompts: int = Field(16, ge=1)
    warmup: int = Field(2, ge=0)
    repeats: int = Field(3, ge=1)
    device: Literal["auto", "cpu", "cuda"] = "auto"


class Params(Section):
    samples: int = Field(ge=1)  # training prompts drawn by `mix`
    seed: int = 0
    target: TargetConfig = TargetConfig()
    datasets: dict[str, DatasetSpec]
    mix: MixConfig
    regenerate: RegenerateConfig = RegenerateConfig()
    tokenize: TokenizeConfig = TokenizeConfig()
    vocab: VocabConfig = VocabConfig()
    hidden_states: HiddenStatesConfig = HiddenStatesConfig()
    train: TrainConfig = TrainConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    benchmark: BenchmarkConfig = BenchmarkConfig()

    @model_validator(mode="after")
    def _weights_match_datasets(self):
        if not self.datasets:
            raise ValueError("datasets: at least one dataset is required")
        missing = sorted(set(self.datasets) - set(self.mix.weights))
        unknown = sorted(set(self.mix.weights) - set(self.datasets))
        if missing or unknown:
            raise ValueError(
                f"mix.weights must name exactly the datasets; missing {missing}, unknown {unknown}"
            )
        if any(w < 0 for w in self.mix.weights.values()) or sum(self.mix.weights.values()) <= 0:
            raise ValueError("mix.weights must be non-negative and not all zero")
        return self


class ParamsError(ValueError):
    """A params.yaml that does not validate; the message names every bad key."""


def parse_params(raw: dict) -> Params:
    try:
        return Params.model_validate(raw)
    except ValidationError as err:
        lines = []
        for e in err.errors():
            key = ".".join(str(p) for p in e["loc"]) or "<top level>"
            lines.append(f"  {key}: {e['msg']}")
        raise ParamsError("invalid params.yaml:\n" + "\n".join(lines)) from None


def load_params(path: str | Path = "params.yaml") -> Params:
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: top level must be a mapping")
    return parse_params(raw)


def stage_params(path: str | Path = "params.yaml") -> Params:
    """load_params for a stage's main(): print the error and exit 2 instead of a traceback."""
    try:
        return load_params(path)
    except ParamsError as err:
        raise SystemExit(f"error: {err}") from None
