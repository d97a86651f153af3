"""What shaped a regenerated line: the settings recorded with it and their fingerprint, and the
engine that answered (provenance, never compared)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from draftline.core.config import output_shaping
from draftline.core.derivation import Derivation, derive, weights_digest
from draftline.regenerate.config import RegenerateConfig

if TYPE_CHECKING:
    from draftline.core.card import TargetCard


# Regenerate params recorded per line as the engine's provenance (all operational in regenerate/config.py):
# which engine answered and how it was launched or scheduled. Never compared.
ENGINE_FIELDS = (
    "backend",
    "external_engine",
    "extra_args",
    "tensor_parallel_size",
    "data_parallel_size",
    "max_model_len",
    "continuous_batching",
    "cb_num_blocks",
    "hf",
    "server_slots",
    "served_model_name",
)

# Launch arguments (vLLM, SGLang) that change how the server samples or renders a prompt when a
# request leaves it unset: the one part of `extra_args` that is compared (`answer_shaping_args`).
ANSWER_SHAPING_ARGS = (
    "--generation-config",
    "--override-generation-config",
    "--logits-processors",
    "--default-chat-template-kwargs",
    "--preferred-sampling-params",
    "--sampling-defaults",
)


def _sha256(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def prompt_sha256(row: dict) -> str:
    """Hash of what the target is asked (messages and tools): a changed prompt is regenerated."""
    return _sha256({"messages": row["messages"], "tools": row.get("tools")})[:16]


def fingerprint(settings: dict) -> str:
    """Hash of everything that shapes the answers (target, chat template, sampling)."""
    return _sha256(settings)[:16]


def answer_shaping_args(extra_args: list[str]) -> list[list[str]]:
    """The ANSWER_SHAPING_ARGS of a launch command's extra arguments, each [flag, values...]."""
    found, current = [], None
    for arg in extra_args:
        flag, eq, value = arg.partition("=")
        if arg.startswith("--"):
            current = [flag, *([value] if eq else [])] if flag in ANSWER_SHAPING_ARGS else None
            if current is not None:
                found.append(current)
        elif current is not None:
            current.append(arg)
    return found


# the settings that are no regenerate param: answer_derivation's, as digests
DERIVED = ("target_weights", "generation_config", "code", "pins")

# what a rerun calls a changed setting (the others by their param's name)
SETTING_NAMES = {
    "model": "target",
    "revision": "target revision",
    "target_weights": "target weights",
    "generation_config": "target generation config",
    "chat_template_sha256": "chat template",
    "code": "the code that shapes them",
    "pins": "environment pins",
}


def generation_config_digest(model: str) -> str | None:
    """sha256 of a local target's generation_config.json, its keys sorted: the decoding defaults
    every engine applies to what a request leaves unset (the batch server's logits processors:
    repetition_penalty...; transformers serve's do_sample, top_k; vLLM's --generation-config
    auto). None for a hub id (its revision names it) or a target without one."""
    path = Path(model) / "generation_config.json"
    if not path.is_file():
        return None
    try:
        data = json.dumps(json.loads(path.read_text()), sort_keys=True).encode()
    except ValueError:  # not JSON: its bytes
        data = path.read_bytes()
    return hashlib.sha256(data).hexdigest()


def answer_derivation(card: TargetCard) -> Derivation:
    """The share of the answers' key (draftline/core/derivation.py) that is not a regenerate
    param: the target's weights and generation config, the code that shapes the answers
    (SHAPES["regenerate"]: the replay, the requests, the batch server's decoding) and the pins of
    the engines that answer (the batch server's torch and transformers, the vLLM environment's
    pins)."""
    return derive(
        "regenerate",
        params={},
        inputs={
            "target_weights": weights_digest(card.model),
            "generation_config": generation_config_digest(card.model),
        },
        vllm=True,
    )


def regeneration_settings(cfg: RegenerateConfig, card: TargetCard) -> dict:
    """Everything that shapes the answers: the target, its weights and generation config, its
    chat template, the output-shaping regenerate params (draftline/regenerate/config.py), the
    answer-shaping launch arguments, the code that shapes the answers and the engines' pins
    (`answer_derivation`, as short digests: every line records them). A line made under other
    settings is superseded and its conversation sent again."""
    parts = answer_derivation(card).parts
    weights = parts["inputs"]["target_weights"]
    generation = parts["inputs"]["generation_config"]
    return {
        "model": card.model,
        "revision": card.revision,
        "target_weights": weights[:16] if weights else None,
        "generation_config": generation[:16] if generation else None,
        "chat_template_sha256": card.chat_template_sha256,
        **output_shaping(cfg),
        "answer_shaping_args": answer_shaping_args(cfg.extra_args),
        "code": parts["code"][:16],
        "pins": _sha256(parts["pins"])[:16],
    }


def engine_record(cfg: RegenerateConfig, engine: str) -> dict:
    """What answered, recorded per line (`regeneration.engine`) and never compared: switching
    backend, pointing `external` at a server kept running, or new launch arguments keep every
    finished line."""
    return {"engine": engine, **cfg.model_dump(include=set(ENGINE_FIELDS))}


def plain(obj):
    """`obj` as it reads back from JSON (tuples as lists...): what a line records."""
    return json.loads(json.dumps(obj))


@dataclass(frozen=True)
class Wanted:
    """The settings the kept lines must have been made with."""

    fingerprint: str
    settings: dict
    defaults: dict = field(default_factory=dict)  # a field a line does not record: its default


def wanted_settings(cfg: RegenerateConfig, card: TargetCard) -> Wanted:
    """The current settings, and the default of each (what a line made before a field was added
    to the settings was made with)."""
    settings = plain(regeneration_settings(cfg, card))
    defaults = plain(output_shaping(RegenerateConfig()))
    defaults["answer_shaping_args"] = []
    # a line made before the generation config was recorded: taken as made under today's (as
    # migrate.py takes old-format lines as made by today's weights), not regenerated for it
    defaults["generation_config"] = settings["generation_config"]
    return Wanted(fingerprint(settings), settings, defaults)


def predates_settings(regen: dict) -> bool:
    """A `regeneration` record of the format before settings were recorded per line: a fingerprint
    alone (no `settings`, and not accepted for other settings by hand). Only
    draftline/regenerate/migrate.py reads those."""
    return (
        isinstance(regen.get("fingerprint"), str)
        and "settings" not in regen
        and "accepted_for" not in regen
    )


def changed_fields(regen: dict, recorded: dict, wanted: Wanted) -> list[str]:
    """The current settings a line was made without: each compared with what the line records
    (its settings, else its engine record, else the field's default)."""
    engine = regen.get("engine") if isinstance(regen.get("engine"), dict) else {}
    changed = []
    for key, value in wanted.settings.items():
        for source in (recorded, engine, wanted.defaults):
            if key in source:
                if source[key] != value:
                    changed.append(key)
                break
        else:
            changed.append(key)
    return changed
