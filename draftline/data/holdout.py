"""Eval held out by content: the keys by which a prompt is a twin of another (its first turn exactly,
or as a template with digits masked), and how many twins the mix kept out of train."""

from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from draftline.core.io import text_sha256

if TYPE_CHECKING:
    pass


HOLDOUT_RULES = ("exact", "template")


def first_assistant(messages: list[dict]) -> int:
    return next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))


def first_turn_text(messages: list[dict], tools: list | None) -> str:
    """The normalized first turn: roles and contents before the first assistant turn, and the tools
    (NFKC, lower case, whitespace runs collapsed to one space)."""
    canonical = json.dumps(
        {
            "turn": [
                [m["role"], m.get("content") or ""] for m in messages[: first_assistant(messages)]
            ],
            "tools": tools,
        },
        sort_keys=True,
        ensure_ascii=False,
    )
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", canonical).lower()).strip()


def twin_keys(messages: list[dict], tools: list | None) -> dict[str, str]:
    """The hold-out keys of a prompt, 16 hex each: `exact`, its first turn's user messages
    normalized (a system prompt or a tool list does not make the same question new), and
    `template`, the whole first turn normalized with every run of digits replaced by 0."""
    users = [m for m in messages[: first_assistant(messages)] if m["role"] == "user"]
    return {
        "exact": text_sha256(first_turn_text(users, None))[:16],
        "template": text_sha256(re.sub(r"\d+", "0", first_turn_text(messages, tools)))[:16],
    }


def row_twin_keys(row: dict) -> dict:
    """A row's hold-out keys: precomputed by light_rows (two ints), else computed from its messages
    and tools."""
    keys = row.get("twin_keys")
    if isinstance(keys, tuple):
        return {"exact": keys[0], "template": keys[1]}
    return keys or twin_keys(row["messages"], row.get("tools"))


def without_eval_twins(
    rows: Iterator[dict], eval_rows: list[dict], rule: str, counts: Counter
) -> Iterator[dict]:
    """The rows, skipping exact twins of eval prompts and, with rule "template", template twins;
    `counts` gets "exact" / "template" per skipped row (a row that is both counts as exact)."""
    exact = {row_twin_keys(r)["exact"] for r in eval_rows}
    template = {row_twin_keys(r)["template"] for r in eval_rows}
    for row in rows:
        keys = row_twin_keys(row)
        if keys["exact"] in exact:
            counts["exact"] += 1
        elif rule == "template" and keys["template"] in template:
            counts["template"] += 1
        else:
            yield row


def twin_overlap(train: list[dict], eval_rows: list[dict]) -> dict[str, int]:
    """Eval prompts with an exact / a template twin among the train rows."""
    exact = {row_twin_keys(r)["exact"] for r in train}
    template = {row_twin_keys(r)["template"] for r in train}
    return {
        "exact": sum(row_twin_keys(r)["exact"] in exact for r in eval_rows),
        "template": sum(row_twin_keys(r)["template"] in template for r in eval_rows),
    }


def holdout_report(rule: str, splits: dict[str, list[dict]], skipped: dict[str, Counter]) -> dict:
    """The report's `holdout`: the rule, the train rows skipped as twins, and the eval and dev
    prompts that keep a twin in train (or eval in dev)."""
    train, eval_rows, dev = splits["train"], splits["eval"], splits["dev"]
    skipped_total = sum(skipped.values(), Counter())
    return {
        "rule": rule,
        "train_rows_skipped": {
            "exact": skipped_total["exact"],
            "template": skipped_total["template"],
        },
        "eval_with_twin_in_train": twin_overlap(train, eval_rows),
        "dev_with_twin_in_train": twin_overlap(train, dev),
        "eval_with_twin_in_dev": twin_overlap(dev, eval_rows),
        "eval": len(eval_rows),
        "dev": len(dev),
    }


def holdout_problem(holdout: dict, max_template_twin_share: float) -> str | None:
    """Why the held-out eval or dev split is not held out (twins left in train, or eval twins in
    dev), or None; records each split's template twin share in `holdout`."""
    holdout["max_template_twin_share"] = max_template_twin_share
    problems = []
    for split, other, key, share_key in (
        ("eval", "train", "eval_with_twin_in_train", "template_twin_share"),
        ("dev", "train", "dev_with_twin_in_train", "dev_template_twin_share"),
        ("eval", "dev", "eval_with_twin_in_dev", "eval_dev_template_twin_share"),
    ):
        overlap, n = holdout[key], holdout[split]
        share = overlap["template"] / n if n else 0.0
        holdout[share_key] = round(share, 4)
        if overlap["exact"]:
            problems.append(
                f"{overlap['exact']} {split} prompts have an exact twin in {other} (a bug: twins "
                "are skipped)"
            )
        elif share > max_template_twin_share:
            problems.append(
                f"{overlap['template']} of {n} {split} prompts ({share:.0%}) share a template "
                f"(digits masked) with a {other} prompt, above "
                f"mix.max_template_twin_share={max_template_twin_share}"
            )
    if not problems:
        return None
    return (
        f"mix: {'; '.join(problems)}. A held-out split that repeats the templates it is compared "
        "with measures recall: set mix.holdout: template (skips them) or raise the share."
    )
