"""The regenerated conversations file and its prompts: what each line records, which lines a
rerun keeps, where the others go, and the order rows take downstream.

Output is append-only JSONL keyed by prompt id, one flushed line per finished conversation. Each
line carries a `regeneration` record: the `settings` that shaped its answers (target, chat
template, the output-shaping regenerate params) with their `fingerprint`, the `engine` that
answered (backend, engine, launch arguments: provenance, never compared) and the hash of its
prompt. A rerun keeps the lines whose settings still match, field by field, and sends only the
missing prompts. Nothing finished is deleted: a line made with other settings, for a changed
prompt, a duplicate of an id or an unreadable line moves to superseded.jsonl beside it
(append-only, with the reason and when), and a superseded line that matches the settings again
comes back instead of being sent again.

Reading and moving are two steps: `load_finished` reads both files and writes nothing;
`set_aside_superseded` then moves what it found (the stage calls it once every endpoint passed
its preflight). By hand, `draftline conversations restore` (draftline/tools/conversations.py)
does what the stage does before sending (moves stale lines out, matching ones back), or brings
chosen lines back whatever settings made them, accepted for the current ones
(`regeneration.accepted_for`), in place of the line that holds their id. A file whose lines
record only a settings fingerprint (the format before settings were recorded per line) is
refused with OldFormatError until `draftline conversations migrate` rewrote it
(draftline/regenerate/migrate.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from draftline.core.io import atomic_path
from draftline.core.regenerated import run_of
from draftline.regenerate.config import RegenerateError
from draftline.regenerate.index import (
    all_entries,
    prompt_line,
    read_index,
    remove_index,
    write_index,
)
from draftline.regenerate.index import entry as index_entry
from draftline.regenerate.settings import (
    Wanted,
    changed_fields,
    predates_settings,
    prompt_sha256,
)

SUPERSEDED = "superseded.jsonl"  # beside conversations.jsonl; nothing downstream reads it


class OldFormatError(RegenerateError):
    """conversations.jsonl holds lines of the format before settings were recorded per line."""

    def __init__(self, path: Path, n: int, pid: str):
        super().__init__(
            f"error: {path} line {n} ({pid}) records only its settings' fingerprint, the format "
            "before the settings were recorded with each line; rewrite the file once with "
            f"`draftline conversations migrate {Path(path).parent}` (with the params that made "
            "it, or its meta.json beside it), then run again"
        )


def _verdict(row: dict, prompts: dict, wanted: Wanted) -> tuple[str | None, list[str]]:
    """(why the line does not hold, or None; the settings that changed). "old_format": a record
    of the format before settings were recorded per line (predates_settings)."""
    regen = row.get("regeneration")
    if not isinstance(regen, dict):
        return "unrecorded_settings", []
    changed = []
    if wanted.fingerprint in (regen.get("fingerprint"), regen.get("accepted_for")):
        pass  # the same settings, or accepted for them by hand (restore --reason/--id)
    elif isinstance(regen.get("settings"), dict) and wanted.settings:
        changed = changed_fields(regen, regen["settings"], wanted)
    elif predates_settings(regen):
        return "old_format", []
    else:
        return "unrecorded_settings", []
    if changed:
        return "stale_settings", changed
    pid = row["id"]
    if pid in prompts and regen.get("prompt_sha256") != prompt_sha256(prompts[pid]):
        return "stale_prompt", []
    return None, []


def _with(row: dict, addition: dict) -> dict:
    if not addition:
        return row
    return {**row, "regeneration": {**row["regeneration"], **addition}}


def _parse(line: bytes) -> dict | None:
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) and isinstance(row.get("id"), str) else None


def read_prompts(path: str | Path) -> list[dict]:
    """The prompt rows, each with a string `id` (unique) and a `messages` list; else
    RegenerateError."""
    return list(PromptFile(path).values())


LEADING_ID = re.compile(rb'\{"id": ("(?:[^"\\]|\\.)*")')  # the start of a row json.dumps wrote


class PromptFile(Mapping):
    """The prompt rows of a prompts file by id, in the file's order, each read and parsed when
    first asked for: a rerun asks only for the prompts it sends and those whose line changed since
    it was last checked (`digests`), not for the 100,000 whose conversations are done (parsing
    them was seconds of a rerun's start). The scan reads each line's id (from its start, as
    json.dumps writes a row whose first key is `id`; other lines are parsed) and its prompt_line
    digest (draftline/regenerate/index.py); a row that is parsed is checked as read_prompts
    checks it (a string `id`, the one the scan read, unique; a `messages` list), and a prompt
    never parsed is one whose raw line was checked before."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.digests: dict[str, str] = {}  # id -> prompt_line of its raw line
        self._where: dict[str, tuple[int, int, int]] = {}  # id -> (line number, offset, length)
        self._rows: dict[str, dict] = {}
        offset, n = 0, 0
        with open(self.path, "rb") as f:
            for line in f:
                start, offset = offset, offset + len(line)
                if not line.strip():
                    continue
                n += 1
                match = LEADING_ID.match(line)
                if match:
                    pid = json.loads(match.group(1))
                else:
                    row = self._checked(json.loads(line), n, None)
                    pid = row["id"]
                    self._rows[pid] = row
                if pid in self._where:
                    raise RegenerateError(
                        f"error: {self.path} line {n}: duplicate prompt id {pid!r}"
                    )
                self._where[pid] = (n, start, len(line))
                self.digests[pid] = prompt_line(line)

    def _checked(self, row, n: int, pid: str | None) -> dict:
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("id"), str)
            or not isinstance(row.get("messages"), list)
        ):
            raise RegenerateError(
                f"error: {self.path} line {n}: a prompt needs a string `id` and a `messages` list"
            )
        if pid is not None and row["id"] != pid:
            raise RegenerateError(
                f"error: {self.path} line {n}: the line starts with id {pid!r} and has {row['id']!r}"
            )
        return row

    def __getitem__(self, pid: str) -> dict:
        row = self._rows.get(pid)
        if row is None:
            n, start, length = self._where[pid]
            with open(self.path, "rb") as f:
                f.seek(start)
                row = self._rows[pid] = self._checked(json.loads(f.read(length)), n, pid)
        return row

    def __contains__(self, pid) -> bool:
        return pid in self._where

    def __iter__(self):
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def cut_last_line(path: Path) -> bool:
    """The file ends in a line a kill cut short (no final newline)."""
    if not path.exists() or not path.stat().st_size:
        return False
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def superseded_path(conversations_path: Path) -> Path:
    return Path(conversations_path).with_name(SUPERSEDED)


