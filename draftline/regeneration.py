"""Regenerating every assistant turn with the target through an OpenAI-compatible server.

Each conversation is replayed turn by turn: system, user and tool messages are kept; every
assistant turn is replaced by the target's own answer to the conversation so far (its previous
answers included). A tool result is spliced back only when the regenerated turn calls the same
tool as the original did; otherwise the conversation ends at the regenerated turn.

Output is append-only JSONL keyed by prompt id, one flushed line per finished conversation, so a
kill loses at most the requests in flight and a rerun sends only the missing ids.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


@dataclass
class Sampling:
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None


@dataclass
class Tally:
    ok: int = 0
    failed: int = 0
    truncated: int = 0  # finished by max_tokens rather than end of turn
    completion_tokens: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


def called_tools(message: dict) -> list[str]:
    """Names of the tools an assistant message calls, structured or inline <tool_call> JSON."""
    names = [tc["function"]["name"] for tc in message.get("tool_calls") or []]
    for blob in TOOL_CALL_RE.findall(message.get("content") or ""):
        try:
            names.append(json.loads(blob)["name"])
        except (json.JSONDecodeError, KeyError, TypeError):
            names.append("<unparsable>")
    return names


def reply_message(choice) -> dict:
    """The server's answer as a chat message, keeping reasoning and tool calls it returned."""
    msg = choice.message
    out = {"role": "assistant", "content": msg.content or ""}
    reasoning = getattr(msg, "reasoning_content", None) or (msg.model_extra or {}).get("reasoning_content")
    if reasoning:
        out["reasoning_content"] = reasoning
    if msg.tool_calls:
        out["tool_calls"] = [
            {"id": tc.id, "type": "function", "function": {"name": tc.function.name, "arguments": tc.function.arguments}}
            for tc in msg.tool_calls
        ]
    return out


async def regenerate_conversation(client, model: str, row: dict, sampling: Sampling) -> tuple[dict, dict]:
    """(regenerated row, stats). Raises on a request that failed after the client's retries."""
    original = row["messages"]
    messages: list[dict] = []
    turns = truncated = tokens = 0
    for i, m in enumerate(original):
        if m["role"] != "assistant":
            messages.append(m)
            continue
        kwargs = {"model": model, "messages": messages, "max_tokens": sampling.max_tokens, "temperature": sampling.temperature, "top_p": sampling.top_p}
        if sampling.seed is not None:
            kwargs["seed"] = sampling.seed
        if row.get("tools"):
            kwargs["tools"] = row["tools"]
        resp = await client.chat.completions.create(**kwargs)
        choice = resp.choices[0]
        reply = reply_message(choice)
        messages.append(reply)
        turns += 1
        truncated += choice.finish_reason == "length"
        tokens += resp.usage.completion_tokens if resp.usage else 0
        following = original[i + 1] if i + 1 < len(original) else None
        if following is not None and following["role"] == "tool" and called_tools(reply) != called_tools(m):
            break  # the model called another tool (or none): the original result does not answer it
        if choice.finish_reason == "length":
            break
    out = {k: v for k, v in row.items() if k != "messages"}
    out["messages"] = messages
    return out, {"turns": turns, "truncated": truncated, "completion_tokens": tokens}


async def regenerate_all(client, model: str, rows: list[dict], sampling: Sampling, concurrency: dict[str, int],
                         out_path: Path, failures_path: Path, on_done=None) -> Tally:
    """Run every row; each partition ("short"/"long") has its own concurrency limit."""
    limits = {name: asyncio.Semaphore(n) for name, n in concurrency.items()}
    tally = Tally()
    with open(out_path, "a") as out, open(failures_path, "a") as failures:
        async def one(row):
            async with limits[row.get("partition", "short")]:
                try:
                    result, stats = await regenerate_conversation(client, model, row, sampling)
                except Exception as err:  # noqa: BLE001 - every failure is recorded with its reason
                    reason = type(err).__name__
                    tally.failed += 1
                    tally.reasons[reason] = tally.reasons.get(reason, 0) + 1
                    failures.write(json.dumps({"id": row["id"], "reason": reason, "detail": str(err)[:500], "time": time.time()}) + "\n")
                    failures.flush()
                else:
                    out.write(json.dumps(result, ensure_ascii=False) + "\n")
                    out.flush()
                    tally.ok += 1
                    tally.truncated += stats["truncated"] > 0
                    tally.completion_tokens += stats["completion_tokens"]
                if on_done:
                    on_done(tally)

        await asyncio.gather(*(one(r) for r in rows))
    return tally
