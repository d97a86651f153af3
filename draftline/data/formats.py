"""Row conversion: every raw row of a dataset, whatever its format, normalized into one prepared record.

Formats: ShareGPT, OpenAI messages, Alpaca, prompt-only (reading the rows is draftline/data/sources.py).
Every row becomes one record::

    {"id": str, "source": str, "source_detail"?: str, "decode"?: "history", "tools": list | None,
     "prompt_tokens_est": int,
     "messages": [{"role": "system|user|assistant|tool", "content": str,
                   "reasoning_content"?: str, "tool_calls"?: [...], "tool_call_id"?: str}]}

`source` is the dataset's name in params.yaml; `source_detail` is the row's own `source` column
when it has one (the upstream subset of a blended set); `decode: "history"`, kept from a row that
says so, marks an eval prompt decoded from its whole history rather than its first turn. A
top-level `system` column becomes the first system turn in every format.

A row that cannot become a record is dropped with a reason (``Dropped``) that the caller counts.
Turn-order rules:

- system turns only before every other turn;
- the first other turn is a user turn (so an assistant-first conversation is invalid);
- a tool turn follows an assistant turn or another tool turn;
- two assistant turns in a row are invalid (which one would be regenerated?); two user turns in a
  row are allowed: some datasets split one message and chat templates render them fine.

A conversation ending on a user or tool turn gets an empty assistant turn appended, so every
record ends on an assistant turn and each assistant turn marks one reply for `regenerate` to write
(prompt-only rows get exactly one). Inline markup (``<think>``, ``<tool_call>``, ``<tool_response>``,
a system prompt's ``<tools>`` block) stays inline unless ``parse_markup`` turns it into
``reasoning_content``, ``tool_calls``, plain tool results and ``tools``.

Everything streams: rows are read, converted and yielded one at a time, and the duplicate filter
keeps 64-bit digests only, so memory stays flat in the number of rows. (Over 400 lines on purpose:
the record schema and every rule that decides what a row becomes or why it is dropped, in one place.)
"""

from __future__ import annotations

import ast
import json
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import NamedTuple

from draftline.core.io import text_sha256
from draftline.data.config import SCRIPTS
from draftline.data.pydoc_long import DECODE_HISTORY

FORMATS = ("sharegpt", "openai", "alpaca", "prompt")
# Detection by key, first match wins: (key, format).
DETECT_KEYS = (
    ("conversations", "sharegpt"),
    ("messages", "openai"),
    ("instruction", "alpaca"),
    ("prompt", "prompt"),
    ("question", "prompt"),
)
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "system": "system",
    "tool": "tool",
    "observation": "tool",
    "function_response": "tool",
    "function_call": "assistant",
}
OPENAI_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
}
FIELDS = {
    fmt: tuple(key for key, f in DETECT_KEYS if f == fmt) for fmt in FORMATS
}  # a row needs one
ID_KEYS = ("id", "conversation_id")  # a source's own row id, first present wins
_SCRIPT_OF_NAME = {
    "LATIN": "latin",
    "CYRILLIC": "cyrillic",
    "GREEK": "greek",
    "ARABIC": "arabic",
    "HEBREW": "hebrew",
    "DEVANAGARI": "devanagari",
    "THAI": "thai",
    "CJK": "han",
    "HIRAGANA": "kana",
    "KATAKANA": "kana",
    "HANGUL": "hangul",
}
SCRIPT_SAMPLE_LETTERS = 2000  # letters looked at per row: enough to tell, cheap on long prompts


class Dropped(Exception):
    """A row that cannot become a record; ``reason`` is the key counted in the report."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# ---- converting one row ----------------------------------------------------------------------


def detect_format(row: dict) -> str:
    for key, fmt in DETECT_KEYS:
        if key in row:
            return fmt
    raise Dropped("unrecognized_format")


def remap_fields(row: dict, fields: dict[str, str]) -> dict:
    """The row with each canonical field read from its source column (e.g. prompt <- question)."""
    if missing := [src for src in fields.values() if src not in row]:
        raise Dropped("missing_field") from KeyError(missing[0])
    return {**row, **{canonical: row[src] for canonical, src in fields.items()}}


def _text(content) -> str:
    """Message content as text: None → "", OpenAI content parts → their text joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        if any(p.get("type", "text") != "text" for p in content):
            raise Dropped("non_text_content")  # images/audio: the target is text-only
        return "".join(str(p.get("text") or "") for p in content)
    raise Dropped("invalid_message")