# ---- the plan: what stays, what moves out, what comes back ---------------------------------------


@dataclass
class _Plan:
    # per line of conversations.jsonl: None = kept as is; ("keep", addition) = kept, its record
    # completed (the migration); (reason, changed, addition) = moved to superseded.jsonl;
    # "blank" = dropped
    actions: list = field(default_factory=list)
    restore: dict[int, dict] = field(default_factory=dict)  # superseded line -> record additions
    held: set[bytes] | None = None  # digests of what superseded.jsonl holds (read by _apply)
    # per whole line of conversations.jsonl, its index entry (draftline/regenerate/index.py);
    # `indexed`: the index covered every whole line before the plan (else it is written anew)
    entries: list = field(default_factory=list)
    indexed: bool = False
    refreshed: bool = False  # entries learnt the prompt lines they were checked against
    done: set[str] = field(default_factory=set)
    counts: Counter = field(default_factory=Counter)
    # per reason a line is set aside, the first few: "line N (id)"
    named: dict[str, list[str]] = field(default_factory=dict)
    last_run: int = 0
    cut_last_line: bool = False
    # lines made under other settings, per the settings that changed (sorted names, joined)
    changed: Counter = field(default_factory=Counter)

    def set_aside(self, reason: str, n: int, pid: str | None, action) -> None:
        """Count (and name, the first few) a line that does not hold, and plan its move."""
        self.counts[reason] += 1
        if reason == "stale_settings":
            self.changed[", ".join(sorted(action[1]))] += 1
        names = self.named.setdefault(reason, [])
        if len(names) < NAMED:
            names.append(f"line {n}" + (f" ({pid})" if pid else ""))
        self.actions.append(action)

    def changes(self) -> bool:
        return (
            self.cut_last_line
            or bool(self.restore)
            or any(a not in (None, "blank") for a in self.actions)
        )


def _digest(obj) -> bytes:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode()).digest()[
        :16
    ]


def _lines(path: Path):
    if path.exists():
        with open(path, "rb") as f:
            yield from f


