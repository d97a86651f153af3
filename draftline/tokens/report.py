"""The tokenize stage's report: what each conversation gave, counted per source, and the checks
that fail the stage (no rows, too many rows cut by tokenize.max_length)."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from draftline.tokens.config import TokenizeConfig


TURN_COUNTS = (
    "assistant_turns",
    "no_server_ids",  # the line records no ids for the turn (an older line, or an engine without)
    "server_ids",
    "retokenized_equal_server_ids",
    "retokenized_differ_from_server_ids",
    "server_ids_without_end_of_turn",  # completed with the template's end-of-turn token
    "prefilled",  # span starts inside a pre-filled generation prompt: never spliced
    "spliced",  # assistant_ids: server, the server's ids are the turn's tokens
    "with_usage",
    "retokenized_count_differs_from_usage",
    "server_ids_count_differs_from_usage",
)


def count_turn(counts: dict, check: dict) -> None:
    """Adds one check_turn result (draftline/tokens/chat.py) to `counts` (keys: TURN_COUNTS)."""
    counts["assistant_turns"] += 1
    counts["prefilled"] += check["prefilled"]
    counts["spliced"] += check["spliced"]
    if check["server_ids"]:
        counts["server_ids"] += 1
        counts["retokenized_equal_server_ids"] += check["equal"]
        counts["retokenized_differ_from_server_ids"] += not check["equal"]
        counts["server_ids_without_end_of_turn"] += check["end_of_turn_added"]
    else:
        counts["no_server_ids"] += 1
    usage = check["usage_completion_tokens"]
    if usage is not None:
        counts["with_usage"] += 1
        counts["retokenized_count_differs_from_usage"] += check["retokenized_tokens"] != usage
        if check["server_ids"]:
            counts["server_ids_count_differs_from_usage"] += check["server_tokens"] != usage


def index_report(index: Path, cfg: TokenizeConfig, missing: int, bad_lines: int, stops) -> dict:
    """The report, from the index of every conversation (streamed): the same whether a row was
    tokenized in this run or kept from an earlier one."""
    from array import array

    skipped = {"template_mismatch": 0, "template_error": 0, "no_trainable_tokens": 0}
    conversations = rows = split = truncated = tokens = trainable = longest = whole = 0
    lengths = array("q")  # every row's tokens before the cut (rows dropped as untrained included)
    turn_counts: dict[str, Counter] = {}  # source -> TURN_COUNTS
    differing = []  # the first few turns whose re-tokenized span differs from the server's ids
    with open(index, "rb") as f:
        for raw in f:
            entry = json.loads(raw)
            if entry.get("skipped"):
                skipped[entry["skipped"]] += 1
                continue
            skipped["no_trainable_tokens"] += entry["untrained"]
            lengths.extend(entry["lengths"])
            turn_counts.setdefault(entry["source"], Counter()).update(entry["turns"])
            differing += entry.get("differences", [])[: 5 - len(differing)]
            conversations += bool(entry["rows"])
            split += entry["rows"] > 1
            rows += entry["rows"]
            truncated += entry["truncated"]
            whole += entry["whole"]
            tokens += entry["tokens"]
            trainable += entry["trainable"]
            longest = max(longest, entry["longest"])
    totals = Counter()
    for counts in turn_counts.values():
        totals.update(counts)
    return {
        "conversations": conversations,
        "rows": rows,
        "split_conversations": split,  # the template rewrote earlier turns: more than one row
        "missing_regenerations": missing,
        "unreadable_regenerated_lines": bad_lines,
        "skipped": skipped,
        "tokens": tokens,
        "trainable_tokens": trainable,
        "trainable_fraction": round(trainable / tokens, 4) if tokens else 0.0,
        "truncated": truncated,
        # rows whose segment-wise tokens differed from the row tokenized at once (see draftline/tokens/chat.py)
        "rows_tokenized_whole": whole,
        "max_length": cfg.max_length,
        "longest_row": longest,
        "end_of_turn_tokens": stops,
        "check": truncation_check(lengths, cfg.max_length, cfg.max_truncated_share),
        # each assistant turn's re-tokenized span against the server's own token ids and
        # usage.completion_tokens, as regenerate recorded them (docs/regeneration.md)
        "server_token_ids": {
            "assistant_ids": cfg.assistant_ids,
            **{k: totals[k] for k in TURN_COUNTS},
            "by_source": {
                source: {k: counts[k] for k in TURN_COUNTS}
                for source, counts in sorted(turn_counts.items())
            },
            "first_differences": differing,
        },
        "_lengths": lengths,
    }


def no_rows_message(report: dict, lengths, regenerated_path: str, max_length: int) -> str:
    cut = sum(n > max_length for n in lengths)
    return f"tokenize produced no rows from {regenerated_path} (skipped: {report['skipped']})" + (
        f"; {cut} of {len(lengths)} rows were longer than tokenize.max_length "
        f"{max_length}, which left them no trainable token: raise it"
        if cut
        else ""
    )


def truncation_check(lengths: list[int], max_length: int, max_share: float) -> dict:
    """reports/tokenize.json's `check`: the share of rows cut at max_length (`lengths`: each row's
    tokens before the cut) against tokenize.max_truncated_share, the longest row before the cut,
    and the max_length that would cut at most that share."""
    cut = sum(n > max_length for n in lengths)
    share = cut / len(lengths) if lengths else 0.0
    ordered = sorted(lengths)
    keep = min(len(ordered) - 1, math.ceil((1 - max_share) * len(ordered)) - 1)
    return {
        "param": "tokenize.max_truncated_share",
        "rows": len(lengths),
        "truncated": cut,
        "share": round(share, 4),
        "threshold": max_share,
        "verdict": "fail" if share > max_share else "pass",
        "longest_before_cut": ordered[-1] if ordered else 0,
        "max_length_for_threshold": ordered[max(keep, 0)] if ordered else max_length,
    }


def truncation_error(report: dict) -> str | None:
    """The stage's error when more rows were cut than tokenize.max_truncated_share."""
    check = report["check"]
    if check["verdict"] != "fail":
        return None
    return (
        f"error: {check['truncated']} of {check['rows']} rows ({check['share']:.1%}) were longer "
        f"than tokenize.max_length {report['max_length']} and cut (the longest had "
        f"{check['longest_before_cut']} tokens), more than tokenize.max_truncated_share "
        f"{check['threshold']}: their tails are lost and the hidden-state disk estimate counts "
        f"only what is left. Raise tokenize.max_length (to at least the longest context "
        f"regenerate allows, regenerate.short/long.max_context; {check['max_length_for_threshold']} "
        f"would cut at most {check['threshold']:.0%} of these rows), or raise "
        "tokenize.max_truncated_share (1.0 turns the check off)."
    )
