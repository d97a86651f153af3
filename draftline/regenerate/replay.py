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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from draftline.regenerate.client import ConversationFailed, EndpointPool, RetryPolicy, complete
from draftline.regenerate.index import IndexWriter
from draftline.regenerate.settings import prompt_sha256
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


@dataclass(frozen=True)
class ReplayJob:
    """What every conversation of one run is sent and recorded with, built once by the stage."""

    model: str  # the target's name in requests
    sampling: Sampling
    policy: RetryPolicy  # timeouts and retries of every request
    partitions: dict[str, tuple[int, int | None]]  # "short"/"long" -> (concurrency, max_context)
    tags: dict  # on every line's `regeneration` record (settings, fingerprint, engine, run)
    # count_ids(messages, tools) -> the prompt's token ids, where a partition has a max_context
    count_ids: Callable | None = None
    max_failures: int | None = None  # past this many failures the run stops early
    extra_body: dict | None = None  # into every request (see regenerate_conversation)
    prompt_digests: dict[str, str] | None = None  # id -> prompt_line of its raw prompt line


@dataclass(frozen=True)
class ProgressHooks:
    """How a run shows its progress: on_done(tally) after every finished conversation,
    on_tick(tally) every tick_s whatever happens."""

    on_done: Callable | None = None
    on_tick: Callable | None = None
    tick_s: float = 30.0


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


