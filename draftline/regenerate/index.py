"""The index of conversations.jsonl: what a rerun reads of each line (its id, settings
fingerprint, prompt hash, run, answers and those cut by max_tokens) in a small file beside it, so
that knowing which conversations are done, at start, and how many answers ended at max_tokens, at
the end, does not mean parsing every conversation again (measured by overhead/regen_client.py:
<!-- fig reports/overhead/regen_client.json#/startup/conversations_mb ,.0f -->3,117<!-- /fig --> MB at
<!-- fig reports/overhead/regen_client.json#/startup/conversations ,d -->100,000<!-- /fig --> conversations of
<!-- fig reports/overhead/regen_client.json#/startup/tokens_per_conversation ,d -->4,096<!-- /fig --> tokens with their token ids; the index of
them is <!-- fig reports/overhead/regen_client.json#/startup/index_mb .1f -->11.4<!-- /fig --> MB).

conversations.index.jsonl: a header, then one JSON array per line of conversations.jsonl, in
order, appended by the writer right after the line itself:

    {"index_of": "conversations.jsonl", "fields": ["start", "end", "crc32", "id", ...]}
    [0, 31877, 2871633419, "p000000", "2b1f...", null, "9c0e...", 1, 2, 0]

The index is a cache, never the record: what it lacks or gets wrong comes from the conversations
themselves. `read_index` takes the entries that chain from the file's first byte (each starting
where the last ended), checks the crc32 of the last one and of a sample of the others against the
file, and gives None when anything is off (no index, another layout, a line inserted or removed by
hand, entries past the end of the file): then every line is parsed. Lines past the chain (a kill
between a line and its entry, a torn last entry) are parsed too, and the reader writes the index
anew (`write_index`). A rewrite of conversations.jsonl removes the index first and writes the new
one after: a kill between the two leaves no index, never a wrong one.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from pathlib import Path
from typing import NamedTuple

import orjson

from draftline.core.io import atomic_path
from draftline.core.regenerated import run_of

FIELDS = (
    "start",  # byte offset of the line in conversations.jsonl
    "end",  # one past its newline
    "crc32",  # zlib.crc32 of its bytes
    "id",  # None: not a conversation line (unreadable)
    "fingerprint",  # regeneration.fingerprint / accepted_for / prompt_sha256 (None: absent)
    "accepted_for",
    "prompt_sha256",
    "run",  # run_of
    "answers",  # len(regeneration.finish_reasons), None where that is not a list
    "length",  # of them, the answers that ended at max_tokens
    # prompt_line(raw prompt line) of the prompt prompt_sha256 was last found equal to (None:
    # not yet): the same raw line again needs no canonical hash (a fifth of a millisecond per 4k
    # tokens, 20 s at 100,000 prompts)
    "prompt_line",
)
CHECKED = 8  # entries whose crc32 is checked against the file besides the last one


class Entry(NamedTuple):
    start: int
    end: int
    crc32: int
    id: str | None
    fingerprint: str | None
    accepted_for: str | None
    prompt_sha256: str | None
    run: int
    answers: int | None
    length: int | None
    prompt_line: str | None = None


def index_path(conversations: Path) -> Path:
    conversations = Path(conversations)
    return conversations.with_name(conversations.stem + ".index.jsonl")


def header(conversations: Path) -> bytes:
    return orjson.dumps({"index_of": Path(conversations).name, "fields": FIELDS}) + b"\n"


def prompt_line(raw: bytes) -> str:
    """Digest of a prompt's raw JSONL line (its newline left out): sha1, 64 bits of it."""
    return hashlib.sha1(raw.rstrip(b"\r\n")).hexdigest()[:16]


