"""The regenerated conversations file and its prompts: what each line records, which lines a
rerun keeps, and the order rows take downstream.

Output is append-only JSONL keyed by prompt id, one flushed line per finished conversation. Each
line carries a `regeneration` record with the fingerprint of what shaped it (target, chat
template, output-shaping params) and the hash of its prompt: a rerun keeps the lines that still
match and sends only the missing prompts.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from draftline.config import output_shaping
from draftline.io import atomic_path, read_jsonl

if TYPE_CHECKING:
    from draftline.card import TargetCard
    from draftline.config import RegenerateConfig


def _sha256(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def prompt_sha256(row: dict) -> str:
    """Hash of what the target is asked (messages and tools): a changed prompt is regenerated."""
    return _sha256({"messages": row["messages"], "tools": row.get("tools")})[:16]


def fingerprint(settings: dict) -> str:
    """Hash of everything that shapes the answers (target, chat template, sampling)."""
    return _sha256(settings)[:16]


def regeneration_settings(cfg: RegenerateConfig, card: TargetCard) -> dict:
    """Everything that shapes the answers: the target, its chat template and the output-shaping
    regenerate params (draftline/config.py). Conversations made under other settings are redone."""
    return {
        "model": card.model,
        "revision": card.revision,
        "chat_template_sha256": card.chat_template_sha256,
        **output_shaping(cfg),
    }


def read_prompts(path: str | Path) -> list[dict]:
    """The prompt rows, each with a string `id` (unique) and a `messages` list; else the stage stops."""
    rows, seen = [], set()
    for n, row in enumerate(read_jsonl(path), 1):
        if not isinstance(row.get("id"), str) or not isinstance(row.get("messages"), list):
            raise SystemExit(
                f"error: {path} line {n}: a prompt needs a string `id` and a `messages` list"
            )
        if row["id"] in seen:
            raise SystemExit(f"error: {path} line {n}: duplicate prompt id {row['id']!r}")
        seen.add(row["id"])
        rows.append(row)
    return rows


def cut_last_line(path: Path) -> bool:
    """The file ends in a line a kill cut short (no final newline)."""
    if not path.exists() or not path.stat().st_size:
        return False
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def load_finished(
    path: Path, prompts: dict[str, dict], tags_fingerprint: str, rewrite: bool = True
) -> tuple[set[str], dict]:
    """Ids of the lines of previous runs that still hold: well-formed, first of their id, made
    with the same fingerprint and, for ids still prompted, from the same prompt; with counts of
    what was dropped and `last_run`, the highest run number kept (see run_of). Lines of ids no
    longer prompted stay (shrinking `samples` and growing it back loses nothing). When anything was
    dropped or the last line was cut by a kill, the file is rewritten atomically without it (only
    with `rewrite`: the stage first counts, and drops lines only once the servers passed their
    preflight); the file is streamed twice rather than held in memory (it reaches gigabytes)."""
    counts = Counter()
    keep: list[bool] = []
    done: set[str] = set()
    last_run = 0  # the highest `run` of the lines kept (lines from before runs were numbered: 0)
    cut_last_line = False
    if path.exists():
        with open(path, "rb") as f:
            for line in f:
                cut_last_line = not line.endswith(b"\n")
                if not line.strip():
                    keep.append(False)
                    continue
                try:
                    row = json.loads(line)
                    pid = row["id"]
                    regen = row.get("regeneration")  # absent: written before records had one
                    ok_row = isinstance(pid, str)
                except (ValueError, KeyError, TypeError, AttributeError):
                    ok_row = False
                if not ok_row:
                    reason = "bad_lines"
                elif pid in done:
                    reason = "duplicates"
                elif not isinstance(regen, dict) or regen.get("fingerprint") != tags_fingerprint:
                    reason = "stale_settings"
                elif pid in prompts and regen.get("prompt_sha256") != prompt_sha256(prompts[pid]):
                    reason = "stale_prompt"
                else:
                    reason = None
                    done.add(pid)
                    counts["not_in_prompts"] += pid not in prompts
                    last_run = max(last_run, run_of(row))
                if reason:
                    counts[reason] += 1
                keep.append(reason is None)
    dropped = sum(v for k, v in counts.items() if k != "not_in_prompts")
    if rewrite and (dropped or cut_last_line):
        with atomic_path(path) as tmp, open(path, "rb") as src, open(tmp, "wb") as dst:
            for line, kept in zip(src, keep):
                if kept:
                    dst.write(line if line.endswith(b"\n") else line + b"\n")
    kept = {
        k: counts[k]
        for k in ("bad_lines", "duplicates", "stale_settings", "stale_prompt", "not_in_prompts")
    }
    return done, {**kept, "last_run": last_run}


def run_of(row: dict) -> int:
    """The regenerate run that wrote a conversation line: each run of the stage that sends anything
    numbers its lines one past the highest kept (`regeneration.run`; 0 for lines written before runs
    were numbered). Rows are ordered by (run, prompt order) downstream: deterministic for a given
    history of runs, whatever order the answers finished in, and append-only across runs."""
    regen = row.get("regeneration")
    run = regen.get("run", 0) if isinstance(regen, dict) else 0
    return run if isinstance(run, int) else 0
