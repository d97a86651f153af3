"""The previous tokenized output a rerun may keep: made under the same key (rows_key in
draftline/tokens/tokenize.py), its index and shards there at their sizes, and how many of its
shards stay as they are. Bookkeeping: nothing here shapes a row (draftline/core/shaping.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from draftline.core.io import read_json
from draftline.core.shaping import CODE_CHANGED
from draftline.tokens.output import short_sha

if TYPE_CHECKING:
    from draftline.tokens.lines import Line


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
        others = [k for k in changed if k != "shaping_code"]
        why = [f"made under another key ({', '.join(others)})"] if others else []
        if "shaping_code" in changed:  # draftline/core/shaping.py, SHAPES["tokenize"]
            why.append(CODE_CHANGED)
        return None, "; ".join(why) or "made under another key (unrecorded)"
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