def parse_tools(tools) -> list[dict] | None:
    """`tools` given as a list or a JSON string of one; bare function schemas get the OpenAI wrapper."""
    if tools is None or tools == "" or tools == []:
        return None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError:
            raise Dropped("invalid_tools_json") from None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise Dropped("invalid_tools_json")
    return [
        {"type": "function", **t} if "function" in t else {"type": "function", "function": t}
        for t in tools
    ] or None


def _tool_calls(calls, turn: int) -> list[dict]:
    """OpenAI tool_calls with arguments as a JSON string; a missing id becomes call_<turn>_<k>."""
    if not isinstance(calls, list):
        raise Dropped("invalid_tool_calls")
    out = []
    for k, call in enumerate(calls):
        fn = (
            call.get("function", call) if isinstance(call, dict) else None
        )  # also bare {"name","arguments"}
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise Dropped("invalid_tool_calls")
        args = fn.get("arguments")
        args = args if isinstance(args, str) else json.dumps(args or {}, ensure_ascii=False)
        out.append(
            {
                "id": str(call.get("id") or f"call_{turn}_{k}"),
                "type": "function",
                "function": {"name": fn["name"], "arguments": args},
            }
        )
    return out


def from_openai(messages) -> list[dict]:
    if not messages:
        return []
    if not isinstance(messages, list):
        raise Dropped("invalid_message")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise Dropped("invalid_message")
        role = OPENAI_ROLES.get(m.get("role"))
        if role is None:
            raise Dropped("invalid_role")
        msg = {"role": role, "content": _text(m.get("content"))}
        if (
            role == "assistant"
            and isinstance(m.get("reasoning_content"), str)
            and m["reasoning_content"]
        ):
            msg["reasoning_content"] = m["reasoning_content"]
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = _tool_calls(m["tool_calls"], i)
        if role == "tool" and m.get("tool_call_id"):
            msg["tool_call_id"] = str(m["tool_call_id"])
        out.append(msg)
    return out


def from_sharegpt(turns) -> list[dict]:
    if not turns:
        return []
    if not isinstance(turns, list):
        raise Dropped("invalid_message")
    out, unanswered = [], []  # unanswered: ids of function_call turns awaiting their observation
    for i, t in enumerate(turns):
        if not isinstance(t, dict):
            raise Dropped("invalid_message")
        speaker, value = t.get("from", t.get("role")), t.get("value", t.get("content"))
        role = SHAREGPT_ROLES.get(speaker)
        if role is None:
            raise Dropped("invalid_role")
        if speaker == "function_call":
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except json.JSONDecodeError:
                    raise Dropped("invalid_tool_calls") from None
            call = _tool_calls([value], i)[0]
            if out and out[-1]["role"] == "assistant":  # "gpt: let me check" + call = one reply
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
            unanswered.append(call["id"])
            continue
        msg = {"role": role, "content": _text(value)}
        if role == "tool" and unanswered:
            msg["tool_call_id"] = unanswered.pop(0)
        elif role != "tool":
            unanswered = []
        out.append(msg)
    return out


def from_alpaca(row: dict) -> list[dict]:
    instruction, extra = _text(row.get("instruction")), _text(row.get("input"))
    system = [{"role": "system", "content": _text(row["system"])}] if row.get("system") else []
    return system + [
        {"role": "user", "content": f"{instruction}\n\n{extra}" if extra else instruction},
        {"role": "assistant", "content": _text(row.get("output"))},
    ]


# the reply a record leaves to the target to write (regenerate, and evaluate's later turns)
ASSISTANT_TO_WRITE = {"role": "assistant", "content": ""}
# A row's `decode` that evaluate reads (draftline/evaluate/prompts.py eval_prompt_ids): the prompt is
# the whole history up to the last user turn (a long document or agentic history), not the first
# turn; the builtin sources write it (draftline/data/pydoc_long.py, where it is defined: formats
# imports data.config, which imports the builtins). Any other value is no instruction, not kept.


def from_prompt(row: dict) -> list[dict]:
    prompt = row["prompt"] if "prompt" in row else row["question"]
    if isinstance(prompt, list) and prompt and all(isinstance(t, str) for t in prompt):
        # a list of user turns (MT-Bench): each answered in turn, the replies left to the target
        if not all(turn.strip() for turn in prompt):
            raise Dropped("empty")  # a blank turn: nothing to answer there
        return [
            m
            for turn in prompt
            for m in ({"role": "user", "content": turn}, dict(ASSISTANT_TO_WRITE))
        ][:-1]
    if isinstance(prompt, list):  # some "prompt" columns hold a message list
        return from_openai(prompt)
    system = [{"role": "system", "content": _text(row["system"])}] if row.get("system") else []
    return system + [{"role": "user", "content": _text(prompt)}]