def _indexed_lines(path: Path, plan: _Plan):
    """(line bytes or None, its index entry or None, whether the entry is the index's, the parsed
    row or None) per line of conversations.jsonl: the lines the index covers come with their
    entry, unread (draftline/regenerate/index.py), the others read and parsed, with an entry
    made from them where whole.
    plan.entries gets every whole line's entry (the last one yielded, when there is one),
    plan.indexed whether the index had them all, plan.cut_last_line whether the file ends in a
    cut line."""
    if not path.exists():
        plan.indexed = True
        return
    entries = read_index(path)
    start = 0
    for e in entries or ():
        plan.entries.append(e)
        yield None, e, True, None
        start = e.end
    with open(path, "rb") as f:
        f.seek(start)
        tail = False
        for line in f:
            tail = True
            plan.cut_last_line = not line.endswith(b"\n")
            row = _parse(line) if line.strip() else None
            e = None
            if not plan.cut_last_line:
                e = index_entry(start, line, row)
                plan.entries.append(e)
            start += len(line)
            yield line, e, False, row
    plan.indexed = entries is not None and not tail


def _read_at(path: Path, e) -> bytes:
    with open(path, "rb") as f:
        f.seek(e.start)
        return f.read(e.end - e.start)


def _superseded_entries(path: Path):
    """(index, entry or None when unreadable) of each line of superseded.jsonl."""
    for i, line in enumerate(_lines(path)):
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        yield i, entry if isinstance(entry, dict) else None


def _plan_stage(
    path: Path, prompts: dict, wanted: Wanted, prompt_digests: dict[str, str] | None = None
) -> _Plan:
    """What the stage does: keep the lines that hold (first of their id, made with the wanted
    settings, for the same prompt), move the others out, and bring back a superseded line for each
    id left without one when it holds."""
    plan = _Plan()
    digests = prompt_digests or {}

    def same_prompt(e, pid: str, checked: bool = False) -> bool:
        """The line's recorded prompt hash (in its index entry `e`, the last of plan.entries) is
        the prompt's: known from the entry when the prompt's raw line is the one last checked,
        else hashed (unless `checked` already), and the entry told the line."""
        if e.prompt_line is not None and e.prompt_line == digests.get(pid):
            return True
        if not checked and e.prompt_sha256 != prompt_sha256(prompts[pid]):
            return False
        if pid in digests:
            plan.entries[-1] = e._replace(prompt_line=digests[pid])
            plan.refreshed = True
        return True

    for n, (line, indexed, from_index, row) in enumerate(_indexed_lines(path, plan), 1):
        if from_index and indexed.id is not None and indexed.id not in plan.done:
            if wanted.fingerprint in (indexed.fingerprint, indexed.accepted_for):
                # made with these settings: what else the verdict reads is in the entry
                pid = indexed.id
                if pid in prompts and not same_prompt(indexed, pid):
                    plan.set_aside("stale_prompt", n, pid, ("stale_prompt", [], {}))
                    continue
                plan.done.add(pid)
                plan.counts["not_in_prompts"] += pid not in prompts
                plan.last_run = max(plan.last_run, indexed.run)
                plan.actions.append(None)
                continue
        if line is None:
            line = _read_at(path, indexed)
            row = _parse(line)
        if not line.strip():
            plan.actions.append("blank")
            continue
        if row is None:
            plan.set_aside("bad_lines", n, None, ("bad_line", [], {}))
            continue
        if row["id"] in plan.done:
            plan.set_aside("duplicates", n, row["id"], ("duplicate", [], {}))
            continue
        reason, changed = _verdict(row, prompts, wanted)
        if reason == "old_format":
            raise OldFormatError(path, n, row["id"])
        if reason:
            plan.set_aside(reason, n, row["id"], (reason, changed, {}))
            continue
        plan.done.add(row["id"])
        plan.counts["not_in_prompts"] += row["id"] not in prompts
        plan.last_run = max(plan.last_run, run_of(row))
        plan.actions.append(None)
        if indexed is not None and row["id"] in prompts:
            same_prompt(indexed, row["id"], checked=True)  # the entry learns the prompt line
    for i, entry in _superseded_entries(superseded_path(path)):
        if entry is None:
            continue
        row = entry.get("line")
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            continue
        if row["id"] in plan.done:
            continue
        if _verdict(row, prompts, wanted)[0] is not None:
            continue  # an old-format line too: `draftline conversations migrate` reads those
        plan.restore[i] = {}
        plan.done.add(row["id"])
        plan.counts["restored"] += 1
        plan.last_run = max(plan.last_run, run_of(row))
    return plan


