"""What a rerun of the hidden_states stage keeps, redoes and clears in its output directory.

The directory's meta.json carries a fingerprint of what made the states (target and its weights,
aux ids, dtype, and the code that shapes them: draftline/core/shaping.py): a different
fingerprint clears the directory instead of mixing states. Otherwise each file is
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

from draftline.core.shaping import CODE_CHANGED, shaping_fingerprint
from draftline.hidden_states.batches import BATCHES_FILE
from draftline.hidden_states.disk import estimate_bytes
from draftline.hidden_states.files import file_problem, hs_path
from draftline.hidden_states.formats import bytes_per_token

if TYPE_CHECKING:
    from draftline.core.card import TargetCard
    from draftline.hidden_states.config import HiddenStatesConfig

log = logging.getLogger(__name__)

VLLM_STAGING = ".vllm_staging"  # where vLLM's connector writes inside the output directory


SAMPLED_BLOCKS = 64  # evenly spaced blocks of a .safetensors file's data hashed by weights_digest
BLOCK = 64 << 10
TENSOR_END = 4 << 10  # hashed at both ends of each tensor


def _safetensors_digest(h, fh, size: int) -> None:
    """Feed `h` a .safetensors file's header, its tensors' ends and evenly spaced blocks of its
    data (see weights_digest)."""
    head = fh.read(8)
    n = int.from_bytes(head, "little") if len(head) == 8 else 0
    header = fh.read(min(n, max(0, size - 8))) if n else b""
    h.update(head + header)
    start = 8 + len(header)
    spans = []
    try:
        tensors = json.loads(header)
    except ValueError:  # not a readable header: the blocks alone
        tensors = {}
    for info in tensors.values() if isinstance(tensors, dict) else ():
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        ok = isinstance(offsets, list) and len(offsets) == 2
        if ok and all(type(o) is int for o in offsets) and 0 <= offsets[0] <= offsets[1]:
            a, b = start + offsets[0], start + offsets[1]
            spans += [(a, min(b, a + TENSOR_END)), (max(a, b - TENSOR_END), b)]
    data = max(0, size - start)
    step = max(0, data - BLOCK) / max(1, SAMPLED_BLOCKS - 1)
    spans += [(start + int(k * step), start + int(k * step) + BLOCK) for k in range(SAMPLED_BLOCKS)]
    for a, b in sorted(set(spans)):
        fh.seek(a)
        h.update(fh.read(max(0, min(b, size) - a)))


def weights_digest(model: str) -> str | None:
    """A digest of the weight files (and config.json) of a local model: changes when it is
    retrained, fine-tuned, re-quantized or edited. None for a hub id (model + revision name it).

    Every file's name and size. A .bin/.pt file or config.json: its whole content. A .safetensors
    file: its header (every tensor's name, dtype, shape and offsets), the first and last 4 KiB of
    each tensor, and 64 evenly spaced 64 KiB blocks of its data; a file of up to 4 MiB of data is
    thereby read whole. Hashing a whole checkpoint costs minutes per hundred GB at every run of the
    stage; this costs 4 MiB plus 8 KiB per tensor, whatever the size. What it sees: a retrain
    changes nearly every value (the spaced blocks), a fine-tune of some tensors changes each of
    them throughout (their ends), a re-quantization or resize changes the header. What it can miss:
    an edit confined to a few bytes no block covers, which no training makes."""
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
        h.update(f"{f.name}:{size}\n".encode())
        with open(f, "rb") as fh:
            if f.suffix == ".safetensors":
                _safetensors_digest(h, fh, size)
            else:
                h.update(hashlib.file_digest(fh, "sha256").digest())
    return h.hexdigest()


def shaping_code() -> str:
    """The fingerprint of the code that shapes the states (SHAPES["hidden_states"])."""
    return shaping_fingerprint("hidden_states")


def fingerprint(card: TargetCard, dtype_name: str) -> str:
    """What the stored values depend on, besides the tokens each file already records: the target
    (its weights too), the aux ids, the stored dtype and the code that shapes the states
    (draftline/core/shaping.py)."""
    parts = {
        "model": card.model,
        "revision": card.revision,
        "weights": weights_digest(card.model),
        "num_layers": card.num_layers,
        "hidden_size": card.hidden_size,
        "aux_layer_ids": card.aux_ids,
        "dtype": dtype_name,
        "code": shaping_code(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def remove_temporaries(out: Path) -> None:
    """Temp files and vLLM staging a killed run left (never outputs: finished files are renamed in)."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.tmp"):
        stale.unlink()
    shutil.rmtree(out / VLLM_STAGING, ignore_errors=True)


def stale_files(out: Path, expected_fingerprint: str) -> list[Path]:
    """The hidden-state files (and the batches file) to clear because another target, aux ids,
    dtype or shaping code made them; [] when the fingerprint matches or there is nothing. Removes
    nothing."""
    meta_path = out / "meta.json"
    found = json.loads(meta_path.read_text()).get("fingerprint") if meta_path.exists() else None
    files = sorted(out.glob("hs_*.safetensors"))
    if found == expected_fingerprint or not files:
        return []
    return files + [p for p in [out / BATCHES_FILE] if p.exists()]


OTHER_INPUTS = "made for another target, aux layers, dtype or format"


def stale_reason(out: Path) -> str:
    """Why stale_files are cleared, as the stage says it: the code that shapes the states changed
    since meta.json recorded it (`shaping_code`), it was not recorded then, or else the files were
    OTHER_INPUTS."""
    meta_path = out / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    recorded = meta.get("shaping_code")
    if recorded is None:
        return "the code that shapes them was not recorded when they were made"
    if recorded != shaping_code():
        return CODE_CHANGED
    return OTHER_INPUTS


def cleared_text(n: int, why: str) -> str:
    """How the log counts the stale files and says why: `12 files made for another target, ...`,
    or `12 files (the code that shapes them changed)`."""
    return f"{n} files {why}" if why == OTHER_INPUTS else f"{n} files ({why})"


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
    why: str = ""  # why the stale files go (stale_reason); "" when there are none


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
    why = stale_reason(out) if stale else ""
    overwritten = [hs_path(out, i) for i in todo]
    reclaimable = sum(f.stat().st_size for f in stale + extra + overwritten if f.exists())
    needed = estimate_bytes(list(todo.values()), H, store_dtype)
    log.info(
        f"hidden_states: {done} rows done, {len(todo)} to extract: {sum(todo.values()):,} tokens x "
        f"{bytes_per_token(H, cfg.format, cfg.dtype):,} B ({cfg.format}) = {needed / 1e9:.3f} GB"
        + (f"; {cleared_text(cleared, why)} to remove" if cleared else "")
    )
    for reason, files in sorted(redone.items()):
        log.info(
            f"hidden_states: {len(files)} existing files redone ({reason}), first: "
            + "; ".join(files[:3])
        )
    return PendingWork(todo, done, stale, extra, cleared, needed, reclaimable, redone, why)
