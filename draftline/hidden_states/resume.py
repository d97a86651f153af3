"""What a rerun of the hidden_states stage keeps, redoes and clears in its output directory.

The directory's meta.json carries a fingerprint of what made the states (target, aux ids, dtype):
a different fingerprint clears the directory instead of mixing states. Otherwise each file is
checked (draftline/hidden_states/files.py) and only the missing or broken ones are redone. The
stage decides what it would remove (`pending_work`) and checks the disk first
(draftline/hidden_states/disk.py), then removes it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from draftline.hidden_states.batches import BATCHES_FILE
from draftline.hidden_states.disk import estimate_bytes
from draftline.hidden_states.files import file_problem, hs_path
from draftline.hidden_states.formats import bytes_per_token

if TYPE_CHECKING:
    from draftline.core.card import TargetCard
    from draftline.hidden_states.config import HiddenStatesConfig

log = logging.getLogger(__name__)

VLLM_STAGING = ".vllm_staging"  # where vLLM's connector writes inside the output directory


def weights_digest(model: str) -> str | None:
    """Size and first/last MiB of each weight file of a local model: changes when it is retrained,
    costs milliseconds even for a terabyte checkpoint. None for a hub id (model + revision name it)."""
    root = Path(model)
    if not root.is_dir():
        return None
    h = hashlib.sha256()
    for f in sorted(
        p
        for p in root.iterdir()
        if p.suffix in {".safetensors", ".bin", ".pt"} or p.name == "config.json"
    ):
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(1 << 20))
            fh.seek(max(0, size - (1 << 20)))
            h.update(fh.read())
    return h.hexdigest()


def fingerprint(card: TargetCard, dtype_name: str) -> str:
    """What the stored values depend on, besides the tokens each file already records."""
    parts = {
        "model": card.model,
        "revision": card.revision,
        "weights": weights_digest(card.model),
        "num_layers": card.num_layers,
        "hidden_size": card.hidden_size,
        "aux_layer_ids": card.aux_ids,
        "dtype": dtype_name,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def remove_temporaries(out: Path) -> None:
    """Temp files and vLLM staging a killed run left (never outputs: finished files are renamed in)."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.tmp"):
        stale.unlink()
    shutil.rmtree(out / VLLM_STAGING, ignore_errors=True)


def stale_files(out: Path, expected_fingerprint: str) -> list[Path]:
    """The hidden-state files (and the batches file) to clear because another target, aux ids or
    dtype made them; [] when the fingerprint matches or there is nothing. Removes nothing."""
    meta_path = out / "meta.json"
    found = json.loads(meta_path.read_text()).get("fingerprint") if meta_path.exists() else None
    files = sorted(out.glob("hs_*.safetensors"))
    if found == expected_fingerprint or not files:
        return []
    return files + [p for p in [out / BATCHES_FILE] if p.exists()]


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
    stale: list[Path]  # made for another target, aux layers, dtype or format
    extra: list[Path]  # rows past the end: `samples` shrank
    cleared: int  # stale hidden-state files (the batches file not counted)
    needed: int
    reclaimable: int  # bytes the removed and overwritten files free
    # files that exist but are redone, by reason (truncated, other tokens, ...): their names
    redone: dict[str, list[str]]


def pending_work(
    cfg: HiddenStatesConfig, rows, out: Path, expected_fingerprint: str, H: int, store_dtype
) -> PendingWork:
    """What to remove and redo in out (PendingWork), logged; nothing is removed yet."""
    stale = stale_files(out, expected_fingerprint)
    redone: dict[str, list[str]] = {}
    if stale:
        todo, done, extra = all_rows(rows), 0, []
    else:
        full = cfg.verify_existing == "full"
        todo, done = pending_rows(rows, out, H, store_dtype, full, redone)
        extra = extra_files(out, len(rows))
    cleared = sum(f.name != BATCHES_FILE for f in stale)
    overwritten = [hs_path(out, i) for i in todo]
    reclaimable = sum(f.stat().st_size for f in stale + extra + overwritten if f.exists())
    needed = estimate_bytes(list(todo.values()), H, store_dtype)
    log.info(
        f"hidden_states: {done} rows done, {len(todo)} to extract: {sum(todo.values()):,} tokens x "
        f"{bytes_per_token(H, cfg.format, cfg.dtype):,} B ({cfg.format}) = {needed / 1e9:.3f} GB"
        + (
            f"; {cleared} files made for another target, aux layers, dtype or format to remove"
            if cleared
            else ""
        )
    )
    for reason, files in sorted(redone.items()):
        log.info(
            f"hidden_states: {len(files)} existing files redone ({reason}), first: "
            + "; ".join(files[:3])
        )
    return PendingWork(todo, done, stale, extra, cleared, needed, reclaimable, redone)