def _plan_chosen(
    path: Path, prompts: dict, wanted: Wanted, chosen: Callable[[dict], bool]
) -> tuple[_Plan, Counter]:
    """Restoring by hand: the first `chosen` superseded line of each id comes back (accepted for
    the current settings when made with others), in place of every line that holds its id now.
    Lines for a prompt that has changed since, or unreadable ones, stay; skipped counts them."""
    plan, skipped = _Plan(), Counter()
    for i, entry in _superseded_entries(superseded_path(path)):
        if entry is None or not chosen(entry):
            continue
        row = entry.get("line")
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            skipped["unreadable"] += 1
            continue
        pid = row["id"]
        if pid in plan.done:
            skipped["another_line_of_the_id_chosen"] += 1
            continue
        regen = row.get("regeneration")
        if pid in prompts and (
            not isinstance(regen, dict) or regen.get("prompt_sha256") != prompt_sha256(prompts[pid])
        ):
            skipped["prompt_changed"] += 1
            continue
        reason, _ = _verdict(row, prompts, wanted)
        plan.restore[i] = {} if reason is None else {"accepted_for": wanted.fingerprint}
        plan.done.add(pid)
        plan.counts["restored"] += 1
    for line in _lines(path):
        plan.cut_last_line = not line.endswith(b"\n")
        row = _parse(line) if line.strip() else None
        if row is not None and row["id"] in plan.done:
            plan.counts["replaced"] += 1
            plan.actions.append(("replaced", [], {}))
        else:
            plan.actions.append(None if line.strip() else "blank")
    return plan, skipped


def _apply(plan: _Plan, path: Path, by: str) -> None:
    """Moves the lines out first (appended to superseded.jsonl, flushed to disk), then rewrites
    conversations.jsonl atomically with the kept and restored lines, then superseded.jsonl without
    the restored ones: a kill between two steps leaves a line in both files, never in neither.
    The index of conversations.jsonl goes before the rewrite and comes back after it."""
    spath = superseded_path(path)
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out = [a for a in plan.actions if isinstance(a, tuple) and a[0] != "keep"]
    if out:
        if plan.held is None:
            plan.held = {
                _digest(entry.get("line", entry.get("text")))
                for _, entry in _superseded_entries(spath)
                if entry is not None
            }
        newline = cut_last_line(spath)
        with open(spath, "ab") as dst:
            if newline:
                dst.write(b"\n")
            for line, action in zip(_lines(path), plan.actions):
                if not isinstance(action, tuple) or action[0] == "keep":
                    continue
                reason, changed, addition = action
                row = _parse(line)
                entry = {"reason": reason, "superseded_at": at, "by": by}
                if changed:
                    entry["changed"] = changed
                if row is None:
                    content = entry["text"] = line.decode("utf-8", "replace").rstrip("\n")
                else:
                    content = entry["line"] = _with(row, addition)
                if _digest(content) in plan.held:  # already there (a kill between two steps)
                    continue
                plan.held.add(_digest(content))
                dst.write((json.dumps(entry, ensure_ascii=False) + "\n").encode())
            dst.flush()
            os.fsync(dst.fileno())
    known = {e.start: e for e in plan.entries}  # the index entries of the lines as they are
    entries, start, end = [], 0, 0
    remove_index(path)
    with atomic_path(path) as tmp, open(tmp, "wb") as dst:
        for line, action in zip(_lines(path), plan.actions):
            old, end = end, end + len(line)
            row, data = None, None
            if action is None:
                data = line if line.endswith(b"\n") else line + b"\n"
                if old not in known or data != line:
                    row = _parse(data)
            elif isinstance(action, tuple) and action[0] == "keep":
                row = _with(_parse(line), action[1])
                data = (json.dumps(row, ensure_ascii=False) + "\n").encode()
            if data is None:
                continue
            dst.write(data)
            kept = known.get(old) if row is None else None
            entries.append(
                kept._replace(start=start, end=start + len(data))
                if kept
                else index_entry(start, data, row)
            )
            start += len(data)
        for i, entry in _superseded_entries(spath):
            if i in plan.restore:
                row = _with(entry["line"], plan.restore[i])
                data = (json.dumps(row, ensure_ascii=False) + "\n").encode()
                dst.write(data)
                entries.append(index_entry(start, data, row))
                start += len(data)
        dst.flush()
        os.fsync(dst.fileno())
    write_index(path, entries)
    if plan.restore:
        with atomic_path(spath) as tmp, open(tmp, "wb") as dst:
            for i, line in enumerate(_lines(spath)):
                if i not in plan.restore:
                    dst.write(line if line.endswith(b"\n") else line + b"\n")


