"""What a regenerated conversation line says of itself that a later phase reads: the regenerate
run that wrote it. The regenerate stage numbers its runs and keeps its lines in their order
(draftline/regenerate/), and tokenize orders its rows by it (draftline/tokens/lines.py): a
contract between the two phases, so it lives here, below both.
"""

from __future__ import annotations


def run_of(row: dict) -> int:
    """The regenerate run that wrote a conversation line: each run of the stage that sends anything
    numbers its lines one past the highest kept (`regeneration.run`; 0 for lines written before runs
    were numbered). Rows are ordered by (run, prompt order) downstream: deterministic for a given
    history of runs, whatever order the answers finished in, and append-only across runs."""
    regen = row.get("regeneration")
    run = regen.get("run", 0) if isinstance(regen, dict) else 0
    return run if isinstance(run, int) else 0
