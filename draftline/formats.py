"""Loading a dataset source and normalizing its rows into prepared records.

A source is a local .jsonl/.json/.parquet file or a hub dataset id. Every row, whatever its
format (ShareGPT, OpenAI messages, Alpaca, prompt-only), becomes one record::

    {"id": str, "source": str, "tools": list | None, "prompt_tokens_est": int,
     "messages": [{"role": "system|user|assistant|tool", "content": str,
                   "reasoning_content"?: str, "tool_calls"?: [...], "tool_call_id"?: str}]}

or is dropped with a reason (``Dropped``) that the caller counts. Turn-order rules:

- system turns only before every other turn;
- the first other turn is a user turn (so an assistant-first conversation is invalid);
- a tool turn follows an assistant turn or another tool turn;
- two assistant turns in a row are invalid (which one would be regenerated?); two user turns in a
  row are allowed: some datasets split one message and chat templates render them fine.

A conversation ending on a user or tool turn gets an empty assistant turn appended, so every
record ends on an assistant turn and each assistant turn marks one reply for `regenerate` to write
(prompt-only rows get exactly one). ShareGPT's inline ``<think>`` and ``<tool_call>`` stay inline.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

from draftline.io import text_sha256

FORMATS = ("sharegpt", "openai", "alpaca", "prompt")
# Detection by key, first match wins: (key, format).
DETECT_KEYS = (("conversations", "sharegpt"), ("messages", "openai"), ("instruction", "alpaca"),
               ("prompt", "prompt"), ("question", "prompt"))
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "system": "system", "tool": "tool", "observation": "tool",
                  "function_response": "tool", "function_call": "assistant"}
OPENAI_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
                "tool": "tool", "function": "tool"}
FIELDS = {fmt: tuple(key for key, f in DETECT_KEYS if f == fmt) for fmt in FORMATS}  # a row needs one
ID_KEYS = ("id", "conversation_id")  # a source's own row id, first present wins
LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")


class Dropped(Exception):
    """A row that cannot become a record; ``reason`` is the key counted in the report."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# ---- reading ---------------------------------------------------------------------------------


def read_rows(path: str, split: str = "train", name: str | None = None,
              revision: str | None = None) -> Iterator[dict | None]:
    """Raw rows of a local file, else of a hub dataset; None stands for a line that is not a JSON object."""
    local = Path(path)
    if local.suffix.lower() in LOCAL_SUFFIXES:
        if not local.is_file():
            raise FileNotFoundError(f"dataset file not found: {path}")
        return _parquet_rows(local) if local.suffix.lower() == ".parquet" else _json_rows(local)
    from datasets import load_dataset  # slow import; only hub ids and local dataset dirs need it

    return iter(load_dataset(path, name, split=split, revision=revision))


def _json_rows(path: Path) -> Iterator[dict | None]:
    # A .json file is either one JSON array or JSON lines (as the hub's json loader accepts).
    with open(path) as f:
        head = f.read(1 << 12).lstrip()
        f.seek(0)
        if head.startswith("["):
            yield from (row if isinstance(row, dict) else None for row in json.load(f))
            return
        for line in f:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = None
            yield row if isinstance(row, dict) else None


def _parquet_rows(path: Path) -> Iterator[dict]:
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        yield from batch.to_pylist()


# ---- converting one row ----------------------------------------------------------------------


def detect_format(row: dict) -> str:
    for key, fmt in DETECT_KEYS:
        if key in row:
            return fmt
    raise Dropped("unrecognized_format")


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
    return [{"type": "function", **t} if "function" in t else {"type": "function", "function": t} for t in tools] or None


def _tool_calls(calls, turn: int) -> list[dict]:
    """OpenAI tool_calls with arguments as a JSON string; a missing id becomes call_<turn>_<k>."""
    if not isinstance(calls, list):
        raise Dropped("invalid_tool_calls")
    out = []
    for k, call in enumerate(calls):
        fn = call.get("function", call) if isinstance(call, dict) else None  # also bare {"name","arguments"}
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise Dropped("invalid_tool_calls")
        args = fn.get("arguments")
        args = args if isinstance(args, str) else json.dumps(args or {}, ensure_ascii=False)
        out.append({"id": str(call.get("id") or f"call_{turn}_{k}"), "type": "function",
                    "function": {"name": fn["name"], "arguments": args}})
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
        if role == "assistant" and isinstance(m.get("reasoning_content"), str) and m["reasoning_content"]:
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
    return system + [{"role": "user", "content": f"{instruction}\n\n{extra}" if extra else instruction},
                     {"role": "assistant", "content": _text(row.get("output"))}]