NAMED = 5  # lines named per reason a line is set aside
COUNTS = (
    "bad_lines",
    "duplicates",
    "stale_settings",
    "unrecorded_settings",
    "stale_prompt",
    "not_in_prompts",
    "restored",
)


@dataclass(frozen=True)
class Finished:
    """What load_finished read of conversations.jsonl and superseded.jsonl; nothing moved yet."""

    path: Path  # conversations.jsonl
    done: set[str]  # the ids a run need not send
    counts: dict  # per kind of line (COUNTS), `last_run` and `named`: the report's `resume`
    plan: _Plan = field(repr=False)  # what set_aside_superseded does

    @property
    def moves(self) -> bool:
        """Lines to move to superseded.jsonl or back, or a cut line to set aside."""
        return self.plan.changes()


def load_finished(
    path: Path,
    prompts: dict[str, dict],
    wanted: Wanted | str,
    prompt_digests: dict[str, str] | None = None,
) -> Finished:
    """The conversations a run need not send: the lines of previous runs that still hold
    (well-formed, first of their id, made with the wanted settings and, for ids still prompted,
    from the same prompt) and the superseded lines that hold again; with counts of each kind and
    `last_run`, the highest run number kept (see run_of). Lines of ids no longer prompted stay
    (shrinking `samples` and growing it back loses nothing). Writes nothing: what does not hold is
    moved by set_aside_superseded. Both files are streamed, never held in memory (they reach
    gigabytes). `wanted` as a bare fingerprint: lines match by it. OldFormatError for a line of
    the format before settings were recorded per line."""
    if isinstance(wanted, str):
        wanted = Wanted(wanted, {})
    plan = _plan_stage(path, prompts, wanted, prompt_digests)
    counts = {k: plan.counts[k] for k in COUNTS}
    return Finished(
        Path(path), plan.done, {**counts, "last_run": plan.last_run, "named": plan.named}, plan
    )


def set_aside_superseded(finished: Finished) -> None:
    """Moves what load_finished found: the lines that do not hold to superseded.jsonl, the
    superseded ones that hold again back, a cut last line aside, the index rewritten with the
    file; the files must be as it read them (the stage runs it once every endpoint passed its
    preflight). With nothing to move: refresh_index."""
    if finished.moves:
        _apply(finished.plan, finished.path, "regenerate")
    else:
        refresh_index(finished)


def refresh_index(finished: Finished) -> None:
    """The index beside conversations.jsonl written anew where load_finished found it off, or
    learnt the prompt lines its entries were checked against: a cache, the next start reads it
    instead of the lines (draftline/regenerate/index.py)."""
    plan = finished.plan
    if not plan.indexed or plan.refreshed:
        write_index(finished.path, plan.entries)


