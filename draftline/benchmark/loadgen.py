"""Async load generator for OpenAI-compatible and SGLang servers: streaming requests, latency stats.

Two wire protocols, each as its server's source defines it:

- `openai-completions`: POST /v1/completions with `stream: true` (vLLM, `transformers serve`).
  Chunks are `data: {"choices": [{"text": <delta>, ...}], "usage": ...}` lines ending in
  `data: [DONE]`. With `continuous_usage` (vLLM's `stream_options.continuous_usage_stats`) every
  chunk carries the cumulative `usage.completion_tokens`, so a chunk holding several tokens (one
  speculative step) is counted as such; `include_usage` adds a final chunk with `choices: []`.
  `transformers serve` rejects `stream_options` and sends its usage with the finish chunk.
- `sglang-generate`: SGLang's native POST /generate with `input_ids` and `stream: true`. Each
  chunk is `data: {"text": <cumulative text>, "meta_info": {"completion_tokens": n, ...}}`; the
  final one's meta_info carries the speculative counters (`spec_verify_ct`, ...).

Timing per request: TTFT = first chunk with output; inter-token latency = the gap between output
chunks, spread evenly over the tokens the chunk carries when the count is known (as SGLang's
bench_serving does); TPOT = (latency - TTFT) / (output tokens - 1).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

Protocol = Literal["openai-completions", "sglang-generate"]


@dataclass(frozen=True)
class LoadTarget:
    """A server under load: where it is and the wire protocol it is spoken to in."""

    base_url: str
    protocol: Protocol
    model: str | None = None  # the `model` field of openai requests
    stream_options: bool = False  # send include_usage + continuous_usage_stats (vLLM)
    token_ids: bool = (
        False  # ask for the output's token ids (vLLM return_token_ids; SGLang sends them)
    )
    top_logprobs: int = 0  # ask for this many top logprobs per output token (untimed passes only)


@dataclass
class RequestResult:
    prompt_index: int
    ok: bool = False
    error: str = ""
    ttft_s: float | None = None
    latency_s: float = 0.0
    output_tokens: int = 0
    itl_s: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    meta_info: dict = field(default_factory=dict)  # SGLang's final meta_info (speculative counters)
    token_ids: list[int] = field(
        default_factory=list
    )  # the output's ids, when the server sends them
    # per output token, its top logprobs by token id (asked with LoadTarget.top_logprobs)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


def request_body(
    endpoint: LoadTarget, prompt: list[int] | str, max_tokens: int
) -> tuple[str, dict]:
    """(path, JSON body) of one greedy streaming request."""
    if endpoint.protocol == "sglang-generate":
        key = "text" if isinstance(prompt, str) else "input_ids"
        body = {
            key: prompt,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": max_tokens},
            "stream": True,
        }
        if endpoint.top_logprobs:
            body.update(return_logprob=True, top_logprobs_num=endpoint.top_logprobs)
        return "/generate", body
    body = {
        "model": endpoint.model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
    }
    if endpoint.stream_options:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    if endpoint.token_ids:
        body["return_token_ids"] = True
    if endpoint.top_logprobs:  # keyed "token_id:<id>", so that they are read by id
        body.update(logprobs=endpoint.top_logprobs, return_tokens_as_token_ids=True)
    return "/v1/completions", body


def _logprobs_by_id(entries) -> dict[int, float]:
    """{token id: logprob} of one token's top logprobs: vLLM's {"token_id:<id>": lp} or SGLang's
    [[lp, id, text], ...]."""
    if isinstance(entries, dict):
        return {int(key.rsplit(":", 1)[1]): lp for key, lp in entries.items()}
    return {int(entry[1]): entry[0] for entry in entries or []}


class ChunkTimer:
    """Turns (time, tokens in chunk) events into TTFT and per-token inter-token latencies."""

    def __init__(self, start: float):
        self.start, self.last = start, None
        self.ttft: float | None = None
        self.itl: list[float] = []

    def output(self, now: float, tokens: int | None) -> None:
        if self.last is None:
            self.ttft = now - self.start
        else:
            n = max(1, tokens or 1)
            self.itl.extend([(now - self.last) / n] * n)
        self.last = now


def parse_openai_chunk(
    data: dict,
    result: RequestResult,
    timer: ChunkTimer,
    now: float,
    seen_tokens: int,
    per_chunk_usage: bool,
) -> int:
    """Fold one /v1/completions chunk into result; returns the cumulative token count seen so far.

    per_chunk_usage: every chunk carries cumulative usage (vLLM continuous_usage_stats), so a
    chunk's token count is known even when its text is empty; otherwise usage only ends the stream.
    """
    if "error" in data:
        raise RuntimeError(f"server error in stream: {data['error']}")
    usage = data.get("usage") or {}
    cumulative = usage.get("completion_tokens")
    choices = data.get("choices") or []
    text = "".join(c.get("text") or "" for c in choices)
    for c in choices:
        result.finish_reason = c.get("finish_reason") or result.finish_reason
        result.token_ids.extend(c.get("token_ids") or [])
        result.top_logprobs.extend(
            _logprobs_by_id(entries)
            for entries in (c.get("logprobs") or {}).get("top_logprobs") or []
        )
    new_tokens = cumulative - seen_tokens if per_chunk_usage and cumulative is not None else None
    if text or (new_tokens and choices):
        timer.output(now, new_tokens)
        result.text += text
    if cumulative is not None:
        result.output_tokens = cumulative
        return cumulative
    return seen_tokens


def parse_sglang_chunk(
    data: dict,
    result: RequestResult,
    timer: ChunkTimer,
    now: float,
    seen_tokens: int,
    per_chunk_usage: bool = True,
) -> int:
    if "error" in data:
        raise RuntimeError(f"server error in stream: {data['error']}")
    meta = data.get("meta_info") or {}
    cumulative = int(meta.get("completion_tokens", seen_tokens))
    if cumulative > seen_tokens:
        timer.output(now, cumulative - seen_tokens)
    result.text = data.get("text", result.text)  # cumulative unless --incremental-streaming-output
    result.output_tokens = cumulative
    result.meta_info = meta
    if data.get("output_ids"):  # cumulative, like the text
        result.token_ids = list(data["output_ids"])
    if meta.get("output_top_logprobs"):
        result.top_logprobs = [_logprobs_by_id(e) for e in meta["output_top_logprobs"]]
    finish = meta.get("finish_reason")
    if isinstance(finish, dict):
        result.finish_reason = finish.get("type")
    return cumulative


async def send_request(
    client, endpoint: LoadTarget, prompt_index: int, prompt: list[int] | str, max_tokens: int
) -> RequestResult:
    """One streaming request; failures are returned, not raised (a load test counts them)."""
    path, body = request_body(endpoint, prompt, max_tokens)
    parse = parse_sglang_chunk if endpoint.protocol == "sglang-generate" else parse_openai_chunk
    result = RequestResult(prompt_index)
    start = time.perf_counter()
    timer, seen = ChunkTimer(start), 0
    try:
        async with client.stream("POST", endpoint.base_url + path, json=body) as resp:
            if resp.status_code != 200:
                detail = (await resp.aread()).decode(errors="replace")[:300]
                raise RuntimeError(f"HTTP {resp.status_code}: {detail}")
            async for line in resp.aiter_lines():
                line = line.strip()
                if not line.startswith("data:"):
                    continue
                payload = line[len("data:") :].strip()
                if payload == "[DONE]":
                    break
                seen = parse(
                    json.loads(payload),
                    result,
                    timer,
                    time.perf_counter(),
                    seen,
                    endpoint.stream_options,
                )
        result.ok = True
    except Exception as err:  # noqa: BLE001 - a failed request is a counted outcome
        result.error = f"{type(err).__name__}: {err}"[:500]
    result.latency_s = time.perf_counter() - start
    result.ttft_s, result.itl_s = timer.ttft, timer.itl
    return result


@dataclass(frozen=True)
class Load:
    """One load run: at least `requests` requests, and requests started for at least `min_seconds`
    (cycling over the prompts), at most `concurrency` in flight, each asking for at most
    max_tokens and given timeout_s."""

    requests: int
    concurrency: int
    max_tokens: int
    timeout_s: float
    min_seconds: float = 0.0


async def run_load(
    endpoint: LoadTarget, prompts: list, load: Load, on_done=None
) -> tuple[list[RequestResult], float]:
    """Requests cycling over `prompts` from `concurrency` workers: each starts another while fewer
    than load.requests have started or load.min_seconds have not passed; (results in start order,
    wall seconds until the last one finished)."""
    # httpx loads on first use: importing this module stays light
    import httpx

    concurrency = load.concurrency
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    results: dict[int, RequestResult] = {}
    started = 0
    async with httpx.AsyncClient(timeout=httpx.Timeout(load.timeout_s), limits=limits) as client:
        start = time.perf_counter()

        async def worker() -> None:
            nonlocal started
            while started < load.requests or time.perf_counter() - start < load.min_seconds:
                i, started = started, started + 1
                result = await send_request(
                    client, endpoint, i % len(prompts), prompts[i % len(prompts)], load.max_tokens
                )
                results[i] = result
                if on_done:
                    on_done(result)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return [results[i] for i in sorted(results)], time.perf_counter() - start


def percentiles_ms(
    values: list[float], name: str, quantiles=(50, 90, 99)
) -> dict[str, float | None]:
    """{name_mean, name_p50, ...} in milliseconds; None when there are no values."""
    if not values:
        return {f"{name}_mean": None, **{f"{name}_p{q}": None for q in quantiles}}
    arr = np.asarray(values) * 1000.0
    out = {f"{name}_mean": round(float(arr.mean()), 3)}
    out.update({f"{name}_p{q}": round(float(np.percentile(arr, q)), 3) for q in quantiles})
    return out


def summarize_load(results: list[RequestResult], wall_s: float) -> dict:
    """Flat throughput and latency metrics of one load level."""
    ok = [r for r in results if r.ok]
    tokens = sum(r.output_tokens for r in ok)
    summary = {
        "requests": len(results),
        "failed": len(results) - len(ok),
        "output_tokens": tokens,
        "seconds": round(wall_s, 3),
        "output_tokens_per_s": round(tokens / wall_s, 2) if wall_s > 0 else 0.0,
        "requests_per_s": round(len(ok) / wall_s, 3) if wall_s > 0 else 0.0,
    }
    summary.update(percentiles_ms([r.ttft_s for r in ok if r.ttft_s is not None], "ttft_ms"))
    summary.update(percentiles_ms([x for r in ok for x in r.itl_s], "itl_ms"))
    summary.update(percentiles_ms([r.tpot_s for r in ok if r.tpot_s is not None], "tpot_ms"))
    summary.update(percentiles_ms([r.latency_s for r in ok], "e2e_ms"))
    return summary