def from_prompt(row: dict) -> list[dict]:
    prompt = row["prompt"] if "prompt" in row else row["question"]
    if isinstance(prompt, list):  # some "prompt" columns hold a message list
        return from_openai(prompt)
    system = [{"role": "system", "content": _text(row["system"])}] if row.get("system") else []
    return system + [{"role": "user", "content": _text(prompt)}]


CONVERTERS = {
    "sharegpt": lambda row: from_sharegpt(row["conversations"]),
    "openai": lambda row: from_openai(row["messages"]),
    "alpaca": from_alpaca,
    "prompt": from_prompt,
}


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
        elif ((prev in (None, "system") and role != "user") or (role == "tool" and prev not in ("assistant", "tool"))
              or role == prev == "assistant"):
            return "invalid_role_order"
        prev = role
    return None


def content_hash(messages: list[dict], tools: list | None) -> str:
    """16 hex of the sha256 of the canonical JSON of messages+tools: the id of id-less rows and the dedup key."""
    canonical = json.dumps({"messages": messages, "tools": tools}, sort_keys=True, ensure_ascii=False,
                           separators=(",", ":"))
    return text_sha256(canonical)[:16]


def prompt_tokens_est(messages: list[dict], tools: list | None) -> int:
    """Rough tokens (4 chars each, rounded up) before the first assistant turn, tool schemas included."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    chars = sum(len(m["content"]) for m in messages[:first]) + (len(json.dumps(tools)) if tools else 0)
    return math.ceil(chars / 4)


def to_record(row: dict, fmt: str, source: str) -> dict:
    """One raw row in format `fmt` (not "auto") → a record; raises Dropped(reason)."""
    if not any(key in row for key in FIELDS[fmt]):
        raise Dropped("missing_field")
    messages = CONVERTERS[fmt](row)
    tools = parse_tools(row.get("tools"))
    if problem := order_problem(messages):
        raise Dropped(problem)
    if messages[-1]["role"] != "assistant":
        messages.append({"role": "assistant", "content": ""})  # the reply to regenerate
    own_id = next((row[k] for k in ID_KEYS if row.get(k) not in (None, "")), None)
    return {"id": str(own_id) if own_id is not None else content_hash(messages, tools), "source": source,
            "messages": messages, "tools": tools, "prompt_tokens_est": prompt_tokens_est(messages, tools)}


# ---- a whole dataset -------------------------------------------------------------------------


def prepare_records(rows: Iterable[dict | None], source: str, fmt: str = "auto") -> tuple[list[dict], dict]:
    """Records of one dataset plus stats {rows_read, rows_kept, dropped: {reason: n}, formats: {fmt: n}}.

    Drops exact duplicates (same messages+tools) and repeated source ids within the dataset; raises
    ValueError when nothing survives, naming the dataset and its top reasons.
    """
    if fmt != "auto" and fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; supported: auto, {', '.join(FORMATS)}")
    records, seen_content, seen_ids = [], set(), set()
    dropped, formats, read = Counter(), Counter(), 0
    for row in rows:
        read += 1
        try:
            if not isinstance(row, dict):
                raise Dropped("malformed_json")
            row_fmt = detect_format(row) if fmt == "auto" else fmt
            record = to_record(row, row_fmt, source)
            digest = content_hash(record["messages"], record["tools"])
            if digest in seen_content:
                raise Dropped("duplicate")
            if record["id"] in seen_ids:
                raise Dropped("duplicate_id")  # same source id, different content
        except Dropped as drop:
            dropped[drop.reason] += 1
            continue
        seen_content.add(digest)
        seen_ids.add(record["id"])
        formats[row_fmt] += 1
        records.append(record)
    if not records:
        top = ", ".join(f"{reason} ({n})" for reason, n in dropped.most_common(3)) or "the source has no rows"
        raise ValueError(f"dataset {source!r}: no valid rows out of {read} read; top drop reasons: {top}")
    stats = {"rows_read": read, "rows_kept": len(records), "dropped": dict(dropped.most_common()),
             "formats": dict(formats)}
    return records, stats