def canonical_order(path: Path, digests: Mapping[str, str]) -> bool:
    """Rewrites conversations.jsonl in the order tokenize reads it (draftline/tokens/lines.py):
    by the run that wrote a line, then the prompt's place in `digests` (the prompt file's ids in
    order, each with the prompt_line of its raw line), lines of ids no longer prompted last (by
    run, then id). Answers finish in whatever order the server returns them, and a rerun appends
    after what it kept: without this the same conversations made by another path, or by the same
    path on a busier machine, hash differently. The index is written anew in the same order,
    each prompted line's entry holding its prompt's raw-line digest (every such line was checked
    against its prompt in this run), so its bytes do not depend on which start parsed what.
    Called at the end of a stage run that set aside what does not hold: a line nobody could read
    is left where it is (nothing is reordered) for the next run to set aside. Writes nothing when
    the file and its index already are in this order; True when the lines moved. A kill leaves
    the old order or the new one (atomic rename), never a mixture, and at worst no index."""
    path = Path(path)
    entries = list(all_entries(path))
    if not entries or any(e.id is None for e in entries):
        return False
    place = {pid: i for i, pid in enumerate(digests)}
    order = sorted(
        entries,
        key=lambda e: (e.id not in place, e.run, place.get(e.id, 0), e.id, e.start),
    )
    index, at = [], 0
    for e in order:
        size = e.end - e.start
        index.append(e._replace(start=at, end=at + size, prompt_line=digests.get(e.id)))
        at += size
    moved = [e.start for e in order] != [e.start for e in entries]
    if moved:
        remove_index(path)  # a kill before the new index leaves none, never a wrong one
        with atomic_path(path) as tmp, open(path, "rb") as src, open(tmp, "wb") as dst:
            for e in order:
                src.seek(e.start)
                dst.write(src.read(e.end - e.start))
    if moved or index != read_index(path):
        write_index(path, index)
    return moved


def restore(
    directory: Path,
    prompts: dict[str, dict],
    wanted: Wanted,
    reasons: list[str] | None = None,
    ids: list[str] | None = None,
    dry_run: bool = False,
) -> dict:
    """Superseded lines back into conversations.jsonl, never two lines of one id. Without reasons
    or ids: what the stage does before sending (load_finished, set_aside_superseded). With them:
    the chosen lines, whatever made them (see _plan_chosen). Returns the counts."""
    path = Path(directory) / "conversations.jsonl"
    skipped = Counter()
    if reasons or ids:
        wanted_ids, wanted_reasons = set(ids or ()), set(reasons or ())

        def chosen(entry: dict) -> bool:
            row = entry.get("line") if isinstance(entry.get("line"), dict) else {}
            return (not wanted_reasons or entry.get("reason") in wanted_reasons) and (
                not wanted_ids or row.get("id") in wanted_ids
            )

        plan, skipped = _plan_chosen(path, prompts, wanted, chosen)
    else:
        plan = _plan_stage(path, prompts, wanted)
    if not dry_run and plan.changes():
        _apply(plan, path, "restore")
    counts = {k: v for k, v in plan.counts.items() if v and k != "not_in_prompts"}
    return {
        **counts,
        "accepted": sum("accepted_for" in a for a in plan.restore.values()),
        "skipped": dict(skipped),
        "dry_run": dry_run,
    }


def complete_records(
    path: Path, addition_of: Callable[[dict | None], dict | None], dry_run: bool = False
) -> Counter:
    """Rewrites the `regeneration` records of conversations.jsonl (`path`) and of the lines in
    superseded.jsonl by addition_of(row) (row None: an unreadable line): {} leaves the line as it
    is, a dict is added to its record, None moves a line of conversations.jsonl aside as
    `unrecorded_settings` (by "migrate"; a superseded one stays as it is). Counts `upgraded` and
    `unrecorded_settings` of conversations.jsonl, `superseded_upgraded`; with dry_run, writes
    nothing. superseded.jsonl goes first: a kill between the files leaves records a rerun
    completes, no line lost."""
    counts: Counter = Counter()
    plan = _Plan()
    for line in _lines(path):
        addition = addition_of(_parse(line))
        if addition is None:
            plan.actions.append(("unrecorded_settings", [], {}))
            counts["unrecorded_settings"] += 1
        elif addition:
            plan.actions.append(("keep", addition))
            counts["upgraded"] += 1
        else:
            plan.actions.append(None)
    spath = superseded_path(path)
    upgraded = {}
    for i, entry in _superseded_entries(spath):
        row = entry.get("line") if entry else None
        addition = addition_of(row) if isinstance(row, dict) else {}
        if addition:
            upgraded[i] = {**entry, "line": _with(row, addition)}
    counts["superseded_upgraded"] = len(upgraded)
    if dry_run:
        return counts
    if upgraded:
        with atomic_path(spath) as tmp, open(tmp, "wb") as dst:
            for i, line in enumerate(_lines(spath)):
                if i in upgraded:
                    line = (json.dumps(upgraded[i], ensure_ascii=False) + "\n").encode()
                dst.write(line if line.endswith(b"\n") else line + b"\n")
    if counts["upgraded"] or counts["unrecorded_settings"]:
        _apply(plan, path, "migrate")
    return counts
