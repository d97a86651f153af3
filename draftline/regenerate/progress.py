"""How a regenerate run shows its progress and explains its failures.

A rich progress bar on a terminal, a plain progress line every tick in a log file (done, in flight,
rates, ETA); and, when more conversations failed than regenerate.max_failure_rate allows, the
stage's error: per failure reason, its count and what to change.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from draftline.regenerate.config import RegenerateConfig
    from draftline.regenerate.replay import Tally

# ---- progress --------------------------------------------------------------------------------


def eta(seconds: float) -> str:
    if seconds != seconds or seconds == float("inf"):
        return "?"
    minutes, sec = divmod(int(seconds), 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{sec:02d}s"


def progress_line(t: Tally, total: int, elapsed: float, slots: int | None) -> str:
    """One plain progress line: done, in flight (of what the servers run at once), rates, ETA."""
    rate = t.done / elapsed if elapsed > 0 else 0.0
    left = (total - t.done) / rate if rate else float("inf")
    bound = f" (at most {slots})" if slots else ""
    return (
        f"regenerate: {t.done}/{total} done (ok {t.ok}, failed {t.failed}, truncated {t.truncated}), "
        f"in flight {t.in_flight}{bound}, {t.streamed_tokens / max(elapsed, 1e-6):.0f} tok/s, "
        f"{t.requests / max(elapsed, 1e-6):.2f} req/s, ETA {eta(left)}"
        + (f"; retries {dict(t.retries)}" if t.retries else "")
    )


@contextlib.contextmanager
def progress_bar(total: int, slots: int | None):
    """(on_done, on_tick) for regenerate_all: a rich bar on a terminal; a plain line every tick
    otherwise (a log file), even while no conversation finishes."""
    # rich loads on first use: importing this module stays light
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    fields = (
        "ok {task.fields[ok]} failed {task.fields[failed]} truncated {task.fields[truncated]}  "
        "in flight {task.fields[in_flight]}  {task.fields[rps]:.1f} req/s {task.fields[tps]:.0f} tok/s"
    )
    with Progress(
        TextColumn("regenerate"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(fields),
        TimeRemainingColumn(),
        console=console,
    ) as bar:
        task = bar.add_task(
            "regenerate", total=total, ok=0, failed=0, truncated=0, in_flight=0, rps=0.0, tps=0.0
        )
        start = time.monotonic()

        def update(t):
            elapsed = max(time.monotonic() - start, 1e-6)
            bar.update(
                task,
                completed=t.done,
                ok=t.ok,
                failed=t.failed,
                truncated=t.truncated,
                in_flight=t.in_flight,
                rps=t.requests / elapsed,
                tps=t.streamed_tokens / elapsed,
            )

        def on_tick(t):
            update(t)
            if not console.is_terminal:  # the bar's plain form in a log file, on its console
                line = progress_line(t, total, time.monotonic() - start, slots)
                console.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)

        yield update, on_tick


# ---- failures --------------------------------------------------------------------------------


# What to change when conversations fail, by failure reason: the cause and the param.
ADVICE = {
    "first_token_timeout": "the server did not start answering within regenerate.first_token_timeout_s; raise it "
    "(long prompts prefill slowly), or set regenerate.server_slots to what the server runs at "
    "once so that requests do not wait in its queue",
    "token_timeout": "the server stalled between two tokens longer than regenerate.token_timeout_s; raise it, or "
    "check the server log for a stall",
    "timeout": "the connection timed out; see the server log, or raise regenerate.first_token_timeout_s",
    "connection": "the server dropped connections or is down; see the server log",
    "stream_error": "the server reported errors mid-answer; see the server log",
    "bad_response": "the server's answers are not chat completions; check regenerate.external_engine / the endpoint",
    "empty_response": "the server answered without choices; see the server log",
    "prompt_too_long": "prompts longer than the partition's max_context; raise regenerate.short.max_context / "
    "regenerate.long.max_context, or lower mix.long_threshold_tokens",
    "template_error": "the target's chat template rejects these conversations; see failures.jsonl",
}


def failure_advice(reasons: dict) -> str:
    lines = []
    for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1]):
        if reason.startswith("http_"):
            code = int(reason[5:])
            text = (
                "server errors; see the server log"
                if code >= 500 or code in (408, 429)
                else "the server refused the request; see the detail in failures.jsonl (regenerate.max_tokens or "
                "max_context beyond the model's context, or chat_template_kwargs it does not accept?)"
            )
        else:
            text = ADVICE.get(reason, "see failures.jsonl")
        lines.append(f"  {count} x {reason}: {text}")
    return "\n".join(lines)


def failure_error(cfg: RegenerateConfig, tally: Tally, sent: int, out: Path) -> str | None:
    """The stage's error when more than regenerate.max_failure_rate of the `sent` conversations failed."""
    if not (tally.aborted or tally.failed > cfg.max_failure_rate * sent):
        return None
    stopped = (
        f" (stopped early; {tally.cancelled} in flight cancelled)"
        if tally.aborted and tally.done < sent
        else ""
    )
    return (
        f"error: {tally.failed} of {sent} conversations failed{stopped}, more than "
        f"regenerate.max_failure_rate {cfg.max_failure_rate}; by cause:\n"
        f"{failure_advice(dict(tally.failure_reasons))}\n"
        f"Details in {out / 'failures.jsonl'}; a rerun sends only the missing ones."
    )
