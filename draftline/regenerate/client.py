"""The chat client of long generation runs on OpenAI-compatible servers: the endpoint pool,
streamed requests, timeouts and retries (the streamed answer is put together and checked in
draftline/regenerate/stream.py).

Requests go to the least busy endpoint (fewest outstanding; one that just failed rests for its
backoff), at most `slots` per endpoint at once: beyond what a server runs, a request would only
queue and its timeout would measure the queue. 429/5xx/408, timeouts and lost connections are
retried with exponential backoff and jitter; other HTTP errors (400, 404, 422...) fail at once.
Answers are streamed, so timeouts measure the server's work: the first token within
`first_token_timeout_s` of sending (prefill), each next one within `token_timeout_s`. A request
given up closes its stream, and the server stops generating it (transformers serve, vLLM, SGLang).

The HTTP client is a bare aiohttp session per endpoint, whose keep-alive connections a finished
answer goes back to (read to its end); bodies go out as JSON and the stream is read as JSON lines.
The `openai` SDK on the same transport costs several times the client CPU per request (its typed
request building, its httpx layer, a new connection for every other request).
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

import orjson

from draftline.regenerate.stream import (
    AnswerTimeout,
    BadAnswer,
    StreamedAnswer,
    StreamError,
    add_chunk,
    answer_choice,
    loads,
    usage_of,
)

RETRY_STATUS = {408, 429}  # and every 5xx
DRAIN_S = 1.0  # after [DONE], how long the end of the stream may take to come (then: closed)


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


class ChatClient:
    """POST /v1/chat/completions of one server: an aiohttp session (made in the running loop at
    the first request) on a pool of up to `connections` keep-alive connections, with the API key."""

    def __init__(self, url: str, api_key: str | None, connections: int):
        self.url = f"{url}/v1/chat/completions"
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.connections = max(connections, 1)
        self._session = None

    def session(self):
        # aiohttp loads on first use: importing this module stays light
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.connections, limit_per_host=0),
                # no aiohttp deadline: chat_completion's clock (first token, next token) is the one
                timeout=aiohttp.ClientTimeout(total=None),
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


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
    """One ChatClient per endpoint, with room for max_in_flight connections; retries are ours
    (`complete`). `slots`: requests one endpoint runs at once (None: no bound beyond the
    conversations in flight)."""
    import aiohttp  # noqa: F401  imported here, with the pool, not at the first request

    return EndpointPool(
        [Endpoint(url, ChatClient(url, api_key, max_in_flight)) for url in urls], slots
    )


async def close_pool(pool: EndpointPool) -> None:
    for endpoint in pool.endpoints:
        await endpoint.client.close()


class ConversationFailed(Exception):
    """A request failed for good (after its retries, or at once): the conversation cannot go on."""

    def __init__(self, reason: str, detail: str, attempts: int = 1):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail, self.attempts = reason, detail, attempts


class HTTPError(Exception):
    """A server that answered an error status; retry_after from its Retry-After header."""

    def __init__(self, status: int, detail: str, retry_after: float | None):
        super().__init__(f"HTTP {status}: {detail}")
        self.status, self.retry_after = status, retry_after


def dumps(body: dict) -> bytes:
    """A request body as JSON: orjson (a tenth of json's time), json for what orjson refuses
    (integers past 64 bits, lone surrogates) so that every body json takes still goes out."""
    try:
        return orjson.dumps(body)
    except TypeError:
        return json.dumps(body).encode()


def _retry_after(headers) -> float | None:
    try:
        return float(headers.get("retry-after"))
    except (TypeError, ValueError):
        return None


async def chat_completion(
    client: ChatClient, body: dict, policy: RetryPolicy, on_token=None
) -> dict:
    """POST /chat/completions, streamed; the answer is the chat completion the chunks amount to (a
    server that ignores `stream` and answers one JSON object is read as it is, within
    first_token_timeout_s), checked by `answer_choice`.

    The clock measures the server's work, not the client's patience: the first generated chunk must
    come within first_token_timeout_s of sending, each next one within token_timeout_s of the last.
    Giving up (timeout, cancellation, an error) closes the connection, which makes the server stop
    generating; a whole answer leaves its connection to the next request. on_token(n) is called
    with the number of chunks carrying output in each read (live tokens/s)."""
    first, gap = (
        policy.first_token_timeout_s,
        policy.token_timeout_s or policy.first_token_timeout_s,
    )
    loop = asyncio.get_running_loop()
    response, whole = None, False
    phase = "first_token_timeout"
    try:
        async with asyncio.timeout(first) as deadline:
            response = await client.session().post(
                client.url,
                data=dumps({**body, "stream": True}),
                headers=client.headers,
            )
            if response.status >= 400:
                text = (await response.read()).decode("utf-8", "replace")
                whole = True
                raise HTTPError(response.status, text[:500], _retry_after(response.headers))
            if not response.content_type.startswith("text/event-stream"):
                answer = await _read_whole(response)  # a server that ignores `stream`
                whole = True
                tokens = _completion_tokens(answer)
                if on_token and tokens is not None:
                    on_token(tokens)  # the progress line's tok/s counts whole answers too
                return answer
            streamed = StreamedAnswer()
            pending, done = b"", False
            async for data in response.content.iter_any():  # lines split here, as bytes
                *lines, pending = (pending + data).split(b"\n")
                output, done = _add_events(streamed, lines)
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
        if on_token and (tokens := _completion_tokens(answer)) is not None:
            on_token(tokens - streamed.chunks)  # a chunk may hold several tokens
        whole = await _read_to_end(response)
        return answer
    except TimeoutError:
        raise _answer_timeout(phase, first, gap) from None
    finally:
        if response is not None:
            if whole:
                response.release()  # read to its end: the connection serves the next request
            else:
                response.close()  # given up or cut: the server sees the connection close


async def _read_whole(response):
    """The body of a server that ignores `stream` and answers one JSON object; BadAnswer when
    it is not JSON."""
    try:
        return loads(await response.read())
    except ValueError as err:  # a body that is not JSON
        raise BadAnswer(f"not JSON: {err}") from None


def _completion_tokens(answer) -> int | None:
    """An answer's usage.completion_tokens where it is an integer (None otherwise): the tokens
    on_token counts for it."""
    tokens = (
        (answer.get("usage") or {}).get("completion_tokens") if isinstance(answer, dict) else None
    )
    return tokens if isinstance(tokens, int) else None


def _add_events(streamed: StreamedAnswer, lines: list[bytes]) -> tuple[int, bool]:
    """The `data:` events of whole stream lines added to the answer: (chunks carrying output,
    whether [DONE] came; the lines after it are not read)."""
    output = 0
    for line in lines:
        if not line.startswith(b"data:"):
            continue  # blank separators, ": keep-alive" comments, "event:" names
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return output, True
        output += add_chunk(streamed, payload)
    return output, False


def _answer_timeout(phase: str, first: float, gap: float) -> AnswerTimeout:
    """The error of a request whose clock ran out in `phase` (first token, or next token)."""
    if phase == "first_token_timeout":
        return AnswerTimeout(
            phase, f"no token within {first:g} s of sending (regenerate.first_token_timeout_s)"
        )
    return AnswerTimeout(phase, f"no next token within {gap:g} s (regenerate.token_timeout_s)")


async def _read_to_end(response) -> bool:
    """After [DONE]: the rest of the stream (its end, normally already here), so that the
    connection can be kept; False when it does not end within DRAIN_S."""
    import aiohttp

    if response.content.at_eof():
        return True
    try:
        async with asyncio.timeout(DRAIN_S):
            while await response.content.readany():
                pass
    except (TimeoutError, aiohttp.ClientError):
        return False
    return True


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
    import aiohttp

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
        except HTTPError as err:
            reason, detail = f"http_{err.status}", str(err)[:500]
            if err.status not in RETRY_STATUS and err.status < 500:
                raise ConversationFailed(reason, detail, attempt + 1) from None  # released below
            retry_after = err.retry_after
        except StreamError as err:
            reason, detail = "stream_error", str(err)[:500]
        except BadAnswer as err:  # an answer that is not a chat completion
            reason, detail = "bad_response", str(err)[:500]
        except aiohttp.ClientResponseError as err:  # a reply that is not HTTP as it should be
            reason, detail = "bad_response", f"{type(err).__name__}: {err}"[:500]
        except (aiohttp.ClientError, OSError) as err:  # refused, reset, dropped mid-answer
            reason, detail = "connection", f"{type(err).__name__}: {err}"[:500]
    except BaseException:
        pool.release(endpoint)
        raise
    delay = policy.wait(attempt, retry_after)
    pool.release(endpoint, failed_for_s=delay)
    return Retry(reason, detail, delay)
