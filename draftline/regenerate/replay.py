"""Regenerating conversations: every assistant turn answered again by the target.

Each conversation is replayed turn by turn: system, user and tool messages are kept; every
assistant turn is replaced by the target's own answer to the conversation so far (its previous
answers included). Reasoning is kept as the server returns it (`reasoning_content`, or inline
`<think>` in the content), and so are tool calls (structured `tool_calls`, or inline
`<tool_call>` JSON). The original tool results are spliced back only when the regenerated turn
calls the same tools in the same order as the original turn; otherwise the conversation ends at
the regenerated call. A turn cut by max_tokens, or one whose prompt no longer fits the
partition's max_context, also ends the conversation, which always ends on an assistant turn.

Requests go through the chat client of draftline/regenerate/client.py (endpoint pool, streaming,
timeouts, retries). Conversations run per short/long partition concurrency; each finished one is
one flushed line of the append-only output (draftline/regenerate/store.py: what a line records
and which lines a rerun keeps), so a SIGKILL loses at most the conversations in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import random
import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from draftline.regenerate.client import ConversationFailed, EndpointPool, RetryPolicy, complete
from draftline.regenerate.index import IndexWriter
from draftline.regenerate.store import prompt_sha256
from draftline.regenerate.stream import REASONING_KEYS

TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


# ---- sampling --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    temperatures: tuple[tuple[float, float], ...] = ()  # (value, weight): drawn per conversation
    chat_template_kwargs: dict = field(default_factory=dict)

    def for_conversation(self, pid: str) -> tuple[float, int | None]:
        """(temperature, request seed) of one conversation: a function of the seed and its id only,
        so a rerun or a grown `samples` gives every conversation the same draw."""
        rng = random.Random(f"{self.seed}:{pid}")
        temperature = self.temperature
        if self.temperatures:
            values, weights = zip(*self.temperatures)
            temperature = rng.choices(values, weights)[0]
        return temperature, (rng.randrange(2**31) if self.seed is not None else None)


# ---- one conversation ------------------------------------------------------------------------


def called_tools(message: dict) -> list[str]:
    """Names of the tools an assistant message calls, structured or inline <tool_call> JSON."""
    names = [tc["function"]["name"] for tc in message.get("tool_calls") or []]
    for blob in TOOL_CALL_RE.findall(message.get("content") or ""):
        try:
            names.append(json.loads(blob)["name"])
        except (json.JSONDecodeError, KeyError, TypeError):
            names.append("<unparsable>")
    return names


def reply_message(choice: dict) -> dict:
    """The server's answer (a choice checked by `answer_choice`) as a chat message, keeping the
    reasoning and tool calls it returned."""
    msg = choice["message"]
    out = {"role": "assistant", "content": msg.get("content") or ""}
    # vLLM returns `reasoning` (older: `reasoning_content`), SGLang and transformers `reasoning_content`;
    # a message with both gives one of them (reasoning_content first), as a streamed delta does
    reasoning = next((msg[k] for k in REASONING_KEYS if msg.get(k)), None)
    if reasoning:
        out["reasoning_content"] = reasoning
    if msg.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": tc.get("id"),
                "type": "function",
                "function": {
                    "name": tc["function"]["name"],
                    "arguments": tc["function"].get("arguments") or "{}",
                },
            }
            for tc in msg["tool_calls"]
        ]
    return out


def relink_tool_results(results: list[dict], reply: dict) -> list[dict]:
    """The original tool results, answering the regenerated calls' ids when those are structured."""
    calls = reply.get("tool_calls") or []
    if len(calls) != len(results):
        return list(results)
    return [{**r, "tool_call_id": c["id"]} if c.get("id") else r for r, c in zip(results, calls)]


def trim_to_assistant(messages: list[dict]) -> list[dict]:
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    return messages[: last + 1]


