"""Regenerating every assistant turn with the target through OpenAI-compatible servers.

Each conversation is replayed turn by turn: system, user and tool messages are kept; every
assistant turn is replaced by the target's own answer to the conversation so far (its previous
answers included). Reasoning is kept as the server returns it (`reasoning_content`, or inline
`<think>` in the content), and so are tool calls (structured `tool_calls`, or inline
`<tool_call>` JSON). The original tool results are spliced back only when the regenerated turn
calls the same tools in the same order as the original turn; otherwise the conversation ends at
the regenerated call. A turn cut by max_tokens, or one whose prompt no longer fits the
partition's max_context, also ends the conversation, which always ends on an assistant turn.

Requests go to the least busy endpoint (fewest requests outstanding; one that just failed rests
for its backoff) and are retried with exponential backoff and jitter after HTTP 429/5xx/408,
timeouts and lost connections; other HTTP errors (400, 404, 422...) fail the conversation at once.

Output is append-only JSONL keyed by prompt id, one flushed line per finished conversation, so a
SIGKILL loses at most the conversations in flight. Each line carries a `regeneration` record
with the fingerprint of what shaped it (target, chat template, sampling) and the hash of its
prompt: a rerun keeps the lines that still match and sends only the missing prompts.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from draftline.io import atomic_path

TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
RETRY_STATUS = {408, 429}  # and every 5xx


def _sha256(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def prompt_sha256(row: dict) -> str:
    """Hash of what the target is asked (messages and tools): a changed prompt is regenerated."""
    return _sha256({"messages": row["messages"], "tools": row.get("tools")})[:16]


def fingerprint(settings: dict) -> str:
    """Hash of everything that shapes the answers (target, chat template, sampling)."""
    return _sha256(settings)[:16]


def chat_prompt_ids(tokenizer, messages: list[dict], tools, chat_template_kwargs: dict) -> list[int]:
    """Token ids of the prompt the server builds: the chat template with the generation prompt,
    encoded without extra special tokens (as vLLM, SGLang and transformers serve do)."""
    text = tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False, add_generation_prompt=True,
                                         **chat_template_kwargs)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


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
class RetryPolicy:
    max_retries: int
    backoff_s: float
    backoff_max_s: float
    timeout_s: float  # per request

    def wait(self, attempt: int, retry_after: float | None = None) -> float:
        cap = min(self.backoff_max_s, self.backoff_s * 2**attempt)
        delay = cap * random.uniform(0.5, 1.0)
        return min(self.backoff_max_s, max(delay, retry_after or 0.0))


# ---- endpoints -------------------------------------------------------------------------------


class Endpoint:
    def __init__(self, url: str, clients: list):
        self.url, self.clients = url, clients
        self._next_client = 0
        self.outstanding = 0
        self.requests = 0
        self.errors = 0
        self.resting_until = 0.0  # after a failure, others are preferred until then


class EndpointPool:
    """Picks the endpoint with the fewest requests outstanding among those not resting."""

    def __init__(self, endpoints: list[Endpoint]):
        if not endpoints:
            raise ValueError("no endpoints")
        self.endpoints = endpoints
        self._turn = 0

    def acquire(self) -> Endpoint:
        now = time.monotonic()
        ready = [e for e in self.endpoints if e.resting_until <= now] or self.endpoints
        self._turn += 1
        n = len(ready)  # ties go round-robin
        best = min(range(n), key=lambda k: (ready[k].outstanding, (k - self._turn) % n))
        endpoint = ready[best]
        endpoint.outstanding += 1
        endpoint.requests += 1
        return endpoint

    @staticmethod
    def release(endpoint: Endpoint, failed_for_s: float = 0.0) -> None:
        endpoint.outstanding -= 1
        if failed_for_s:
            endpoint.errors += 1
            endpoint.resting_until = time.monotonic() + failed_for_s


# Requests in flight per `openai` client. Its HTTP pool scans every connection for every request,
# so one client at 256 in flight spent more CPU there than on anything else (0.87 of the ideal
# request rate in `make bench`); a client per 32 requests in flight keeps that scan short.
IN_FLIGHT_PER_CLIENT = 32


def open_pool(urls: list[str], api_key: str | None, max_in_flight: int = IN_FLIGHT_PER_CLIENT) -> EndpointPool:
    """`openai` async clients per endpoint (enough for max_in_flight); retries are ours (`complete`)."""
    from openai import AsyncOpenAI

    n = max(1, math.ceil(max_in_flight / IN_FLIGHT_PER_CLIENT))
    return EndpointPool([Endpoint(url, [AsyncOpenAI(base_url=f"{url}/v1", api_key=api_key or "unused", max_retries=0)
                                        for _ in range(n)]) for url in urls])


def next_client(endpoint: Endpoint):
    endpoint._next_client = (endpoint._next_client + 1) % len(endpoint.clients)
    return endpoint.clients[endpoint._next_client]


async def close_pool(pool: EndpointPool) -> None:
    for endpoint in pool.endpoints:
        for client in endpoint.clients:
            await client.close()


class ConversationFailed(Exception):
    def __init__(self, reason: str, detail: str, attempts: int = 1):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail, self.attempts = reason, detail, attempts


def _retry_after(response) -> float | None:
    try:
        return float(response.headers.get("retry-after"))
    except (TypeError, ValueError, AttributeError):
        return None


async def complete(pool: EndpointPool, request: dict, policy: RetryPolicy, retries: Counter):
    """One chat completion, retried on 429/5xx/408, timeouts and lost connections."""
    import openai

    for attempt in range(policy.max_retries + 1):
        endpoint = pool.acquire()
        retry_after = None
        try:
            resp = await next_client(endpoint).chat.completions.create(**request, timeout=policy.timeout_s)
            if not resp.choices:
                reason, detail = "empty_response", "no choices in the answer"
            else:
                pool.release(endpoint)
                return resp
        except openai.APITimeoutError as err:
            reason, detail = "timeout", str(err)
        except openai.APIConnectionError as err:
            reason, detail = "connection", f"{err}: {err.__cause__!r}"
        except openai.APIStatusError as err:
            reason, detail = f"http_{err.status_code}", str(err)[:500]
            if err.status_code not in RETRY_STATUS and err.status_code < 500:
                pool.release(endpoint)
                raise ConversationFailed(reason, detail, attempt + 1) from None
            retry_after = _retry_after(err.response)
        except openai.APIError as err:  # an answer the client cannot parse
            reason, detail = "bad_response", str(err)[:500]
        except BaseException:
            pool.release(endpoint)
            raise
        delay = policy.wait(attempt, retry_after)
        pool.release(endpoint, failed_for_s=delay)
        if attempt == policy.max_retries:
            break
        retries[reason] += 1
        await asyncio.sleep(delay)
    raise ConversationFailed(reason, detail, policy.max_retries + 1)


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


def reply_message(choice) -> dict:
    """The server's answer as a chat message, keeping reasoning and tool calls it returned."""
    msg = choice.message
    extra = msg.model_extra or {}
    out = {"role": "assistant", "content": msg.content or ""}
    # vLLM returns `reasoning` (older: `reasoning_content`), SGLang and transformers `reasoning_content`
    reasoning = extra.get("reasoning_content") or extra.get("reasoning")
    if reasoning:
        out["reasoning_content"] = reasoning
    if msg.tool_calls:
        out["tool_calls"] = [
            {"id": tc.id, "type": "function", "function": {"name": tc.function.name, "arguments": tc.function.arguments}}
            for tc in msg.tool_calls
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


async def regenerate_conversation(pool: EndpointPool, model: str, row: dict, sampling: Sampling, policy: RetryPolicy,
                                  max_context: int | None, count_ids, retries: Counter) -> tuple[list[dict], dict]:
    """(regenerated messages, stats). Raises ConversationFailed when a request fails for good."""
    original, tools = row["messages"], row.get("tools")
    temperature, seed = sampling.for_conversation(row["id"])
    messages: list[dict] = []
    stats = {"temperature": temperature, "seed": seed, "finish_reasons": [], "stopped": "end",
             "prompt_tokens": 0, "completion_tokens": 0}
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
                used = len(count_ids(messages, tools))
            except Exception as err:  # noqa: BLE001 - a template that rejects this conversation
                raise ConversationFailed("template_error", f"{type(err).__name__}: {err}") from None
            if used >= max_context:
                if not stats["finish_reasons"]:
                    raise ConversationFailed("prompt_too_long", f"{used} prompt tokens >= max_context {max_context}")
                stats["stopped"] = "context_full"
                break
            max_tokens = min(max_tokens, max_context - used)
        request = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": temperature,
                   "top_p": sampling.top_p}
        if seed is not None:
            request["seed"] = seed
        if tools:
            request["tools"] = tools
        if sampling.chat_template_kwargs:
            request["extra_body"] = {"chat_template_kwargs": sampling.chat_template_kwargs}
        resp = await complete(pool, request, policy, retries)
        choice = resp.choices[0]
        reply = reply_message(choice)
        messages = messages + [reply]  # a new list: the request above keeps its own
        stats["finish_reasons"].append(choice.finish_reason or "unknown")
        if resp.usage:
            stats["prompt_tokens"] += resp.usage.prompt_tokens
            stats["completion_tokens"] += resp.usage.completion_tokens
        if choice.finish_reason == "length":
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
        rate = (lambda n: round(n / seconds, 2) if seconds > 0 else None)
        return {"sent": self.sent, "ok": self.ok, "failed": self.failed, "requests": self.requests,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "seconds": round(seconds, 2), "conversations_per_s": rate(self.ok), "requests_per_s": rate(self.requests),
                "completion_tokens_per_s": rate(self.completion_tokens)}