def with_row_system(row: dict, messages: list[dict]) -> list[dict]:
    """A row's top-level `system` column (OpenThoughts-style ShareGPT rows, some messages sets) as
    the first turn, unless the conversation already opens with that same system text."""
    system = _text(row.get("system")) if row.get("system") else ""
    if not system.strip() or (
        messages and messages[0]["role"] == "system" and messages[0]["content"] == system
    ):
        return messages
    return [{"role": "system", "content": system}] + messages


CONVERTERS = {
    "sharegpt": lambda row: with_row_system(row, from_sharegpt(row["conversations"])),
    "openai": lambda row: with_row_system(row, from_openai(row["messages"])),
    "alpaca": from_alpaca,
    "prompt": from_prompt,
}

# ---- inline markup → structure (parse_markup) ------------------------------------------------

THINK_RE = re.compile(r"^\s*<think>(.*?)</think>\s*", re.S)
TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
TOOL_RESPONSE_RE = re.compile(r"^\s*<tool_response>(.*?)</tool_response>\s*$", re.S)
TOOLS_BLOCK_RE = re.compile(r"<tools>(.*?)</tools>", re.S)
_EDGE_NEWLINES_RE = re.compile(r"^(?:\s|\\n)+|(?:\s|\\n)+$")  # real or escaped ("\\n") newlines


def _literal(text: str, reason: str):
    """JSON, else a Python literal: Hermes data writes its dicts with single quotes and True/None.
    ast.literal_eval evaluates no code; it only parses literals."""
    text = _EDGE_NEWLINES_RE.sub("", text)
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise Dropped(reason) from None


def _tools_block(system: str) -> re.Match | None:
    """The last non-blank <tools> block: Hermes prompts first mention "<tools> </tools> XML tags" in prose."""
    blocks = [b for b in TOOLS_BLOCK_RE.finditer(system) if b.group(1).strip()]
    return blocks[-1] if blocks else None


def parse_inline_markup(messages: list[dict], tools: list | None) -> tuple[list[dict], list | None]:
    """Inline markup turned into structure, so the target renders it with its own chat template:

    - a leading ``<think>…</think>`` of an assistant turn → ``reasoning_content``;
    - ``<tool_call>{"name", "arguments"}</tool_call>`` blocks → ``tool_calls`` (ids call_<turn>_<k>);
    - a tool turn's ``<tool_response>…</tool_response>`` wrapper → its bare content, linked to the
      pending call by ``tool_call_id``;
    - a system turn's ``<tools>[…]</tools>`` block → ``tools`` (when the row has none); the rest of
      that system text stays, and a system turn left empty is dropped.
    """
    out, pending = [], []
    for i, m in enumerate(messages):
        m = dict(m)
        if m["role"] == "system" and tools is None and (block := _tools_block(m["content"])):
            listed = _literal(block.group(1), "invalid_tools_json")
            tools = parse_tools(listed if isinstance(listed, list) else [listed])
            m["content"] = (m["content"][: block.start()] + m["content"][block.end() :]).strip()
            if not m["content"]:
                continue
        elif m["role"] == "assistant":
            if think := THINK_RE.match(m["content"]):
                if think.group(1).strip() and "reasoning_content" not in m:
                    m["reasoning_content"] = think.group(1).strip()
                m["content"] = m["content"][think.end() :]
            if call_blocks := TOOL_CALL_RE.findall(m["content"]):
                calls = _tool_calls([_literal(b, "invalid_tool_calls") for b in call_blocks], i)
                m["tool_calls"] = m.get("tool_calls", []) + calls
                m["content"] = TOOL_CALL_RE.sub("", m["content"]).strip()
            pending = [call["id"] for call in m.get("tool_calls", [])]
        elif m["role"] == "tool":
            if response := TOOL_RESPONSE_RE.match(m["content"]):
                m["content"] = response.group(1).strip()
            if "tool_call_id" not in m and pending:
                m["tool_call_id"] = pending.pop(0)
        out.append(m)
    return out, tools


# ---- checks and filters ----------------------------------------------------------------------