def entry(start: int, line: bytes, row: dict | None) -> Entry:
    """The entry of one line (its bytes, newline included, at `start`), from its parsed row."""
    pid = row.get("id") if isinstance(row, dict) else None
    if not isinstance(pid, str):
        return Entry(
            start, start + len(line), zlib.crc32(line), None, None, None, None, 0, None, None
        )
    regen = row.get("regeneration")
    regen = regen if isinstance(regen, dict) else {}

    def text(key):
        return regen[key] if isinstance(regen.get(key), str) else None

    reasons = regen.get("finish_reasons")
    answers, length = (
        (len(reasons), reasons.count("length")) if isinstance(reasons, list) else (None, None)
    )
    return Entry(
        start,
        start + len(line),
        zlib.crc32(line),
        pid,
        text("fingerprint"),
        text("accepted_for"),
        text("prompt_sha256"),
        run_of(row),
        answers,
        length,
    )


def encode(e: Entry) -> bytes:
    return orjson.dumps(list(e)) + b"\n"


def read_index(conversations: Path) -> list[Entry] | None:
    """The checked chain of entries from the file's start (possibly empty: nothing indexed yet),
    or None when the index is missing, of another layout, or does not match the file."""
    conversations, path = Path(conversations), index_path(conversations)
    try:
        size = conversations.stat().st_size
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    lines = data.split(b"\n")
    if not lines[0] or lines[0] + b"\n" != header(conversations):
        return None
    entries, end = [], 0
    for raw in lines[1:]:
        try:
            e = Entry(*orjson.loads(raw))
        except (orjson.JSONDecodeError, TypeError):
            break  # a torn last entry (or the empty piece after the last newline)
        if e.start != end or not e.start < e.end <= size:
            return None  # not the chain of this file (cut short by hand, say): parse every line
        entries.append(e)
        end = e.end
    if entries:
        step = max(1, len(entries) // CHECKED)
        with open(conversations, "rb") as f:
            for e in {*entries[::step], entries[-1]}:
                f.seek(e.start)
                if zlib.crc32(f.read(e.end - e.start)) != e.crc32:
                    return None
    return entries


def all_entries(conversations: Path):
    """The entry of every line of conversations.jsonl: the index's, then the lines past it, read."""
    conversations = Path(conversations)
    if not conversations.exists():
        return
    start = 0
    for e in read_index(conversations) or ():
        yield e
        start = e.end
    with open(conversations, "rb") as f:
        f.seek(start)
        for line in f:
            try:
                row = json.loads(line) if line.strip() else None
            except ValueError:
                row = None
            yield entry(start, line, row)
            start += len(line)


def write_index(conversations: Path, entries: list[Entry]) -> None:
    """The index of `entries` (every whole line of the file, in order), written atomically."""
    with atomic_path(index_path(conversations)) as tmp, open(tmp, "wb") as f:
        f.write(header(conversations))
        for e in entries:
            f.write(encode(e))


def remove_index(conversations: Path) -> None:
    try:
        os.unlink(index_path(conversations))
    except FileNotFoundError:
        pass


class IndexWriter:
    """Appends the entry of each line the run appends to conversations.jsonl, after the line.
    `out` is the conversations file opened "ab"; entries of this run continue the chain only
    where the index covered the file up to its end (set_aside_superseded makes it so), else the
    next reader parses the lines and writes the index anew."""

    def __init__(self, conversations: Path, out):
        self.offset = out.tell()
        path = index_path(conversations)
        fresh = not path.exists() or path.stat().st_size == 0
        self.file = open(path, "ab")
        if fresh:
            self.file.write(header(conversations))
        elif _cut(path):
            self.file.write(b"\n")  # a torn last entry stays unreadable, never joined to the next

    def add(self, line: bytes, row: dict, prompt_digest: str | None = None) -> None:
        """The entry of `line` (just written, from `row`); prompt_digest: the prompt_line of the
        prompt it answers, when known."""
        e = entry(self.offset, line, row)._replace(prompt_line=prompt_digest)
        # not flushed: entries a kill loses are lines the next start parses (a buffer's worth)
        self.file.write(encode(e))
        self.offset += len(line)

    def close(self) -> None:
        self.file.close()


def _cut(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"
