"""Backend hf's batches: rows of similar length grouped by token budget, fixed for a run and run
through the target.

The batches are saved in the output directory (BATCHES_FILE) until the run completes: a resumed
run recomputes each unfinished batch with exactly the rows, order and padding of the run it
resumes, so its files are byte-identical to an uninterrupted run's (padding and batch shape change
the rounding of the stored bf16 values).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from draftline.hidden_states.capture import capture
from draftline.hidden_states.files import hs_path, save_hidden_states

BATCHES_FILE = ".extract_plan.json"  # the batches of a run in progress (see fixed_batches)


def token_budget_batches(lengths: dict[int, int], budget: int) -> list[list[int]]:
    """Group row indices of similar length so that rows x padded length stays within budget
    (a row longer than the budget goes alone)."""
    order = sorted(lengths, key=lambda i: (lengths[i], i))
    batches, current, longest = [], [], 0
    for i in order:
        longest_if = max(longest, lengths[i])
        if current and longest_if * (len(current) + 1) > budget:
            batches.append(current)
            current, longest_if = [], lengths[i]
        current.append(i)
        longest = longest_if
    if current:
        batches.append(current)
    return batches


def _row_digest(ids) -> str:
    return hashlib.blake2b(json.dumps(list(ids)).encode(), digest_size=8).hexdigest()


def fixed_batches(rows, todo: dict[int, int], token_budget: int, out: Path) -> list[list[int]]:
    """The batches to run, fixed for the whole run and saved in out/BATCHES_FILE.

    Batches left by a killed run are reused when they were made with the same token_budget for
    the same rows (token digests): they keep their exact make-up, so resumed files are
    byte-identical to an uninterrupted run's. Rows they do not cover (samples grew meanwhile) get
    batches of their own. A fresh run batches its `todo` rows by token budget."""
    path, saved_batches = out / BATCHES_FILE, None
    if path.exists():
        try:
            saved = json.loads(path.read_text())
            covered = [int(i) for i in saved["rows"]]
            if saved["token_budget"] == token_budget and all(i < len(rows) for i in covered):
                ids = rows.with_format(None).select(covered)["input_ids"] if covered else []
                if all(
                    _row_digest(t) == saved["rows"][str(i)]
                    for i, t in zip(covered, ids, strict=True)
                ):
                    saved_batches = saved
        except (OSError, ValueError, KeyError, TypeError):
            saved_batches = None
    if saved_batches is None:
        saved_batches = {"token_budget": token_budget, "rows": {}, "batches": []}
    uncovered = {i: n for i, n in todo.items() if str(i) not in saved_batches["rows"]}
    if uncovered:
        new = token_budget_batches(uncovered, token_budget)
        ids = rows.with_format(None).select(sorted(uncovered))["input_ids"]
        saved_batches["rows"].update(
            {str(i): _row_digest(t) for i, t in zip(sorted(uncovered), ids, strict=True)}
        )
        saved_batches["batches"] += new
        out.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(saved_batches))
        os.replace(tmp, path)
    return [[int(i) for i in batch] for batch in saved_batches["batches"]]


@dataclass(frozen=True)
class BatchJob:
    """What backend hf captures and where it stores it: the aux layers (the last one is always
    added), the output directory, the stored dtype and the padded tokens per forward."""

    aux_layer_ids: list[int]
    out: Path
    dtype: torch.dtype
    token_budget: int


def extract_batches(
    model,
    rows,
    todo: dict[int, int],
    job: BatchJob,
    on_batch: Callable[[int, int], None] | None = None,
) -> int:
    """Capture and write the states of the `todo` rows, by the fixed_batches (every row of a batch
    that has a todo row is run; only todo rows are written); on_batch(rows, tokens) after each.
    Returns tokens done. The batches file is removed once every batch is done."""
    done = 0
    for batch in fixed_batches(rows, todo, job.token_budget, job.out):
        wanted = [i for i in batch if i in todo]
        if not wanted:
            continue
        token_ids = rows.with_format(None)[batch]["input_ids"]
        for i, ids, hs in zip(
            batch, token_ids, capture(model, token_ids, job.aux_layer_ids), strict=True
        ):
            if i in todo:
                save_hidden_states(hs_path(job.out, i), ids, hs, job.dtype)
        done += sum(todo[i] for i in wanted)
        if on_batch:
            on_batch(len(wanted), sum(todo[i] for i in wanted))
    (job.out / BATCHES_FILE).unlink(missing_ok=True)
    return done