async def regenerate_conversation(
    pool: EndpointPool,
    model: str,
    row: dict,
    sampling: Sampling,
    policy: RetryPolicy,
    max_context: int | None,
    count_tokens,
    retries: Counter,
    extra_body: dict | None = None,
    on_token=None,
) -> tuple[list[dict], dict]:
    """(regenerated messages, stats). Raises ConversationFailed when a request fails for good.
    With max_context, `await count_tokens(messages, tools)` is the prompt's token count before
    each turn (the chat template rendered and tokenized: regenerate_all does it off the loop).
    extra_body goes into every request as it is (e.g. vLLM's stream_options, return_token_ids),
    but for its `with_tools` fields, which go only into requests with tools.
    The ids and usage of each answer are kept in stats, not on its message: the message goes back
    to the server in the next turn's request."""
    original, tools = row["messages"], row.get("tools")
    temperature, seed = sampling.for_conversation(row["id"])
    messages: list[dict] = []
    stats = {
        "temperature": temperature,
        "seed": seed,
        "finish_reasons": [],
        "stopped": "end",
        "prompt_tokens": 0,
        "completion_tokens": 0,
        # per assistant turn, like finish_reasons: the server's usage.completion_tokens (None when
        # it sent none) and the token ids it generated (None when it returned none; see
        # docs/regeneration.md "Token-exact answers")
        "turn_completion_tokens": [],
        "completion_token_ids": [],
    }
    i = 0
    while i < len(original):
        turn = original[i]
        if turn["role"] != "assistant":
            messages.append(turn)
            i += 1
            continue
        max_tokens = sampling.max_tokens
        if max_context:
            try:
                used = await count_tokens(messages, tools)
            except Exception as err:  # noqa: BLE001 - a template that rejects this conversation
                raise ConversationFailed("template_error", f"{type(err).__name__}: {err}") from None
            if used >= max_context:
                if not stats["finish_reasons"]:
                    raise ConversationFailed(
                        "prompt_too_long", f"{used} prompt tokens >= max_context {max_context}"
                    )
                stats["stopped"] = "context_full"
                break
            max_tokens = min(max_tokens, max_context - used)
        request = {
            "model": model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": sampling.top_p,
        }
        if seed is not None:
            request["seed"] = seed
        if sampling.chat_template_kwargs:
            request["chat_template_kwargs"] = sampling.chat_template_kwargs
        extras = dict(extra_body or {})
        with_tools = extras.pop("with_tools", {})  # only beside tools (engine_request_fields)
        request.update(extras)
        if tools:
            request.update(tools=tools, **with_tools)
        choice, usage = await complete(pool, request, policy, retries, on_token)
        reply = reply_message(choice)
        messages = messages + [reply]  # a new list: the request above keeps its own
        finish_reason = choice.get("finish_reason") or "unknown"
        stats["finish_reasons"].append(finish_reason)
        for key in ("prompt_tokens", "completion_tokens"):
            stats[key] += usage.get(key) or 0
        stats["turn_completion_tokens"].append(usage.get("completion_tokens"))
        stats["completion_token_ids"].append(choice.get("token_ids"))
        if finish_reason == "length":
            stats["stopped"] = "length"
            break
        j = i + 1
        while j < len(original) and original[j]["role"] == "tool":
            j += 1
        results = original[i + 1 : j]
        reply_calls = called_tools(reply)
        if results or reply_calls:
            if not results or reply_calls != called_tools(turn):
                stats["stopped"] = "tool_mismatch"  # the original results do not answer this call
                break
            messages.extend(relink_tool_results(results, reply))
        i = j
    return trim_to_assistant(messages), stats


# ---- the whole run ---------------------------------------------------------------------------


