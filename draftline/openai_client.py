"""The chat client of long generation runs on OpenAI-compatible servers: the endpoint pool,
streamed requests, timeouts and retries (the streamed answer is put together and checked in
draftline/answer_stream.py).

Requests go to the least busy endpoint (fewest outstanding; one that just failed rests for its
backoff), at most `slots` per endpoint at once: beyond what a server runs, a request would only
queue and its timeout would measure the queue. 429/5xx/408, timeouts and lost connections are
retried with exponential backoff and jitter; other HTTP errors (400, 404, 422...) fail at once.
Answers are streamed, so timeouts measure the server's work: the first token within
`first_token_timeout_s` of sending (prefill), each next one within `token_timeout_s`. A request
given up closes its stream, and the server stops generating it (transformers serve, vLLM, SGLang).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

from draftline.answer_stream import (
    AnswerTimeout,
    BadAnswer,
    StreamedAnswer,
    StreamError,
    add_chunk,
    answer_choice,
    usage_of,
)

RETRY_STATUS = {408, 429}  # and every 5xx


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int
    backoff_s: float
    backoff_max_s: float
    first_token_timeout_s: float  # from sending a request to its first generated token
    # longest gap between two streamed chunks; None = first_token_timeout_s
    token_timeout_s: float | None = None

    def wait(self, attempt: int, retry_after: float | None = None) -> float:
        cap = min(self.backoff_max_s, self.backoff_s * 2**attempt)
        delay = cap * random.uniform(0.5, 1.0)
        return min(self.backoff_max_s, max(delay, retry_after or 0.0))


class Endpoint:
    """One server of a pool: its client, and the requests it has outstanding, served and failed."""

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
        open_ = [
            e for e in self.endpoints if self.slots is None or e.outstanding < self.slots
        ] or self.endpoints
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


def open_pool(
    urls: list[str], api_key: str | None, max_in_flight: int = 256, slots: int | None = None
) -> EndpointPool:
    """One `openai` async client per endpoint, on the SDK's aiohttp transport (`DefaultAioHttpClient`),
    with room for max_in_flight connections; retries are ours (`complete`). The default httpx pool
    scans every connection for every request: at 256 in flight that scan cost more CPU than anything
    else in the client, and `make overhead` measured 0.87 of the ideal request rate with it. `slots`:
    requests one endpoint runs at once (None: no bound beyond the conversations in flight)."""
    import httpx2
    from openai import AsyncOpenAI, DefaultAioHttpClient

    limits = httpx2.Limits(
        max_connections=max(max_in_flight, 1), max_keepalive_connections=max(max_in_flight, 1)
    )
    return EndpointPool(
        [
            Endpoint(
                url,
                AsyncOpenAI(
                    base_url=f"{url}/v1",
                    api_key=api_key or "unused",
                    max_retries=0,
                    http_client=DefaultAioHttpClient(limits=limits),
                ),
            )
            for url in urls
        ],
        slots,
    )


async def close_pool(pool: EndpointPool) -> None:
    for endpoint in pool.endpoints:
        await endpoint.client.close()


class ConversationFailed(Exception):
    """A request failed for good (after its retries, or at once): the conversation cannot go on."""

    def __init__(self, reason: str, detail: str, attempts: int = 1):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail, self.attempts = reason, detail, attempts


def root_cause(err: BaseException) -> BaseException:
    while err.__cause__ is not None:
        err = err.__cause__
    return err


def timeout_or_lost(err: BaseException) -> str:
    """ "timeout", or "connection" for a connection the server dropped: the SDK's aiohttp transport
    maps every aiohttp connection error (a server disconnect too) to a timeout."""
    import aiohttp

    root = root_cause(err)
    if isinstance(root, aiohttp.ClientConnectionError) and not isinstance(
        root, asyncio.TimeoutError
    ):
        return "connection"
    return "timeout"


def _retry_after(response) -> float | None:
    try:
        return float(response.headers.get("retry-after"))
    except (TypeError, ValueError, AttributeError):
        return None


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

    first, gap = (
        policy.first_token_timeout_s,
        policy.token_timeout_s or policy.first_token_timeout_s,
    )
    loop = asyncio.get_running_loop()
    response = None
    phase = "first_token_timeout"
    try:
        async with asyncio.timeout(first) as deadline:
            response = await client.post(
                "/chat/completions",
                cast_to=httpx2.Response,
                body={**body, "stream": True},
                stream=True,
                options={"timeout": max(first, gap) + 10, "security": {"bearer_auth": True}},
            )
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                try:  # a server that ignores `stream` and answers whole
                    answer = json.loads(await response.aread())
                except ValueError as err:  # a body that is not JSON
                    raise BadAnswer(f"not JSON: {err}") from None
                tokens = (
                    (answer.get("usage") or {}).get("completion_tokens")
                    if isinstance(answer, dict)
                    else None
                )
                if on_token and isinstance(tokens, int):
                    on_token(tokens)  # the progress line's tok/s counts whole answers too
                return answer
            streamed = StreamedAnswer()
            pending, done = b"", False
            async for (
                data
            ) in response.aiter_bytes():  # split here: cheaper than httpx2's text and line decoders
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
                on_token(
                    answer["usage"]["completion_tokens"] - streamed.chunks
                )  # a chunk may hold several tokens
            return answer
    except TimeoutError:
        if phase == "first_token_timeout":
            raise AnswerTimeout(
                phase, f"no token within {first:g} s of sending (regenerate.first_token_timeout_s)"
            ) from None
        raise AnswerTimeout(
            phase, f"no next token within {gap:g} s (regenerate.token_timeout_s)"
        ) from None
    finally:
        if response is not None:
            await response.aclose()  # unread: the connection is closed, not reused


async def complete(
    pool: EndpointPool, request: dict, policy: RetryPolicy, retries: Counter, on_token=None
):
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