@dataclass
class Tally:
    ok: int = 0
    failed: int = 0
    truncated: int = 0  # conversations with a turn finished by max_tokens
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reasons: Counter = field(default_factory=Counter)
    stopped: Counter = field(default_factory=Counter)
    failure_reasons: Counter = field(default_factory=Counter)
    retries: Counter = field(default_factory=Counter)
    partitions: dict[str, PartitionTally] = field(default_factory=dict)
    aborted: bool = False

    @property
    def done(self) -> int:
        return self.ok + self.failed


async def regenerate_all(pool: EndpointPool, model: str, rows: list[dict], sampling: Sampling, policy: RetryPolicy,
                         partitions: dict[str, tuple[int, int | None]], out_path: Path, failures_path: Path,
                         tags: dict, count_ids=None, max_failures: int | None = None, on_done=None) -> Tally:
    """Regenerate `rows`; `partitions` maps "short"/"long" to (concurrency, max_context).

    Each finished conversation is one flushed line of out_path (the row with its regenerated
    messages and a `regeneration` record: `tags` plus its own stats); each failed one is one line
    of failures_path with its reason. Past `max_failures` failures the run stops early: the stage
    would fail anyway, and what is done stays done.
    """
    tally = Tally(partitions={name: PartitionTally() for name in partitions})
    queues: dict[str, list[dict]] = {name: [] for name in partitions}
    for row in rows:
        name = row.get("partition", "short")
        if name not in queues:
            raise ValueError(f"prompt {row['id']}: unknown partition {name!r} (expected one of {sorted(queues)})")
        queues[name].append(row)
    stop = asyncio.Event()

    with open(out_path, "a") as out, open(failures_path, "w") as failures:
        async def one(name: str, row: dict) -> None:
            part = tally.partitions[name]
            part.sent += 1
            part.first_start = part.first_start or time.monotonic()
            max_context = partitions[name][1]
            try:
                messages, stats = await regenerate_conversation(pool, model, row, sampling, policy, max_context,
                                                                count_ids, tally.retries)
            except ConversationFailed as err:
                tally.failed += 1
                part.failed += 1
                tally.failure_reasons[err.reason] += 1
                failures.write(json.dumps({"id": row["id"], "partition": name, "reason": err.reason,
                                           "attempts": err.attempts, "detail": err.detail[:500]}) + "\n")
                failures.flush()
                if max_failures is not None and tally.failed > max_failures:
                    stop.set()
            else:
                record = {k: v for k, v in row.items() if k != "messages"}
                record["messages"] = messages
                record["regeneration"] = {**tags, "prompt_sha256": prompt_sha256(row), **stats}
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
                out.flush()
                turns = len(stats["finish_reasons"])
                tally.ok += 1
                part.ok += 1
                tally.requests += turns
                part.requests += turns
                tally.truncated += "length" in stats["finish_reasons"]
                tally.finish_reasons.update(stats["finish_reasons"])
                tally.stopped[stats["stopped"]] += 1
                for t in (tally, part):
                    t.prompt_tokens += stats["prompt_tokens"]
                    t.completion_tokens += stats["completion_tokens"]
            part.last_end = time.monotonic()
            if on_done:
                on_done(tally)

        async def worker(name: str, queue) -> None:
            for row in queue:  # one shared iterator per partition: each row goes to one worker
                if stop.is_set():
                    return
                await one(name, row)

        workers = []
        for name, (concurrency, _) in partitions.items():
            queue = iter(queues[name])
            workers += [asyncio.create_task(worker(name, queue)) for _ in range(min(concurrency, len(queues[name])))]
        try:
            await asyncio.gather(*workers)
        finally:
            for w in workers:
                w.cancel()
    tally.aborted = stop.is_set()
    return tally