def order_problem(messages: list[dict]) -> str | None:
    """Why a conversation is unusable (empty / no_user_turn / invalid_role_order), or None."""
    if not any(m["content"].strip() or m.get("tool_calls") for m in messages):
        return "empty"
    if not any(m["role"] == "user" and m["content"].strip() for m in messages):
        return "no_user_turn"
    prev = None
    for m in messages:
        role = m["role"]
        if role == "system":
            if prev not in (None, "system"):
                return "invalid_role_order"
        elif (
            (prev in (None, "system") and role != "user")
            or (role == "tool" and prev not in ("assistant", "tool"))
            or role == prev == "assistant"
        ):
            return "invalid_role_order"
        prev = role
    return None


@cache
def char_script(ch: str) -> str | None:
    """The script of a letter (one of SCRIPTS, or "other"); None for anything that is not a letter."""
    if not ch.isalpha():
        return None
    if ch < "\u0250":  # ASCII, Latin-1, Latin Extended-A/B: the common case without a name lookup
        return "latin"
    return _SCRIPT_OF_NAME.get(unicodedata.name(ch, "").split(" ", 1)[0], "other")


def dominant_script(text: str) -> str | None:
    """The script most of the first SCRIPT_SAMPLE_LETTERS letters are written in; None without letters.

    A script is not a language: English, French and Vietnamese are all "latin"; Chinese is "han",
    while Japanese comes out "kana" or, in kanji-heavy text, "han"; code and pure math count as
    "latin" or have no letters (such rows always pass).
    """
    counts, seen = Counter(), 0
    for ch in text:
        script = char_script(ch)
        if script is not None:
            counts[script] += 1
            seen += 1
            if seen >= SCRIPT_SAMPLE_LETTERS:
                break
    return counts.most_common(1)[0][0] if counts else None


