"""The checks of a local train.init directory that load no weights: its config.json, and its
weight files from their headers and sizes. check_params runs them before any stage
(draftline/data/workspace.py), the probe again (draftline/probe/checks.py), and the train stage
reads train.init's config through read_init_config, so a broken checkpoint is named the same
way wherever it is found.

Light at import (no torch, no transformers): check_params imports it.
"""

from __future__ import annotations

import json
from pathlib import Path

from draftline.core.errors import DraftlineError
from draftline.core.io import json_object_problem, safetensors_problem


class InitMismatch(DraftlineError, ValueError):
    """train.init does not fit the target, vocabulary or params; the message names the key."""


def init_config_problem(init: str | Path) -> str | None:
    """What is wrong with train.init's config.json (missing, unreadable, not JSON, not an object),
    as the message naming the param; None when it is one JSON object. `init` as the user wrote it."""
    config_path = Path(init) / "config.json"
    if not config_path.is_file():
        return f"train.init: {init} has no config.json (not a draft checkpoint)"
    if problem := json_object_problem(config_path):
        return f"train.init: {problem}: a corrupt or truncated checkpoint config"
    return None


def init_weights_problem(init: str | Path) -> str | None:
    """What is wrong with the weight files of a train.init directory, found from their headers and
    sizes without loading a tensor: none at all, a shard its index names that is missing, a
    truncated or corrupt file; None when they open. A checkpoint with pytorch_model.bin weights
    only is left to speculators' converter."""
    path = Path(init)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        if problem := json_object_problem(index):
            return f"{problem}: a corrupt or truncated weights index"
        shards = set((json.loads(index.read_text()).get("weight_map") or {}).values())
        if missing := sorted(str(s) for s in shards if not (path / str(s)).is_file()):
            return f"{index} names shards that are missing: {', '.join(missing[:5])}"
    files = sorted(path.glob("*.safetensors"))
    if not files and not any(path.glob("*.bin")):
        return f"{init} has no weights (no model.safetensors): not a whole draft checkpoint"
    for file in files:
        if problem := safetensors_problem(file):
            return f"{problem}: a truncated or corrupt weights file"
    return None


def local_init_problem(init: str | Path) -> str | None:
    """What makes a local train.init directory unusable before any weight is loaded (its config,
    then its weights), as the message naming the param; None when both open."""
    if problem := init_config_problem(init):
        return problem
    if problem := init_weights_problem(init):
        return f"train.init: {problem}"
    return None


def read_init_config(path: Path) -> dict:
    """train.init's config.json as a dict; InitMismatch naming the param, the file and what is
    wrong with it (init_config_problem)."""
    if problem := init_config_problem(path):
        raise InitMismatch(problem)
    return json.loads((Path(path) / "config.json").read_text())
