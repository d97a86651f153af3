"""What a rerun of the hidden_states stage keeps, redoes and clears in its output directory.

The directory's meta.json carries the key of what made the states and its parts (`derivation`,
draftline/core/derivation.py: the target and its weights, aux ids, shaping params, the settings
resolved at run time, the code that shapes them and the engine's pins): another key clears the
directory instead of mixing states, and the log names what changed. Otherwise each file is
checked (draftline/hidden_states/files.py) and only the missing or broken ones are redone. The
stage decides what it would remove (`pending_work`) and checks the disk first
(draftline/hidden_states/disk.py), then removes it.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from draftline.core.derivation import Derivation, derive, superseded, weights_digest
from draftline.core.shaping import shaping_fingerprint
from draftline.hidden_states.batches import BATCHES_FILE
from draftline.hidden_states.disk import estimate_bytes
from draftline.hidden_states.files import file_problem, hs_path
from draftline.hidden_states.formats import bytes_per_token, storage_name

if TYPE_CHECKING:
    from draftline.core.card import TargetCard
    from draftline.hidden_states.config import HiddenStatesConfig

log = logging.getLogger(__name__)

VLLM_STAGING = ".vllm_staging"  # where vLLM's connector writes inside the output directory


def shaping_code() -> str:
    """The fingerprint of the code that shapes the states (SHAPES["hidden_states"])."""
    return shaping_fingerprint("hidden_states")


# Params of the stage left out of the files' key, and why:
# - mode, online: `online` stores no files (the train stage makes its states, keyed there); the
#   files of an earlier offline run are kept for a switch back;
# - the other backend's params: vllm.* with backend hf, device and compute_dtype with backend vllm.
NOT_IN_KEY = ("mode", "online")


def resolved_settings(cfg: HiddenStatesConfig, card: TargetCard, aux_ids: list[int]) -> dict:
    """What the stage decides at run time that shapes the stored values, as values (so that
    extract.py's bookkeeping stays out of the key): backend hf, the device type, the dtype the
    target computes in and the padded tokens per forward (a batch's make-up rounds bf16 states);
    backend vllm, the layer ids and stored dtype sent to vLLM and its extra arguments."""
    if cfg.backend == "hf":
        from draftline.core.config import resolve_device
        from draftline.hidden_states.capture import compute_dtype

        device = "cuda" if cfg.device_map else resolve_device(cfg.device)
        dtype = compute_dtype(cfg.compute_dtype, cfg.dtype, device)
        return {
            "backend": "hf",
            "device": device,
            "compute_dtype": str(dtype).removeprefix("torch."),
            "token_budget": cfg.token_budget,
        }
    return {
        "backend": "vllm",
        "layer_ids": [*aux_ids, card.num_layers],
        "dtype": cfg.dtype,
        "extra_args": list(cfg.vllm.extra_args),
    }


def derivation(cfg: HiddenStatesConfig, card: TargetCard, aux_ids: list[int]) -> Derivation:
    """The key of the stored states (draftline/core/derivation.py): the stage's shaping params,
    the target and its weights, the aux ids, the resolved settings, the code that shapes the
    states and the pins of the engine that computes them."""
    from draftline.core.config import output_shaping

    params = {k: v for k, v in output_shaping(cfg).items() if k not in NOT_IN_KEY}
    if cfg.backend == "hf":
        params.pop("vllm", None)
    else:
        params.pop("device", None)
        params.pop("compute_dtype", None)
    inputs = {
        "target": {"model": card.model, "revision": card.revision},
        "target_weights": weights_digest(card.model),
        "shape": {
            "num_layers": card.num_layers,
            "hidden_size": card.hidden_size,
            "aux_layer_ids": list(aux_ids),
        },
        "format": storage_name(cfg.format, cfg.dtype),
    }
    return derive(
        "hidden_states",
        params=params,
        inputs=inputs,
        resolved=resolved_settings(cfg, card, aux_ids),
        vllm=cfg.backend == "vllm",
    )


def remove_temporaries(out: Path) -> None:
    """Temp files and vLLM staging a killed run left (never outputs: finished files are renamed in)."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.tmp"):
        stale.unlink()
    shutil.rmtree(out / VLLM_STAGING, ignore_errors=True)


def stale_files(out: Path, expected_fingerprint: str) -> list[Path]:
    """The hidden-state files (and the batches file) to clear because they were made under another
    key (`derivation`: target, weights, params, resolved settings, code, pins); [] when the key
    matches or there is nothing. Removes nothing."""
    meta_path = out / "meta.json"
    found = json.loads(meta_path.read_text()).get("fingerprint") if meta_path.exists() else None
    files = sorted(out.glob("hs_*.safetensors"))
    if found == expected_fingerprint or not files:
        return []
    return files + [p for p in [out / BATCHES_FILE] if p.exists()]


def stale_reason(out: Path, wanted: Derivation) -> list[str]:
    """What changed since meta.json recorded the key's parts (`Derivation.changed`)."""
    meta_path = out / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    return wanted.changed(meta.get("key"))


def cleared_text(n: int, changed: list[str], verb: str = "removed") -> str:
    """How the log says why the stale files go and counts them: `target weights changed: 12 files
    removed`."""
    return superseded(changed, n, "files", verb)


def prepare_output(out: Path, expected_fingerprint: str) -> int:
    """remove_temporaries, then clear the stale_files at once (no disk check: the stage decides,
    checks, then removes). Returns the number of hidden-state files removed."""
    remove_temporaries(out)
    files = stale_files(out, expected_fingerprint)
    for f in files:
        f.unlink()
    return sum(f.name != BATCHES_FILE for f in files)


def extra_files(out: Path, n_rows: int) -> list[Path]:
    """Files of rows past the end of the tokenized data (`samples` shrank)."""
    return sorted(
        f
        for f in out.glob("hs_*.safetensors")
        if not f.stem[3:].isdigit() or int(f.stem[3:]) >= n_rows
    )


def pending_rows(
    rows,
    out: Path,
    hidden_size: int,
    dtype: torch.dtype,
    full_check: bool,
    redone: dict[str, list[str]] | None = None,
) -> tuple[dict[int, int], int]:
    """({row index: length} of rows whose file is missing or invalid, rows already done).

    `rows` is the tokenized datasets.Dataset. `redone`, when given, gets the files that exist but
    are redone, by reason (file_problem's key): "hs_12.safetensors: <what was found>". Files of
    rows past its end are left to the stage (extra_files).
    """
    todo, done, i = {}, 0, 0
    for batch in rows.with_format(None).iter(batch_size=1024):
        for ids in batch["input_ids"]:
            path = hs_path(out, i)
            problem = file_problem(path, ids, hidden_size, dtype, full_check)
            if problem is None:
                done += 1
            else:
                todo[i] = len(ids)
                if redone is not None and problem != "missing":
                    reason, _, detail = problem.partition(": ")
                    redone.setdefault(reason, []).append(f"{path.name}: {detail or reason}")
            i += 1
    return todo, done


def all_rows(rows) -> dict[int, int]:
    """{row index: length} of every row (all of them to do, e.g. after clearing)."""
    lengths, i = {}, 0
    for batch in rows.with_format(None).iter(batch_size=1024):
        for ids in batch["input_ids"]:
            lengths[i] = len(ids)
            i += 1
    return lengths


@dataclass(frozen=True)
class PendingWork:
    """What an offline run redoes and removes, decided before any file is removed: the rows to
    extract (index -> tokens), the rows kept, the files to remove, and the bytes it takes."""

    todo: dict[int, int]
    done: int
    stale: list[Path]  # made for another target, aux layers, dtype or format, or by other code
    extra: list[Path]  # rows past the end: `samples` shrank
    cleared: int  # stale hidden-state files (the batches file not counted)
    needed: int
    reclaimable: int  # bytes the removed and overwritten files free
    # files that exist but are redone, by reason (truncated, other tokens, ...): their names
    redone: dict[str, list[str]]
    why: list[str] = field(default_factory=list)  # what changed (stale_reason); [] when none go


def pending_work(
    cfg: HiddenStatesConfig, rows, out: Path, wanted: Derivation, H: int, store_dtype
) -> PendingWork:
    """What to remove and redo in out (PendingWork), logged; nothing is removed yet."""
    stale = stale_files(out, wanted.key)
    redone: dict[str, list[str]] = {}
    if stale:
        todo, done, extra = all_rows(rows), 0, []
    else:
        full = cfg.verify_existing == "full"
        todo, done = pending_rows(rows, out, H, store_dtype, full, redone)
        extra = extra_files(out, len(rows))
    cleared = sum(f.name != BATCHES_FILE for f in stale)
    why = stale_reason(out, wanted) if stale else []
    overwritten = [hs_path(out, i) for i in todo]
    reclaimable = sum(f.stat().st_size for f in stale + extra + overwritten if f.exists())
    needed = estimate_bytes(list(todo.values()), H, store_dtype)
    log.info(
        f"hidden_states: {done} rows done, {len(todo)} to extract: {sum(todo.values()):,} tokens x "
        f"{bytes_per_token(H, cfg.format, cfg.dtype):,} B ({cfg.format}) = {needed / 1e9:.3f} GB"
        + (f"; {cleared_text(cleared, why, 'to remove')}" if cleared else "")
    )
    for reason, files in sorted(redone.items()):
        log.info(
            f"hidden_states: {len(files)} existing files redone ({reason}), first: "
            + "; ".join(files[:3])
        )
    return PendingWork(todo, done, stale, extra, cleared, needed, reclaimable, redone, why)