def content_hash(messages: list[dict], tools: list | None) -> str:
    """16 hex of the sha256 of the canonical JSON of messages+tools: the id of id-less rows and the dedup key."""
    canonical = json.dumps(
        {"messages": messages, "tools": tools},
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return text_sha256(canonical)[:16]


def prompt_tokens_est(messages: list[dict], tools: list | None) -> int:
    """Rough tokens (4 chars each, rounded up) before the first assistant turn, tool schemas included."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    chars = sum(len(m["content"]) for m in messages[:first]) + (
        len(json.dumps(tools)) if tools else 0
    )
    return math.ceil(chars / 4)


def to_record(row: dict, fmt: str, source: str, parse_markup: bool = False) -> dict:
    """One raw row in format `fmt` (not "auto") → a record; raises Dropped(reason)."""
    if not any(key in row for key in FIELDS[fmt]):
        raise Dropped("missing_field")
    messages = CONVERTERS[fmt](row)
    tools = parse_tools(row.get("tools"))
    if parse_markup:
        messages, tools = parse_inline_markup(messages, tools)
    if problem := order_problem(messages):
        raise Dropped(problem)
    if messages[-1]["role"] != "assistant":
        messages.append(dict(ASSISTANT_TO_WRITE))  # the reply to regenerate
    own_id = next((row[k] for k in ID_KEYS if row.get(k) not in (None, "")), None)
    record = {
        "id": str(own_id) if own_id is not None else content_hash(messages, tools),
        "source": source,
        "messages": messages,
        "tools": tools,
        "prompt_tokens_est": prompt_tokens_est(messages, tools),
    }
    if row.get("decode") == DECODE_HISTORY:
        record["decode"] = DECODE_HISTORY
    # The row's own `source` column (open-perfectblend, Mixture-of-Thoughts: the upstream set it came
    # from) is kept beside the dataset name; reports break results down by it.
    detail = row.get("source")
    if isinstance(detail, (str, int)) and not isinstance(detail, bool) and str(detail).strip():
        record["source_detail"] = str(detail)
    return record


# ---- a whole dataset -------------------------------------------------------------------------


class Malformed(NamedTuple):
    """A source row that is not a JSON object: where it is ("line 7") and what is wrong with it."""

    where: str
    error: str


MALFORMED_NAMED = 5  # malformed rows named in the report


@dataclass
class PrepareStats:
    """What one dataset's rows became: the per-reason report of `prepare`."""

    rows_read: int = 0
    rows_kept: int = 0
    dropped: Counter = field(default_factory=Counter)
    formats: Counter = field(default_factory=Counter)
    malformed: list[str] = field(default_factory=list)  # the first few, where and why

    def add_malformed(self, row) -> None:
        if len(self.malformed) < MALFORMED_NAMED:
            where, error = (
                row
                if isinstance(row, Malformed)
                else (f"row {self.rows_read}", "not a JSON object")
            )
            self.malformed.append(f"{where}: {error}")

    def as_dict(self) -> dict:
        out = {
            "rows_read": self.rows_read,
            "rows_kept": self.rows_kept,
            "dropped": dict(sorted(self.dropped.items(), key=lambda kv: (-kv[1], kv[0]))),
            "formats": dict(self.formats),
        }
        if self.malformed:
            n = self.dropped["malformed_json"]
            out["malformed_share"] = round(n / self.rows_read, 6) if self.rows_read else 0.0
            out["malformed_first"] = list(self.malformed)
        return out


@dataclass(frozen=True)
class RecordRules:
    """How a dataset's rows become records and which are kept: the keys of datasets.<name> that
    iter_records reads (format, fields, parse_markup, max_prompt_tokens, scripts)."""

    format: str = "auto"
    fields: dict[str, str] | None = None  # canonical field -> source column
    parse_markup: bool = False
    max_prompt_tokens: int | None = None
    scripts: Iterable[str] | None = None


def iter_records(
    rows: Iterable[dict | None], source: str, stats: PrepareStats, rules: RecordRules
) -> Iterator[dict]:
    """Records of one dataset, one at a time, counting every row into `stats`.

    Filters, first failing one counted: conversion (malformed_json, missing_field, empty, no_user_turn,
    invalid_role_order, invalid_tools_json, …), too_long (prompt estimate above max_prompt_tokens),
    unwanted_script (user turns written in none of `scripts`), duplicate (same messages+tools as an
    earlier row), duplicate_id (an earlier row's source id with other content). Raises ValueError
    once the rows are exhausted if none was kept, naming the dataset and its top reasons.
    """
    fmt, fields, parse_markup = rules.format, rules.fields, rules.parse_markup
    max_prompt_tokens, scripts = rules.max_prompt_tokens, rules.scripts
    if fmt != "auto" and fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; supported: auto, {', '.join(FORMATS)}")
    wanted = frozenset(scripts) if scripts else None
    if wanted and (unknown := sorted(wanted - set(SCRIPTS))):
        raise ValueError(f"unknown scripts {unknown}; supported: {', '.join(SCRIPTS)}")
    seen_content, seen_ids = set(), set()  # 64-bit ints, not strings: ~3x less memory per row
    for row in rows:
        stats.rows_read += 1
        try:
            if not isinstance(row, dict):
                stats.add_malformed(row)
                raise Dropped("malformed_json")
            if fields:
                row = remap_fields(row, fields)
            row_fmt = detect_format(row) if fmt == "auto" else fmt
            record = to_record(row, row_fmt, source, parse_markup)
            if max_prompt_tokens is not None and record["prompt_tokens_est"] > max_prompt_tokens:
                raise Dropped("too_long")
            if wanted:
                user_text = "\n".join(
                    m["content"] for m in record["messages"] if m["role"] == "user"
                )
                if dominant_script(user_text) not in wanted | {None}:
                    raise Dropped("unwanted_script")
            digest = int(content_hash(record["messages"], record["tools"]), 16)
            id_digest = int(text_sha256(record["id"])[:16], 16)
            if digest in seen_content:
                raise Dropped("duplicate")
            if id_digest in seen_ids:
                raise Dropped("duplicate_id")  # same source id, different content
        except Dropped as drop:
            stats.dropped[drop.reason] += 1
            continue
        seen_content.add(digest)
        seen_ids.add(id_digest)
        stats.formats[row_fmt] += 1
        stats.rows_kept += 1
        yield record
    if not stats.rows_kept:
        top = ", ".join(
            f"{reason} ({n})" for reason, n in list(stats.as_dict()["dropped"].items())[:3]
        )
        raise ValueError(
            f"dataset {source!r}: no valid rows out of {stats.rows_read} read; "
            f"top drop reasons: {top or 'the source has no rows'}"
        )


def prepare_records(
    rows: Iterable[dict | None], source: str, fmt: str = "auto", **filters
) -> tuple[list[dict], dict]:
    """All records of one dataset plus its stats dict; iter_records collected (small inputs, tests)."""
    stats = PrepareStats()
    records = list(iter_records(rows, source, stats, RecordRules(fmt, **filters)))
    return records, stats.as_dict()
