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

Requests in flight are bounded by what the servers run at once (`slots` per endpoint): a request
beyond it would only wait in the server's queue, and its timeout would measure the queue instead of
the server. Answers are streamed, so timeouts measure the server's work: the first generated token
within `first_token_timeout_s` of sending (prefill), then each next one within `token_timeout_s`.
A request given up (timeout, or the run stopping early) closes its stream: the server sees the
disconnect and stops generating it (transformers serve, vLLM and SGLang all abort on it).

Output is append-only JSONL keyed by prompt id, one flushed line per finished conversation, so a
SIGKILL loses at most the conversations in flight. Each line carries a `regeneration` record
with the fingerprint of what shaped it (target, chat template, sampling) and the hash of its
prompt: a rerun keeps the lines that still match and sends only the missing prompts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

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
    first_token_timeout_s: float  # from sending a request to its first generated token
    token_timeout_s: float | None = None  # longest gap between two streamed chunks; None = first_token_timeout_s

    def wait(self, attempt: int, retry_after: float | None = None) -> float:
        cap = min(self.backoff_max_s, self.backoff_s * 2**attempt)
        delay = cap * random.uniform(0.5, 1.0)
        return min(self.backoff_max_s, max(delay, retry_after or 0.0))


# ---- endpoints -------------------------------------------------------------------------------


class Endpoint:
    def __init__(self, url: str, client):
        self.url, self.client = url, client
        self.outstanding = 0
        self.requests = 0
        self.errors = 0
        self.resting_until = 0.0  # after a failure, others are preferred until then


class EndpointPool:
    """Picks the endpoint with the fewest requests outstanding among those not resting; with
    `slots` (requests one endpoint runs at once), `slot()` holds a request until one is free."""

    def __init__(self, endpoints: list[Endpoint], slots: int | None = None):
        if not endpoints:
            raise ValueError("no endpoints")
        if slots is not None and slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.endpoints = endpoints
        self.slots = slots
        self._free: asyncio.Semaphore | None = None  # made in the running loop
        self._turn = 0

    @property
    def in_flight(self) -> int:
        return sum(e.outstanding for e in self.endpoints)

    def slot(self) -> asyncio.Semaphore | contextlib.nullcontext:
        """`async with pool.slot():` around one request: at most slots x endpoints at once."""
        if self.slots is None:
            return contextlib.nullcontext()
        if self._free is None:
            self._free = asyncio.Semaphore(self.slots * len(self.endpoints))
        return self._free

    def acquire(self) -> Endpoint:
        now = time.monotonic()
        open_ = [e for e in self.endpoints if self.slots is None or e.outstanding < self.slots] or self.endpoints
        ready = [e for e in open_ if e.resting_until <= now] or open_
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


def open_pool(urls: list[str], api_key: str | None, max_in_flight: int = 256, slots: int | None = None) -> EndpointPool:
    """One `openai` async client per endpoint, on the SDK's aiohttp transport (`DefaultAioHttpClient`),
    with room for max_in_flight connections; retries are ours (`complete`). The default httpx pool
    scans every connection for every request: at 256 in flight that scan cost more CPU than anything
    else in the client, and `make overhead` measured 0.87 of the ideal request rate with it. `slots`:
    requests one endpoint runs at once (None: no bound beyond the conversations in flight)."""
    import httpx2
    from openai import AsyncOpenAI, DefaultAioHttpClient

    limits = httpx2.Limits(max_connections=max(max_in_flight, 1), max_keepalive_connections=max(max_in_flight, 1))
    return EndpointPool([Endpoint(url, AsyncOpenAI(base_url=f"{url}/v1", api_key=api_key or "unused", max_retries=0,
                                                   http_client=DefaultAioHttpClient(limits=limits)))
                         for url in urls], slots)


async def close_pool(pool: EndpointPool) -> None:
    for endpoint in pool.endpoints:
        await endpoint.client.close()


class ConversationFailed(Exception):
    def __init__(self, reason: str, detail: str, attempts: int = 1):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail, self.attempts = reason, detail, attempts


