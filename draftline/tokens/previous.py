"""The previous tokenized output a rerun may keep: made under the same key (rows_key in
draftline/tokens/tokenize.py), its index and shards there at their sizes, and how many of its
shards stay as they are. Bookkeeping: nothing here shapes a row (draftline/core/shaping.py).

The spot-check of what is kept: a key that matches and files at their sizes say nothing of the
rows' values, and a key can miss what shapes them (a tokenizer setting it does not hold, a rows
file edited in place). So before a rerun trusts them, `resume.verify_sample` of the conversations
it keeps (chosen by a fixed seed) are tokenized again by the tokenizer and template loaded now
and must give the very rows kept; a mismatch stops the stage before anything is written, naming
the conversation, what differs and the user's choice (tokenize.py, check_kept_rows).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from draftline.core.derivation import UNRECORDED, Derivation
from draftline.core.io import read_json
from draftline.tokens.chat import first_difference
from draftline.tokens.output import FEATURES, short_sha

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
        # what changed, named as every kept output names it ("params (max_length)", "the code
        # that shapes them": draftline/core/derivation.py); `key` is a Derivation's record
        changed = Derivation("tokenize", key["parts"]).changed(meta.get("key"))
        return None, UNRECORDED if changed == [UNRECORDED] else f"{', '.join(changed)} changed"
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


# ---- the spot-check of kept rows --------------------------------------------------------------


@dataclass
class RowsCheck:
    """The report's `spot_check`: how many kept conversations were tokenized again and gave their
    rows as kept, or why none was."""

    sample: int  # resume.verify_sample
    checked: int = 0  # conversations
    rows: int = 0  # their rows compared, field by field
    not_run: str | None = None

    def as_dict(self) -> dict:
        return {
            "sample": self.sample,
            "checked": self.checked,
            "rows": self.rows,
            "not_run": self.not_run,
        }


def sample_kept(kept: list, n: int) -> list:
    """Up to n of the kept conversations, in their order: the same ones on every rerun of the same
    output (a fixed seed), so the report does not change between them."""
    chosen = random.Random(0).sample(range(len(kept)), min(n, len(kept)))
    return [kept[k] for k in sorted(chosen)]


def rows_difference(kept: list[dict], now: list[dict], tokenizer) -> str | None:
    """What first differs between a conversation's kept rows and the rows it gives now (fields
    as output.FEATURES names them), None when they are the same."""
    if len(kept) != len(now):
        return f"it gives {len(now)} rows now, {len(kept)} kept"
    for k, (a, b) in enumerate(zip(kept, now)):
        for name in FEATURES:
            x, y = a[name], b[name]
            if x == y:
                continue
            if not isinstance(x, list):
                return f"row {k} {name}: kept {x!r}, now {y!r}"
            at = first_difference(x, y)
            kept_value, now_value = (_at(ids, at, name == "input_ids", tokenizer) for ids in (x, y))
            return (
                f"row {k} {name} first differs at position {at}: kept {kept_value}, now {now_value}"
            )
    return None


def _at(ids: list[int], at: int, token: bool, tokenizer) -> str:
    """ids[at] as the message shows it: with its token's text for an input id."""
    if at >= len(ids):
        return f"the row's end ({len(ids)} tokens)"
    return f"{ids[at]} ({tokenizer.convert_ids_to_tokens(ids[at])!r})" if token else str(ids[at])


def mismatch_message(conversation: str, difference: str, out: Path) -> str:
    """The stage's error when a kept conversation no longer gives its rows."""
    return (
        f"error: the spot-check of kept tokenized rows failed: conversation {conversation}: "
        f"{difference}. The rows kept in {out} and the tokenizer and chat template loaded now "
        "disagree: something that shapes the rows changed in a way their key (meta.json) does not "
        "see, or the rows were edited. Nothing was written. Rerun fresh (move "
        f"{out} aside) or keep the rows as they are (resume.verify_sample: 0)"
    )
