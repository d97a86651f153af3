"""The tokenized output on disk: its Arrow layout and shards' frequencies, the files a finished
run publishes, and the previous output a rerun may keep (its key, its rows)."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from draftline.core.errors import DraftlineError
from draftline.core.io import read_json, write_json

if TYPE_CHECKING:
    from draftline.tokens.lines import Line


class TokenizeError(DraftlineError):
    """The conversations cannot become a dataset (no row left, a token id outside the vocabulary)."""


# ---- what the rows depend on ------------------------------------------------------------------

ROW_FORMAT = (
    1  # raise when the rows a conversation gives change here (draftline/tokens/chat.py is hashed)
)

SHARD_CONVERSATIONS = 2048  # conversations per Arrow file

INDEX = "conversations.jsonl"  # per conversation, in row order: its hash and what it gave

FEATURES = {
    "id": "string",
    "part": "int64",
    "input_ids": ["int64"],
    "loss_mask": ["int64"],
    "seq_len": "int64",
}


def features():
    # datasets loads on first use: importing this module stays light
    from datasets import Features, List, Value

    return Features(
        {
            name: List(Value(kind[0])) if isinstance(kind, list) else Value(kind)
            for name, kind in FEATURES.items()
        }
    )


def short_sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


# ---- the previous output: what a rerun keeps ----------------------------------------------------


@dataclass
class Previous:
    """A previous output made under the same key (meta.json, its index and shards checked)."""

    shards: list[dict]  # meta.json's: file, conversations, rows, bytes, freq
    keys: list[tuple[str, str]]  # (id, sha256) of each conversation, in row order
    lines: list[bytes]  # its index line
    row_start: list[int]  # its first row within its shard
    shard_of: list[int]


def previous_output(out: Path, key: dict) -> tuple[Previous | None, str]:
    """(the previous output, "") when meta.json was made under `key` and every file it names is
    there at its size; else (None, why the rows are all tokenized again)."""
    meta_path = out / "meta.json"
    if not meta_path.is_file():
        return None, "no previous output"
    try:
        meta = read_json(meta_path)
        shards, index = meta["shards"], out / meta["index"]
    except (OSError, ValueError, KeyError, TypeError):
        return None, "previous output without an index"
    if meta.get("key_sha256") != short_sha(key):
        old = meta.get("key") if isinstance(meta.get("key"), dict) else {}
        changed = sorted(k for k in key if old.get(k) != key[k])
        return None, f"made under another key ({', '.join(changed) or 'unrecorded'})"
    for shard in shards:
        for name, size in ((shard["file"], shard["bytes"]), (shard["freq"], None)):
            path = out / name
            if not path.is_file() or (size is not None and path.stat().st_size != size):
                return None, f"previous output incomplete ({name})"
    if not index.is_file():
        return None, f"previous output incomplete ({index.name})"
    prev = Previous(shards, [], [], [], [])
    with open(index, "rb") as f:
        bounds = iter(enumerate(shards))
        k, shard = next(bounds, (None, None))
        left, row = (shard["conversations"] if shard else 0), 0
        for raw in f:
            try:
                entry = json.loads(raw)
            except ValueError:
                return None, f"previous index unreadable ({index.name})"
            while shard is not None and left == 0:
                k, shard = next(bounds, (None, None))
                left, row = (shard["conversations"] if shard else 0), 0
            if shard is None:
                return None, "previous index longer than its shards"
            prev.keys.append((entry["id"], entry["sha256"]))
            prev.lines.append(raw)
            prev.row_start.append(row)
            prev.shard_of.append(k)
            row += entry["rows"]
            left -= 1
    if len(prev.keys) != sum(s["conversations"] for s in shards):
        return None, "previous index shorter than its shards"
    return prev, ""


def kept_prefix(prev: Previous | None, lines: list[Line]) -> int:
    """How many shards of the previous output stay as they are: those whose conversations are the
    first ones of the new order, unchanged."""
    if prev is None:
        return 0
    same = 0
    for old, line in zip(prev.keys, lines):
        if old != (line.id, line.sha256):
            break
        same += 1
    kept, covered = 0, 0
    for shard in prev.shards:
        if covered + shard["conversations"] > same:
            break
        covered += shard["conversations"]
        kept += 1
    return kept


def token_frequencies(out: Path, shards: list[dict]) -> dict[int, int]:
    """Trainable-token counts over every shard, keyed in the order speculators'
    save_token_frequency_distribution inserts them (by first row, then id): the same file."""
    import numpy as np

    ids, counts, first, base = [], [], [], 0
    for shard in shards:
        found, n, row = np.load(out / shard["freq"])
        ids.append(found)
        counts.append(n)
        first.append(row + base)
        base += shard["rows"]
    if not ids:
        return {}
    ids, counts, first = np.concatenate(ids), np.concatenate(counts), np.concatenate(first)
    order = np.lexsort((first, ids))  # by id, then first row: a unique id's first row is first
    ids, counts, first = ids[order], counts[order], first[order]
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    total = np.add.reduceat(counts, starts)
    unique, earliest = ids[starts], first[starts]
    order = np.lexsort((unique, earliest))
    return dict(zip(unique[order].tolist(), total[order].tolist()))


# ---- one batch of conversations ---------------------------------------------------------------


def rows_table(rows: list[dict], schema, vocab_size: int):
    """The rows as one Arrow table (ids through numpy: a nested list converts several times slower).
    TokenizeError for a token id outside the target vocabulary."""
    import numpy as np
    import pyarrow as pa

    lengths = np.fromiter((len(row["input_ids"]) for row in rows), dtype=np.int64, count=len(rows))
    ends = np.cumsum(lengths)
    offsets = pa.array(np.concatenate([[0], ends]).astype(np.int32))

    def lists(name: str):
        flat = np.fromiter(
            itertools.chain.from_iterable(row[name] for row in rows),
            dtype=np.int64,
            count=int(lengths.sum()),
        )
        if name == "input_ids" and flat.size and (flat.max() >= vocab_size or flat.min() < 0):
            at = int(np.flatnonzero((flat >= vocab_size) | (flat < 0))[0])
            raise TokenizeError(
                f"error: conversation {rows[int(np.searchsorted(ends, at, side='right'))]['id']}: token "
                f"id {flat[at]} is outside the target vocabulary ({vocab_size}); tokenizer and "
                "model disagree"
            )
        return pa.ListArray.from_arrays(offsets, pa.array(flat), type=schema.field(name).type)

    return pa.table(
        {
            "id": pa.array([row["id"] for row in rows], pa.string()),
            "part": pa.array([row["part"] for row in rows], pa.int64()),
            "input_ids": lists("input_ids"),
            "loss_mask": lists("loss_mask"),
            "seq_len": pa.array(lengths),
        },
        schema=schema,
    )


def save_frequencies(freq: dict[int, int], path: Path) -> None:
    """torch.save under the file's own name (torch names the archive inside after it: the bytes
    equal speculators' file), through a temporary directory and a rename."""
    import tempfile

    import torch

    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".freq-") as tmp:
        torch.save(freq, Path(tmp) / path.name)
        os.replace(Path(tmp) / path.name, path)


def write_dataset_files(out: Path, shards: list[dict], fingerprint: str) -> None:
    """state.json and dataset_info.json as Dataset.save_to_disk writes them, torch format set
    (input_ids, loss_mask, seq_len as tensors, id and part as they are)."""
    write_json(
        out / "dataset_info.json",
        {
            "citation": "",
            "description": "",
            "features": features().to_dict(),
            "homepage": "",
            "license": "",
        },
    )
    write_json(
        out / "state.json",
        {
            "_data_files": [{"filename": s["file"]} for s in shards],
            "_fingerprint": fingerprint,  # of the index: identical rows, identical fingerprint
            "_format_columns": ["input_ids", "loss_mask", "seq_len"],
            "_format_kwargs": {},
            "_format_type": "torch",
            "_output_all_columns": True,
            "_split": None,
        },
    )
