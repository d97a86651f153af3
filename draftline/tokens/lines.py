"""The regenerated conversations to tokenize, in row order: each one's id, the place of its line
in the regenerated file and a hash of it, read without keeping any conversation in memory.

The order is that of the regenerate runs that wrote them, then the prompts' order within a run
(draftline.core.regenerated.run_of), restricted to the prompts of train.jsonl: a rerun that fills
prompts which failed before, or that grows `samples`, puts their rows after every existing one
(draftline/tokens/tokenize.py says why).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from draftline.core.regenerated import run_of


@dataclass(frozen=True, slots=True)
class Line:
    """One regenerated conversation to tokenize: where its line lies, and a hash of its bytes."""

    id: str
    offset: int
    size: int
    sha256: str  # of the line without its newline: any change to it tokenizes it again


def regenerated_lines(prompts_path: str, regenerated_path: str) -> tuple[list[Line], int, int]:
    """(the conversations to tokenize in row order, prompts in train.jsonl, unreadable regenerated
    lines). Both files are streamed: what is kept of each line is its id, place and hash."""
    position: dict[str, int] = {}
    with open(prompts_path, "rb") as f:
        for raw in f:
            if raw.strip():
                position.setdefault(json.loads(raw)["id"], len(position))
    found, seen, bad, offset = [], set(), 0, 0
    path = Path(regenerated_path)
    with open(path, "rb") if path.exists() else contextlib.nullcontext(()) as f:
        for raw in f:
            at, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except ValueError:
                bad += 1
                continue
            pid = row.get("id") if isinstance(row, dict) else None
            if not isinstance(pid, str):
                bad += 1
                continue
            if pid in seen:  # a prompt's first line holds (conversation_store keeps one)
                continue
            seen.add(pid)
            if pid in position:
                body = raw.rstrip(b"\r\n")
                line = Line(pid, at, len(body), hashlib.sha256(body).hexdigest()[:32])
                found.append((run_of(row), position[pid], line))
    found.sort(key=lambda entry: entry[:2])
    return [line for *_, line in found], len(position), bad