def conversation_stats(temperature: float, seed: int | None) -> dict:
    """A conversation's stats before its first answer (its `regeneration` record, in this order);
    add_answer counts each answer in them."""
    return {
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


async def answer_budget(
    max_tokens: int, max_context: int, count_tokens, messages: list[dict], tools, stats: dict
) -> int | None:
    """max_tokens of the next answer, cut to what max_context leaves of it; None when the prompt
    fills max_context after an answer (stats stopped "context_full"), ConversationFailed when it
    does before the first, or when the chat template rejects the conversation."""
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
        return None
    return min(max_tokens, max_context - used)


def chat_request(
    job: ReplayJob,
    messages: list[dict],
    tools,
    max_tokens: int,
    temperature: float,
    seed: int | None,
) -> dict:
    """The request body of the next answer to `messages` (regenerate_conversation's docstring
    says where job.extra_body goes)."""
    sampling = job.sampling
    request = {
        "model": job.model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": sampling.top_p,
    }
    if seed is not None:
        request["seed"] = seed
    if sampling.chat_template_kwargs:
        request["chat_template_kwargs"] = sampling.chat_template_kwargs
    extras = dict(job.extra_body or {})
    with_tools = extras.pop("with_tools", {})  # only beside tools (engine_request_fields)
    request.update(extras)
    if tools:
        request.update(tools=tools, **with_tools)
    return request


def add_answer(stats: dict, choice: dict, usage: dict) -> str:
    """Counts one answer (its choice and usage) in the conversation's stats; its finish_reason."""
    finish_reason = choice.get("finish_reason") or "unknown"
    stats["finish_reasons"].append(finish_reason)
    for key in ("prompt_tokens", "completion_tokens"):
        stats[key] += usage.get(key) or 0
    stats["turn_completion_tokens"].append(usage.get("completion_tokens"))
    stats["completion_token_ids"].append(choice.get("token_ids"))
    return finish_reason


async def regenerate_conversation(
    pool: EndpointPool,
    job: ReplayJob,
    row: dict,
    max_context: int | None,
    count_tokens,
    tally: Tally,
) -> tuple[list[dict], dict]:
    """(regenerated messages, stats). Raises ConversationFailed when a request fails for good.
    With max_context, `await count_tokens(messages, tools)` is the prompt's token count before
    each turn (the chat template rendered and tokenized: regenerate_all does it off the loop).
    job.extra_body goes into every request as it is (e.g. vLLM's stream_options,
    return_token_ids), but for its `with_tools` fields, which go only into requests with tools.
    The ids and usage of each answer are kept in stats, not on its message: the message goes back
    to the server in the next turn's request. `tally` counts the retries, and the tokens as they
    stream in (the live tokens/s)."""
    original, tools = row["messages"], row.get("tools")
    temperature, seed = job.sampling.for_conversation(row["id"])

    def on_token(n: int) -> None:
        tally.streamed_tokens += n

    messages: list[dict] = []
    stats = conversation_stats(temperature, seed)
    i = 0
    while i < len(original):
        turn = original[i]
        if turn["role"] != "assistant":
            messages.append(turn)
            i += 1
            continue
        max_tokens = job.sampling.max_tokens
        if max_context:
            max_tokens = await answer_budget(
                max_tokens, max_context, count_tokens, messages, tools, stats
            )
            if max_tokens is None:
                break
        request = chat_request(job, messages, tools, max_tokens, temperature, seed)
        choice, usage = await complete(pool, request, job.policy, tally.retries, on_token)
        reply = reply_message(choice)
        messages = messages + [reply]  # a new list: the request above keeps its own
        if add_answer(stats, choice, usage) == "length":
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
    thousand; these give a few passes in a thousand requests. (No
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
    job: ReplayJob,
    rows: list[dict],
    out_path: Path,
    failures_path: Path,
    hooks: ProgressHooks = ProgressHooks(),
) -> Tally:
    """Regenerate `rows`; job.partitions maps "short"/"long" to (concurrency, max_context).

    Each finished conversation is one flushed line of out_path (the row with its regenerated
    messages and a `regeneration` record: job.tags plus its own stats), then its entry in the index
    beside it (draftline/regenerate/index.py); each failed one is one line of failures_path with
    its reason. Past job.max_failures failures the run stops early: the stage
    would fail anyway, so the conversations in flight are cancelled (their streams closed, which
    stops the server's work on them) and what is done stays done.

    A partition runs at most `concurrency` conversations, and no more than the pool's slots: a
    conversation beyond them would only wait. hooks.on_done(tally) follows every finished
    conversation; hooks.on_tick(tally) comes every hooks.tick_s whatever happens (tally.in_flight:
    requests at the servers).

    job.count_ids(messages, tools) -> the prompt's token ids (the chat template rendered and
    tokenized; needed where a partition has a max_context) runs in one thread beside the event
    loop: at 4k tokens it takes milliseconds a turn, during which the loop would send and read
    nothing. The fast tokenizers encode with the GIL released, so the loop goes on meanwhile; one
    thread, since a tokenizer called from two at once can fail ("Already borrowed").
    job.prompt_digests: id -> the prompt_line of its raw prompt line, for the index entries.
    """
    partitions = job.partitions
    tally = Tally(partitions={name: PartitionTally() for name in partitions})
    queues = partition_queues(rows, partitions)
    counting = (
        ThreadPoolExecutor(1, thread_name_prefix="count-ids")
        if job.count_ids and any(max_context for _, max_context in partitions.values())
        else None
    )
    with (
        long_lived_heap(),
        open(out_path, "ab") as out,
        open(failures_path, "w") as failures,
    ):
        runner = ConversationRunner(
            pool=pool,
            job=job,
            tally=tally,
            counting=counting,
            out=out,
            failures=failures,
            index=IndexWriter(out_path, out),
            on_done=hooks.on_done,
        )
        await run_partitions(runner, queues, hooks.on_tick, hooks.tick_s)
    tally.in_flight = pool.in_flight
    tally.aborted = runner.stop.is_set()
    return tally


def partition_queues(
    rows: list[dict], partitions: dict[str, tuple[int, int | None]]
) -> dict[str, list[dict]]:
    """The rows of each partition (a row's `partition`, "short" by default), in order;
    ValueError for a partition `partitions` does not have."""
    queues: dict[str, list[dict]] = {name: [] for name in partitions}
    for row in rows:
        name = row.get("partition", "short")
        if name not in queues:
            raise ValueError(
                f"prompt {row['id']}: unknown partition {name!r} (expected one of {sorted(queues)})"
            )
        queues[name].append(row)
    return queues


@dataclass
class ConversationRunner:
    """What regenerate_all's workers share: each conversation sent, then its flushed line (in
    out, or in failures) and its counts; `stop` is set past job.max_failures failures."""

    pool: EndpointPool
    job: ReplayJob
    tally: Tally
    counting: ThreadPoolExecutor | None  # the thread job.count_ids runs in
    out: IO[bytes]
    failures: IO[str]
    index: IndexWriter
    on_done: Callable | None
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def count_tokens(self, messages: list[dict], tools) -> int:
        """The prompt's token count: job.count_ids run in the counting thread, off the loop."""
        loop = asyncio.get_running_loop()
        return len(await loop.run_in_executor(self.counting, self.job.count_ids, messages, tools))

    async def worker(self, name: str, queue) -> None:
        """Regenerates rows of a partition's queue, one at a time, until it is empty or `stop`."""
        for row in queue:  # one shared iterator per partition: each row goes to one worker
            if self.stop.is_set():
                return
            await self.regenerate_one(name, row)

    async def regenerate_one(self, name: str, row: dict) -> None:
        """One conversation of partition `name`, regenerated and recorded; then on_done(tally)."""
        tally = self.tally
        part = tally.partitions[name]
        part.sent += 1
        part.first_start = part.first_start or time.monotonic()
        max_context = self.job.partitions[name][1]
        tally.conversations_in_flight += 1
        try:
            messages, stats = await regenerate_conversation(
                self.pool, self.job, row, max_context, self.count_tokens, tally
            )
        except ConversationFailed as err:
            self.record_failure(name, row, err)
        except asyncio.CancelledError:
            tally.cancelled += 1
            raise
        else:
            self.record_conversation(name, row, messages, stats)
        finally:
            tally.conversations_in_flight -= 1
        part.last_end = time.monotonic()
        tally.in_flight = self.pool.in_flight
        if self.on_done:
            self.on_done(tally)

    def record_failure(self, name: str, row: dict, err: ConversationFailed) -> None:
        """Counts a failed conversation and writes its flushed line of failures; sets `stop` once
        there are more than max_failures."""
        tally, part = self.tally, self.tally.partitions[name]
        tally.failed += 1
        part.failed += 1
        tally.failure_reasons[err.reason] += 1
        self.failures.write(
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
        self.failures.flush()
        max_failures = self.job.max_failures
        if max_failures is not None and tally.failed > max_failures:
            self.stop.set()

    def record_conversation(self, name: str, row: dict, messages: list[dict], stats: dict) -> None:
        """Writes a regenerated conversation's flushed line, then its index entry, and counts it."""
        record = {k: v for k, v in row.items() if k != "messages"}
        record["messages"] = messages
        record["regeneration"] = {**self.job.tags, "prompt_sha256": prompt_sha256(row), **stats}
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        self.out.write(line)
        self.out.flush()  # the conversation is done once its line is out, then its index entry
        self.index.add(line, record, (self.job.prompt_digests or {}).get(row["id"]))
        tally, part = self.tally, self.tally.partitions[name]
        turns = len(stats["finish_reasons"])
        tally.ok += 1
        part.ok += 1
        tally.requests += turns
        part.requests += turns
        tally.truncated += "length" in stats["finish_reasons"]
        tally.turns_with_token_ids += sum(ids is not None for ids in stats["completion_token_ids"])
        tally.finish_reasons.update(stats["finish_reasons"])
        tally.stopped[stats["stopped"]] += 1
        for t in (tally, part):
            t.prompt_tokens += stats["prompt_tokens"]
            t.completion_tokens += stats["completion_tokens"]


async def tick_every(pool: EndpointPool, tally: Tally, on_tick, tick_s: float) -> None:
    """on_tick(tally) every tick_s, with the requests at the servers now, until cancelled."""
    while True:
        await asyncio.sleep(tick_s)
        tally.in_flight = pool.in_flight
        on_tick(tally)


async def run_partitions(
    runner: ConversationRunner, queues: dict[str, list[dict]], on_tick, tick_s: float
) -> None:
    """Each partition's workers (its concurrency, the rows and the pool's slots permitting) and
    the ticker, until the queues are done or `stop`; then what is in flight is cancelled, the
    counting thread let go and the index closed. A worker's exception comes out here."""
    pool, stop = runner.pool, runner.stop
    workers = []
    slots = pool.slots * len(pool.endpoints) if pool.slots else None
    for name, (concurrency, _) in runner.job.partitions.items():
        queue = iter(queues[name])
        n = min(concurrency, len(queues[name]), slots or concurrency)
        workers += [asyncio.create_task(runner.worker(name, queue)) for _ in range(n)]
    background = (
        [asyncio.create_task(tick_every(pool, runner.tally, on_tick, tick_s))] if on_tick else []
    )
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
        if runner.counting:
            runner.counting.shutdown(wait=False, cancel_futures=True)
        runner.index.close()