# ---- resume ----------------------------------------------------------------------------------


def load_finished(path: Path, prompts: dict[str, dict], tags_fingerprint: str) -> tuple[set[str], dict]:
    """Ids of the lines of previous runs that still hold: well-formed, first of their id, made
    with the same fingerprint and, for ids still prompted, from the same prompt. Lines of ids no
    longer prompted stay (shrinking `samples` and growing it back loses nothing). When anything was
    dropped or the last line was cut by a kill, the file is rewritten atomically without it; the
    file is streamed twice rather than held in memory (it reaches gigabytes)."""
    counts = Counter()
    keep: list[bool] = []
    done: set[str] = set()
    cut_last_line = False
    if path.exists():
        with open(path, "rb") as f:
            for line in f:
                cut_last_line = not line.endswith(b"\n")
                if not line.strip():
                    keep.append(False)
                    continue
                try:
                    row = json.loads(line)
                    pid = row["id"]
                    regen = row.get("regeneration")  # absent: written before records had one
                    ok_row = isinstance(pid, str)
                except (ValueError, KeyError, TypeError, AttributeError):
                    ok_row = False
                if not ok_row:
                    reason = "bad_lines"
                elif pid in done:
                    reason = "duplicates"
                elif not isinstance(regen, dict) or regen.get("fingerprint") != tags_fingerprint:
                    reason = "stale_settings"
                elif pid in prompts and regen.get("prompt_sha256") != prompt_sha256(prompts[pid]):
                    reason = "stale_prompt"
                else:
                    reason = None
                    done.add(pid)
                    counts["not_in_prompts"] += pid not in prompts
                if reason:
                    counts[reason] += 1
                keep.append(reason is None)
    dropped = sum(v for k, v in counts.items() if k != "not_in_prompts")
    if dropped or cut_last_line:
        with atomic_path(path) as tmp, open(path, "rb") as src, open(tmp, "wb") as dst:
            for line, kept in zip(src, keep):
                if kept:
                    dst.write(line if line.endswith(b"\n") else line + b"\n")
    return done, {k: counts[k] for k in ("bad_lines", "duplicates", "stale_settings", "stale_prompt", "not_in_prompts")}