def root_cause(err: BaseException) -> BaseException:
    while err.__cause__ is not None:
        err = err.__cause__
    return err


def timeout_or_lost(err: BaseException) -> str:
    """"timeout", or "connection" for a connection the server dropped: the SDK's aiohttp transport
    maps every aiohttp connection error (a server disconnect too) to a timeout."""
    import aiohttp

    root = root_cause(err)
    if isinstance(root, aiohttp.ClientConnectionError) and not isinstance(root, asyncio.TimeoutError):
        return "connection"
    return "timeout"


def _retry_after(response) -> float | None:
    try:
        return float(response.headers.get("retry-after"))
    except (TypeError, ValueError, AttributeError):
        return None


class BadAnswer(ValueError):
    """An answer that is not a chat completion."""


class StreamError(Exception):
    """An error the server reported inside its stream, after answering 200."""


class AnswerTimeout(Exception):
    """No first token within first_token_timeout_s, or a gap between tokens past token_timeout_s."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason  # first_token_timeout | token_timeout


class StreamedAnswer:
    """A chat completion put together from its streamed chunks (OpenAI's delta format): content and
    reasoning concatenated, tool calls merged by index, the last finish_reason, the usage chunk."""

    def __init__(self):
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.reasoning_key = "reasoning_content"
        self.tool_calls: dict[int, dict] = {}
        self.finish_reason = None
        self.usage = None
        self.choices_seen = False
        self.chunks = 0  # chunks that carried output

    def add(self, chunk) -> bool:
        """Takes one chunk; True when it carries generated output (text, a tool call, the end)."""
        generated = self._add(chunk)
        self.chunks += generated
        return generated

    def _add(self, chunk) -> bool:
        if not isinstance(chunk, dict):
            raise BadAnswer(f"stream chunk is not a JSON object: {chunk!r:.200}")
        if chunk.get("error") is not None:
            raise StreamError(f"the server reported an error mid-stream: {json.dumps(chunk['error'])[:300]}")
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise BadAnswer("stream chunk choices is not a list")
        generated = False
        for choice in choices[:1]:
            self.choices_seen = True
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                raise BadAnswer("stream choice without a delta")
            for key, parts in (("content", self.content), ("reasoning_content", self.reasoning), ("reasoning", self.reasoning)):
                piece = delta.get(key)
                if piece is None:
                    continue
                if not isinstance(piece, str):
                    raise BadAnswer(f"delta {key} is not a string")
                if piece:
                    parts.append(piece)
                    generated = True
                    if key != "content":
                        self.reasoning_key = key
            for call in delta.get("tool_calls") or []:
                if not isinstance(call, dict) or not isinstance(call.get("function", {}), dict):
                    raise BadAnswer("malformed tool_calls delta")
                merged = self.tool_calls.setdefault(call.get("index", len(self.tool_calls)),
                                                    {"id": None, "type": "function", "function": {"name": None, "arguments": ""}})
                merged["id"] = call.get("id") or merged["id"]
                function = call.get("function") or {}
                if function.get("name"):
                    merged["function"]["name"] = function["name"]
                if function.get("arguments"):
                    merged["function"]["arguments"] += function["arguments"]
                generated = True
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
                generated = True
        return generated

    def answer(self) -> dict:
        """The chat completion it amounts to, in the non-streamed shape `answer_choice` reads."""
        if not self.choices_seen:
            return {"choices": [], "usage": self.usage}
        if self.finish_reason is None:
            raise BadAnswer("the stream ended without a finish_reason (cut short)")
        message = {"role": "assistant", "content": "".join(self.content)}
        if self.reasoning:
            message[self.reasoning_key] = "".join(self.reasoning)
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return {"choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason}], "usage": self.usage}


def add_chunk(streamed: StreamedAnswer, payload: bytes) -> int:
    """1 when the chunk (the JSON of one `data:` line) carries output, else 0."""
    try:
        chunk = json.loads(payload)
    except ValueError as err:
        raise BadAnswer(f"stream chunk not JSON: {err}") from None
    return int(streamed.add(chunk))


async def chat_completion(client, body: dict, policy: RetryPolicy, on_token=None) -> dict:
    """POST /chat/completions, streamed, with the client's transport, auth and error mapping; the
    answer is the chat completion the chunks amount to (a server that ignores `stream` and answers
    one JSON object is read as it is, within first_token_timeout_s), checked by `answer_choice`.

    The clock measures the server's work, not the client's patience: the first generated chunk must
    come within first_token_timeout_s of sending, each next one within token_timeout_s of the last.
    Giving up (timeout, cancellation) closes the stream, which makes the server stop generating.
    The body is sent as it is and chunks are read as plain JSON lines: the SDK's typed transform and
    typed objects cost more client CPU per request than the HTTP exchange, for data that is JSON on
    both ends. on_token(n) is called with the number of chunks carrying output in each read (live
    tokens/s)."""
    import httpx2

    first, gap = policy.first_token_timeout_s, policy.token_timeout_s or policy.first_token_timeout_s
    loop = asyncio.get_running_loop()
    response = None
    phase = "first_token_timeout"
    try:
        async with asyncio.timeout(first) as deadline:
            response = await client.post("/chat/completions", cast_to=httpx2.Response, body={**body, "stream": True},
                                         stream=True, options={"timeout": max(first, gap) + 10,
                                                               "security": {"bearer_auth": True}})
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                try:
                    return json.loads(await response.aread())
                except ValueError as err:  # a body that is not JSON
                    raise BadAnswer(f"not JSON: {err}") from None
            streamed = StreamedAnswer()
            pending, done = b"", False
            async for data in response.aiter_bytes():  # split here: cheaper than httpx2's text and line decoders
                *lines, pending = (pending + data).split(b"\n")
                output = 0
                for line in lines:
                    if not line.startswith(b"data:"):
                        continue  # blank separators, ": keep-alive" comments, "event:" names
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                        break
                    output += add_chunk(streamed, payload)
                if output:
                    phase = "token_timeout"
                    deadline.reschedule(loop.time() + gap)
                    if on_token:
                        on_token(output)
                if done:
                    break
            if not done and pending.startswith(b"data:") and pending[5:].strip() != b"[DONE]":
                add_chunk(streamed, pending[5:].strip())  # a last event without its newline
            answer = streamed.answer()
            if on_token and isinstance((answer.get("usage") or {}).get("completion_tokens"), int):
                on_token(answer["usage"]["completion_tokens"] - streamed.chunks)  # a chunk may hold several tokens
            return answer
    except TimeoutError:
        if phase == "first_token_timeout":
            raise AnswerTimeout(phase, f"no token within {first:g} s of sending (regenerate.first_token_timeout_s)") from None
        raise AnswerTimeout(phase, f"no next token within {gap:g} s (regenerate.token_timeout_s)") from None
    finally:
        if response is not None:
            await response.aclose()  # unread: the connection is closed, not reused


def usage_of(answer: dict) -> dict:
    """Token counts of an answer; a server that sends none counts 0."""
    usage = answer.get("usage")
    if not isinstance(usage, dict):
        return {}
    return {k: v for k, v in usage.items() if k in ("prompt_tokens", "completion_tokens") and isinstance(v, int)}


def answer_choice(answer) -> dict:
    """The first choice of a chat completion, with the fields this module reads checked."""
    if not isinstance(answer, dict):
        raise BadAnswer(f"expected a JSON object, got {type(answer).__name__}")
    choices = answer.get("choices")
    if not isinstance(choices, list):
        raise BadAnswer("no choices list in the answer")
    if not choices:
        return {}
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise BadAnswer("choice without a message")
    for key in ("content", "reasoning_content", "reasoning"):
        if message.get(key) is not None and not isinstance(message[key], str):
            raise BadAnswer(f"message {key} is not a string")
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list) or not all(
            isinstance(tc, dict) and isinstance(tc.get("function"), dict) and isinstance(tc["function"].get("name"), str)
            for tc in calls):
        raise BadAnswer("malformed tool_calls")
    return choice


async def complete(pool: EndpointPool, request: dict, policy: RetryPolicy, retries: Counter, on_token=None):
    """One chat completion, retried on 429/5xx/408, timeouts and lost connections."""
    for attempt in range(policy.max_retries + 1):
        async with pool.slot():
            outcome = await _attempt(pool, request, policy, attempt, on_token)
        if not isinstance(outcome, Retry):
            return outcome
        reason, detail, delay = outcome
        if attempt == policy.max_retries:
            break
        retries[reason] += 1
        await asyncio.sleep(delay)  # outside the slot: another request may use the server meanwhile
    raise ConversationFailed(reason, detail, policy.max_retries + 1)


class Retry(NamedTuple):
    reason: str
    detail: str
    delay: float  # backoff before the next attempt


async def _attempt(pool: EndpointPool, request: dict, policy: RetryPolicy, attempt: int, on_token):
    """(choice, usage), or the Retry of a failure worth retrying."""
    import openai

    endpoint = pool.acquire()
    retry_after = None
    try:
        try:
            answer = await chat_completion(endpoint.client, request, policy, on_token)
            choice = answer_choice(answer)
            if not choice:
                reason, detail = "empty_response", "no choices in the answer"
            else:
                pool.release(endpoint)
                return choice, usage_of(answer)
        except AnswerTimeout as err:
            reason, detail = err.reason, str(err)
        except openai.APITimeoutError as err:
            reason, detail = timeout_or_lost(err), f"{err}: {root_cause(err)!r}"
        except openai.APIConnectionError as err:
            reason, detail = "connection", f"{err}: {err.__cause__!r}"
        except openai.APIStatusError as err:
            reason, detail = f"http_{err.status_code}", str(err)[:500]
            if err.status_code not in RETRY_STATUS and err.status_code < 500:
                raise ConversationFailed(reason, detail, attempt + 1) from None  # released below
            retry_after = _retry_after(err.response)
        except StreamError as err:
            reason, detail = "stream_error", str(err)[:500]
        except (openai.APIError, BadAnswer) as err:  # an answer that is not a chat completion
            reason, detail = "bad_response", str(err)[:500]
    except BaseException:
        pool.release(endpoint)
        raise
    delay = policy.wait(attempt, retry_after)
    pool.release(endpoint, failed_for_s=delay)
    return Retry(reason, detail, delay)


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
    # vLLM returns `reasoning` (older: `reasoning_content`), SGLang and transformers `reasoning_content`
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    if reasoning:
        out["reasoning_content"] = reasoning
    if msg.get("tool_calls"):
        out["tool_calls"] = [
            {"id": tc.get("id"), "type": "function",
             "function": {"name": tc["function"]["name"], "arguments": tc["function"].get("arguments") or "{}"}}
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


async def regenerate_conversation(pool: EndpointPool, model: str, row: dict, sampling: Sampling, policy: RetryPolicy,
                                  max_context: int | None, count_ids, retries: Counter, extra_body: dict | None = None,
                                  on_token=None) -> tuple[list[dict], dict]:
    """(regenerated messages, stats). Raises ConversationFailed when a request fails for good.
    extra_body goes into every request as it is (e.g. vLLM's stream_options)."""
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
            request["chat_template_kwargs"] = sampling.chat_template_kwargs
        if extra_body:
            request.update(extra_body)
        choice, usage = await complete(pool, request, policy, retries, on_token)
        reply = reply_message(choice)
        messages = messages + [reply]  # a new list: the request above keeps its own
        finish_reason = choice.get("finish_reason") or "unknown"
        stats["finish_reasons"].append(finish_reason)
        for key in ("prompt_tokens", "completion_tokens"):
            stats[key] += usage.get(key) or 0
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


async def regenerate_all(pool: EndpointPool, model: str, rows: list[dict], sampling: Sampling, policy: RetryPolicy,
                         partitions: dict[str, tuple[int, int | None]], out_path: Path, failures_path: Path,
                         tags: dict, count_ids=None, max_failures: int | None = None, on_done=None,
                         on_tick=None, tick_s: float = 30.0, extra_body: dict | None = None) -> Tally:
    """Regenerate `rows`; `partitions` maps "short"/"long" to (concurrency, max_context).

    Each finished conversation is one flushed line of out_path (the row with its regenerated
    messages and a `regeneration` record: `tags` plus its own stats); each failed one is one line
    of failures_path with its reason. Past `max_failures` failures the run stops early: the stage
    would fail anyway, so the conversations in flight are cancelled (their streams closed, which
    stops the server's work on them) and what is done stays done.

    A partition runs at most `concurrency` conversations, and no more than the pool's slots: a
    conversation beyond them would only wait. on_done(tally) follows every finished conversation;
    on_tick(tally) comes every tick_s whatever happens (tally.in_flight: requests at the servers).
    """
    tally = Tally(partitions={name: PartitionTally() for name in partitions})
    queues: dict[str, list[dict]] = {name: [] for name in partitions}
    for row in rows:
        name = row.get("partition", "short")
        if name not in queues:
            raise ValueError(f"prompt {row['id']}: unknown partition {name!r} (expected one of {sorted(queues)})")
        queues[name].append(row)
    stop = asyncio.Event()

    def on_token(n: int) -> None:
        tally.streamed_tokens += n

    with open(out_path, "a") as out, open(failures_path, "w") as failures:
        async def one(name: str, row: dict) -> None:
            part = tally.partitions[name]
            part.sent += 1
            part.first_start = part.first_start or time.monotonic()
            max_context = partitions[name][1]
            tally.conversations_in_flight += 1
            try:
                messages, stats = await regenerate_conversation(pool, model, row, sampling, policy, max_context,
                                                                count_ids, tally.retries, extra_body, on_token)
            except ConversationFailed as err:
                tally.failed += 1
                part.failed += 1
                tally.failure_reasons[err.reason] += 1
                failures.write(json.dumps({"id": row["id"], "partition": name, "reason": err.reason,
                                           "attempts": err.attempts, "detail": err.detail[:500]}) + "\n")
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
    tally.in_flight = pool.in_flight
    tally.aborted = stop.is_set()
    return tally


# ---- resume ----------------------------------------------------------------------------------


def load_finished(path: Path, prompts: dict[str, dict], tags_fingerprint: str,
                  rewrite: bool = True) -> tuple[set[str], dict]:
    """Ids of the lines of previous runs that still hold: well-formed, first of their id, made
    with the same fingerprint and, for ids still prompted, from the same prompt; with counts of
    what was dropped and `last_run`, the highest run number kept (see run_of). Lines of ids no
    longer prompted stay (shrinking `samples` and growing it back loses nothing). When anything was
    dropped or the last line was cut by a kill, the file is rewritten atomically without it (only
    with `rewrite`: the stage first counts, and drops lines only once the servers passed their
    preflight); the file is streamed twice rather than held in memory (it reaches gigabytes)."""
    counts = Counter()
    keep: list[bool] = []
    done: set[str] = set()
    last_run = 0  # the highest `run` of the lines kept (lines from before runs were numbered: 0)
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
                    last_run = max(last_run, run_of(row))
                if reason:
                    counts[reason] += 1
                keep.append(reason is None)
    dropped = sum(v for k, v in counts.items() if k != "not_in_prompts")
    if rewrite and (dropped or cut_last_line):
        with atomic_path(path) as tmp, open(path, "rb") as src, open(tmp, "wb") as dst:
            for line, kept in zip(src, keep):
                if kept:
                    dst.write(line if line.endswith(b"\n") else line + b"\n")
    kept = {k: counts[k] for k in ("bad_lines", "duplicates", "stale_settings", "stale_prompt", "not_in_prompts")}
    return done, {**kept, "last_run": last_run}


def run_of(row: dict) -> int:
    """The regenerate run that wrote a conversation line: each run of the stage that sends anything
    numbers its lines one past the highest kept (`regeneration.run`; 0 for lines written before runs
    were numbered). Rows are ordered by (run, prompt order) downstream: deterministic for a given
    history of runs, whatever order the answers finished in, and append-only across runs."""
    regen = row.get("regeneration")
    run = regen.get("run", 0) if isinstance(regen, dict) else 0
    return run if isinstance(run, int) else 0