@contextlib.contextmanager
def long_lived_heap():
    """The garbage collector during a run: what exists before it (the target's tokenizer, the
    prompts, every imported module) is set apart from its passes (gc.freeze), and the youngest
    generation is collected every 10,000 allocations, not 700. Each request allocates hundreds of
    short-lived dicts and lists; at 256 in flight the default thresholds gave about one pass per
    16 requests, a full pass over the whole heap (80 ms, the event loop stopped) every few
    thousand, 0.15 ms a request in all; these give a few passes in a thousand requests. (No
    collection before freezing: a full pass is that stop of 80 ms; garbage frozen with the rest
    goes back to the collector after the run.)"""
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(10_000, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


@dataclass
class PartitionTally:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_start: float | None = None
    last_end: float | None = None

    def summary(self) -> dict:
        seconds = (self.last_end - self.first_start) if self.first_start and self.last_end else 0.0

        def rate(n):
            return round(n / seconds, 2) if seconds > 0 else None

        return {
            "sent": self.sent,
            "ok": self.ok,
            "failed": self.failed,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "seconds": round(seconds, 2),
            "conversations_per_s": rate(self.ok),
            "requests_per_s": rate(self.requests),
            "completion_tokens_per_s": rate(self.completion_tokens),
        }


@dataclass
class Tally:
    ok: int = 0
    failed: int = 0
    truncated: int = 0  # conversations with a turn finished by max_tokens
    turns_with_token_ids: int = 0  # answers whose server returned their token ids
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # tokens received so far, finished or not (live tokens/s): chunks with output, corrected by the
    # usage of each finished answer (transformers serve sends several tokens in one chunk)
    streamed_tokens: int = 0
    in_flight: int = 0  # requests at the servers now
    conversations_in_flight: int = 0
    cancelled: int = 0  # conversations in flight when the run stopped early (a rerun sends them)
    finish_reasons: Counter = field(default_factory=Counter)
    stopped: Counter = field(default_factory=Counter)
    failure_reasons: Counter = field(default_factory=Counter)
    retries: Counter = field(default_factory=Counter)
    partitions: dict[str, PartitionTally] = field(default_factory=dict)
    aborted: bool = False

    @property
    def done(self) -> int:
        return self.ok + self.failed


async def regenerate_all(
    pool: EndpointPool,
    model: str,
    rows: list[dict],
    sampling: Sampling,
    policy: RetryPolicy,
    partitions: dict[str, tuple[int, int | None]],
    out_path: Path,
    failures_path: Path,
    tags: dict,
    count_ids=None,
    max_failures: int | None = None,
    on_done=None,
    on_tick=None,
    tick_s: float = 30.0,
    extra_body: dict | None = None,
    prompt_digests: dict[str, str] | None = None,
) -> Tally:
    """Regenerate `rows`; `partitions` maps "short"/"long" to (concurrency, max_context).

    Each finished conversation is one flushed line of out_path (the row with its regenerated
    messages and a `regeneration` record: `tags` plus its own stats), then its entry in the index
    beside it (draftline/regenerate/index.py); each failed one is one line of failures_path with
    its reason. Past `max_failures` failures the run stops early: the stage
    would fail anyway, so the conversations in flight are cancelled (their streams closed, which
    stops the server's work on them) and what is done stays done.

    A partition runs at most `concurrency` conversations, and no more than the pool's slots: a
    conversation beyond them would only wait. on_done(tally) follows every finished conversation;
    on_tick(tally) comes every tick_s whatever happens (tally.in_flight: requests at the servers).

    count_ids(messages, tools) -> the prompt's token ids (the chat template rendered and
    tokenized; needed where a partition has a max_context) runs in one thread beside the event
    loop: at 4k tokens it takes milliseconds a turn, during which the loop would send and read
    nothing. The fast tokenizers encode with the GIL released, so the loop goes on meanwhile; one
    thread, since a tokenizer called from two at once can fail ("Already borrowed").
    prompt_digests: id -> the prompt_line of its raw prompt line, for the index entries.
    """
    tally = Tally(partitions={name: PartitionTally() for name in partitions})
    queues: dict[str, list[dict]] = {name: [] for name in partitions}
    for row in rows:
        name = row.get("partition", "short")
        if name not in queues:
            raise ValueError(
                f"prompt {row['id']}: unknown partition {name!r} (expected one of {sorted(queues)})"
            )
        queues[name].append(row)
    stop = asyncio.Event()

    def on_token(n: int) -> None:
        tally.streamed_tokens += n

    loop = asyncio.get_running_loop()
    counting = (
        ThreadPoolExecutor(1, thread_name_prefix="count-ids")
        if count_ids and any(max_context for _, max_context in partitions.values())
        else None
    )

    async def count_tokens(messages: list[dict], tools) -> int:
        return len(await loop.run_in_executor(counting, count_ids, messages, tools))

    with (
        long_lived_heap(),
        open(out_path, "ab") as out,
        open(failures_path, "w") as failures,
    ):
        index = IndexWriter(out_path, out)

        async def one(name: str, row: dict) -> None:
            part = tally.partitions[name]
            part.sent += 1
            part.first_start = part.first_start or time.monotonic()
            max_context = partitions[name][1]
            tally.conversations_in_flight += 1
            try:
                messages, stats = await regenerate_conversation(
                    pool,
                    model,
                    row,
                    sampling,
                    policy,
                    max_context,
                    count_tokens,
                    tally.retries,
                    extra_body,
                    on_token,
                )
            except ConversationFailed as err:
                tally.failed += 1
                part.failed += 1
                tally.failure_reasons[err.reason] += 1
                failures.write(
                    json.dumps(
                        {
                            "id": row["id"],
                            "partition": name,
                            "reason": err.reason,
                            "attempts": err.attempts,
                            "detail": err.detail[:500],
                        }
                    )
                    + "\n"
                )
                failures.flush()
                if max_failures is not None and tally.failed > max_failures:
                    stop.set()
            except asyncio.CancelledError:
                tally.cancelled += 1
                raise
            else:
                record = {k: v for k, v in row.items() if k != "messages"}
                record["messages"] = messages
                record["regeneration"] = {**tags, "prompt_sha256": prompt_sha256(row), **stats}
                line = (json.dumps(record, ensure_ascii=False) + "\n").encode()
                out.write(line)
                out.flush()  # the conversation is done once its line is out, then its index entry
                index.add(line, record, (prompt_digests or {}).get(row["id"]))
                turns = len(stats["finish_reasons"])
                tally.ok += 1
                part.ok += 1
                tally.requests += turns
                part.requests += turns
                tally.truncated += "length" in stats["finish_reasons"]
                tally.turns_with_token_ids += sum(
                    ids is not None for ids in stats["completion_token_ids"]
                )
                tally.finish_reasons.update(stats["finish_reasons"])
                tally.stopped[stats["stopped"]] += 1
                for t in (tally, part):
                    t.prompt_tokens += stats["prompt_tokens"]
                    t.completion_tokens += stats["completion_tokens"]
            finally:
                tally.conversations_in_flight -= 1
            part.last_end = time.monotonic()
            tally.in_flight = pool.in_flight
            if on_done:
                on_done(tally)

        async def worker(name: str, queue) -> None:
            for row in queue:  # one shared iterator per partition: each row goes to one worker
                if stop.is_set():
                    return
                await one(name, row)

        async def ticker() -> None:
            while True:
                await asyncio.sleep(tick_s)
                tally.in_flight = pool.in_flight
                on_tick(tally)

        workers = []
        slots = pool.slots * len(pool.endpoints) if pool.slots else None
        for name, (concurrency, _) in partitions.items():
            queue = iter(queues[name])
            n = min(concurrency, len(queues[name]), slots or concurrency)
            workers += [asyncio.create_task(worker(name, queue)) for _ in range(n)]
        background = [asyncio.create_task(ticker())] if on_tick else []
        stopping = asyncio.create_task(stop.wait())
        try:
            pending = {*workers, stopping}
            while stopping in pending and pending - {stopping}:
                finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in finished - {stopping}:
                    if task.exception():
                        raise task.exception()  # a bug, not a failed conversation: stop everything
        finally:  # stopped early, or done: the conversations still in flight are given up now
            for task in [*workers, *background, stopping]:
                task.cancel()
            await asyncio.gather(*workers, *background, stopping, return_exceptions=True)
            if counting:
                counting.shutdown(wait=False, cancel_futures=True)
            index.close()
    tally.in_flight = pool.in_flight
    tally.aborted = stop.is_set()
    return tally
