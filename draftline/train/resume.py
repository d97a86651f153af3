"""Resume state of the builtin training loop: what a run saves, and when a rerun may continue it.

Every `checkpoint_every_steps` optimizer steps and at each epoch end, one file (state.pt, written
atomically) holds the trainable weights, optimizer, scheduler, step, epoch, position in the
epoch's packing plan, RNG states, partial-epoch metric sums, the history and the best epoch so
far, plus the key of what made it and the key's parts (`run_derivation`, draftline/core/derivation.py:
params, the target's weights, data, init, draft vocabulary, device, the code that shapes the state,
pins). A rerun with the same key continues from it, after checking that its weights fit the draft;
another key starts fresh and says what changed. A finished run keeps its final state beside
last_run.json: a rerun under the same key then trains nothing. A finished run leaves only last_run.json.
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from draftline.core.config import kind_of
from draftline.core.derivation import Derivation, derive, superseded, weights_digest
from draftline.core.io import write_json
from draftline.core.shaping import shaping_fingerprint
from draftline.train.config import TrainConfig

if TYPE_CHECKING:
    from draftline.core.card import TargetCard

log = logging.getLogger(__name__)

STATE_FILE = "state.pt"
LAST_RUN_FILE = "last_run.json"
# Params that change how often state is saved or how the speculators hand-off is launched,
# never the weights the builtin loop produces: a resume may differ in them (train/config.py).
NOT_IN_FINGERPRINT = tuple(
    sorted(n for n in TrainConfig.model_fields if kind_of(TrainConfig, n) == "operational")
)


@dataclass(frozen=True)
class Resume:
    """Where a train run keeps its resume state, the key (run_fingerprint) a saved state must carry
    to be continued, and the key's parts (run_derivation), saved beside it so that a rerun names
    what changed."""

    state_dir: Path
    fingerprint: str
    derivation: Derivation | None = None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)


def shaping_code() -> str:
    """The fingerprint of the code that shapes the resume state (SHAPES["train"]); a saved state
    records it too, so that a rerun can say why it starts fresh."""
    return shaping_fingerprint("train")


def run_derivation(
    params: dict, card: TargetCard, inputs: dict, device: str, vllm: bool = False
) -> Derivation:
    """What a resume state must match (draftline/core/derivation.py): every param that shapes the
    weights, the target and its weights, `inputs` (the data, the init draft, the draft
    vocabulary: their digests), the device, the code that shapes the state and the pins (vLLM's
    too where an online vLLM server makes the states)."""
    kept = {k: v for k, v in params.items() if k not in NOT_IN_FINGERPRINT}
    target = {"model": card.model, "revision": card.revision}
    inputs = {"target": target, "target_weights": weights_digest(card.model), **inputs}
    return derive("train", params=kept, inputs=inputs, resolved={"device": device}, vllm=vllm)


def run_fingerprint(
    params: dict,
    card: TargetCard,
    data_sha256: str,
    init_sha256: str | None,
    device: str,
    vocab_sha256: str | None = None,
) -> str:
    """The key of run_derivation (the builtin loop without an online vLLM server)."""
    inputs = {"data": data_sha256, "init": init_sha256, "vocab": vocab_sha256}
    return run_derivation(params, card, inputs, device).key


def rng_states() -> dict:
    """RNG states as tensors, ints, strings and tuples only: what torch.load(weights_only=True) reads."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    states = {
        "python": random.getstate(),
        "numpy": (
            str(name),
            torch.from_numpy(keys.astype(np.int64)),
            int(pos),
            int(has_gauss),
            float(cached),
        ),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    name, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state(
        (name, np.asarray(keys, dtype=np.int64).astype(np.uint32), pos, has_gauss, cached)
    )
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save_state(state_dir: Path, state: dict) -> None:
    """Write atomically: a kill during the write leaves the previous state intact."""
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = state_dir / f".{STATE_FILE}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, state_dir / STATE_FILE)


def load_state(state_dir: Path, fingerprint: str, wanted: Derivation | None = None) -> dict | None:
    path = Path(state_dir) / STATE_FILE
    if not path.is_file():
        return None
    # weights_only: tensors and plain containers, no pickled code. The file may come from a shared
    # DVC remote (`dvc pull`); a full unpickle would run whatever a tampered copy carries.
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - UnpicklingError, or anything a damaged file raises
        log.warning(
            f"{path}: not loadable as plain tensors and containers (tampered, damaged, or from an older version: "
            f"{type(err).__name__}); ignored, starting fresh"
        )
        return None
    if not isinstance(state, dict) or state.get("fingerprint") != fingerprint:
        recorded = state.get("key") if isinstance(state, dict) else None
        if wanted is not None:
            log.info(
                f"{path}: {superseded(wanted.changed(recorded), 1, 'state', 'set aside')}; starting fresh"
            )
        else:
            log.info(f"{path}: made with other params, data, init or code; starting fresh")
        return None
    return state


def check_state_fits(state: dict, model, path: Path) -> None:
    """The saved weights must be the draft's trainable weights, name for name and shape for shape
    (the state holds no frozen tensor, so it loads with strict=False): a mismatch (another draft
    vocabulary, say) stops the run instead of resuming a draft it does not fit."""
    own = {n: tuple(p.shape) for n, p in model.named_parameters() if p.requires_grad}
    saved = {n: tuple(t.shape) for n, t in state["model"].items()}
    if saved != own:
        differ = sorted(n for n in set(own) | set(saved) if own.get(n) != saved.get(n))
        shown = "; ".join(f"{n}: saved {saved.get(n)}, draft {own.get(n)}" for n in differ[:4])
        raise RuntimeError(
            f"error: {path} does not fit the draft being trained ({shown}); its key matched, so "
            "what made it was not all in the key: delete it to train fresh"
        )


def finish_state(state_dir: Path, summary: dict) -> None:
    """The run is complete: a small record of it beside its final state, which stays (saved at the
    last epoch's end): a rerun under the same key (a log line or a report edited: the stage is
    stale, what it makes is not) resumes at the end and writes the same draft without training."""
    write_json(Path(state_dir) / LAST_RUN_FILE, summary)


def trainable_state(model) -> dict[str, torch.Tensor]:
    return {
        n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad
    }
