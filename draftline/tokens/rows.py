"""A batch of regenerated conversations into rows: what each conversation gives.

Each conversation is planned (draftline/tokens/chat.py: its rows where the chat template rewrites
earlier turns, or why it has none: the template refuses it, or renders it otherwise than turn by
turn), the rows of a whole batch tokenized in one call, the server's ids spliced in
(`tokenize.assistant_ids: server`), rows cut at tokenize.max_length, rows left with nothing to
train dropped. Besides its rows, each conversation's index entry: what it gave and how its
assistant turns compare with the server's own tokens (draftline/tokens/report.py counts them).

The code here shapes the rows a rerun keeps: it is in their key (draftline/core/shaping.py).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from draftline.tokens.chat import (
    ServerTurn,
    TemplateMismatch,
    conversation_rows,
    mark_length_cut,
    plan_conversation,
    tokenize_rows,
)
from draftline.tokens.report import count_turn

if TYPE_CHECKING:
    from draftline.core.card import TargetCard
    from draftline.tokens.config import TokenizeConfig
    from draftline.tokens.lines import Line


def server_turns(regeneration: dict) -> list | None:
    """What the server said of each assistant turn of a line (draftline/regenerate/replay.py records
    `completion_token_ids` and `turn_completion_tokens` per turn); None for a line written before
    they were recorded."""
    ids = regeneration.get("completion_token_ids")
    counts = regeneration.get("turn_completion_tokens")
    if not isinstance(ids, list) and not isinstance(counts, list):
        return None
    ids = ids if isinstance(ids, list) else []
    counts = counts if isinstance(counts, list) else []
    return [
        ServerTurn(
            ids[k] if k < len(ids) and isinstance(ids[k], list) else None,
            counts[k] if k < len(counts) and isinstance(counts[k], int) else None,
        )
        for k in range(max(len(ids), len(counts)))
    ]


def plan_batch(
    tokenizer, batch: list[tuple[Line, dict]], stops: list[str], template_kwargs: dict
) -> list:
    """Each conversation's plan (draftline/tokens/chat.py, plan_conversation), or why it has none."""
    from jinja2 import TemplateError

    plans = []
    for _, row in batch:
        regeneration = row.get("regeneration") or {}
        messages = mark_length_cut(row["messages"], regeneration.get("finish_reasons"))
        try:
            plans.append(
                plan_conversation(tokenizer, messages, row.get("tools"), stops, template_kwargs)
            )
        except TemplateMismatch:
            plans.append("template_mismatch")
        except (
            TemplateError
        ):  # the template refuses the conversation (e.g. two parallel tool calls)
            plans.append("template_error")
    return plans


def tokenize_batch(
    tokenizer,
    batch: list[tuple[Line, dict]],
    plans: list,
    card: TargetCard,
    cfg: TokenizeConfig,
) -> list[tuple[dict, list[dict]]]:
    """(index entry, rows) of each planned conversation: one tokenize_rows call for all their rows."""
    spans = [s for plan in plans if not isinstance(plan, str) for s in plan.row_spans()]
    tokenized = iter(tokenize_rows(tokenizer, spans))
    out = []
    for (line, row), plan in zip(batch, plans):
        entry = {"id": line.id, "sha256": line.sha256, "source": str(row.get("source") or "?")}
        if isinstance(plan, str):
            out.append(({**entry, "rows": 0, "skipped": plan}, []))
            continue
        regeneration = row.get("regeneration") or {}
        parts = conversation_rows(
            tokenizer,
            plan,
            [next(tokenized) for _ in plan.rows],
            cfg.max_length,
            server_turns(regeneration),
            cfg.assistant_ids == "server",
        )
        turns, differences = Counter(), []
        for check in (c for p in parts for c in p["checks"]):
            count_turn(turns, check)
            if check.get("first_difference") is not None and len(differences) < 5:
                differences.append(
                    {
                        "id": line.id,
                        "message": check["message"],
                        "first_difference": check["first_difference"],
                        "retokenized": tokenizer.convert_ids_to_tokens(check["retokenized_around"]),
                        "server": tokenizer.convert_ids_to_tokens(check["server_around"]),
                    }
                )
        kept = [p for p in parts if any(p["loss_mask"])]  # truncation can leave a row untrained
        rows = []
        for k, p in enumerate(kept):  # ids outside the vocabulary: rows_table
            rows.append(
                {
                    "id": line.id,
                    "part": k,
                    "input_ids": p["input_ids"],
                    "loss_mask": p["loss_mask"],
                    "seq_len": len(p["input_ids"]),
                }
            )
        entry.update(
            rows=len(kept),
            untrained=len(parts) - len(kept),
            lengths=[p["length"] for p in parts],  # rows dropped as untrained included
            tokens=sum(len(p["input_ids"]) for p in kept),
            trainable=sum(sum(p["loss_mask"]) for p in kept),
            truncated=sum(p["truncated"] for p in kept),
            whole=sum(p["whole"] for p in kept),
            longest=max((len(p["input_ids"]) for p in kept), default=0),
            turns={k: v for k, v in turns.items() if v},
        )
        if differences:
            entry["differences"] = differences
        out.append((entry, rows))
    return out
