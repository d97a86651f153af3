"""A small OpenAI-compatible chat server that decodes greedily in batches: `regenerate.backend: hf`.

    draftline batch-server MODEL_DIR --port 8011 [--max-batch 32] [--stats-file F]

On CPU, `transformers serve` answers one request at a time, so the regenerate stage ran at a tenth
of what a batched `generate` of the same model does, and at a fifth with its continuous batching
(overhead/regen_throughput.py). This server keeps the stage's client, records, resume and
failure handling exactly as they are (it is one more OpenAI-compatible endpoint) and runs the
requests in flight together. One inference thread decodes them step by step on one KV cache
(float32, greedy), making the forward passes `generate` makes (`GreedyBatch`): the waiting
requests (up to --max-batch; when nothing runs, after a --gather-ms pause for stragglers) are
prefilled left-padded and join the rows already decoding at the next step, every step hands each
row its next token at once, and a row leaves the batch when it ends (an end token, its
max_tokens) or when its client goes away (a request given up at a timeout stops costing compute
at the next step, and its retry is one more request, not a wait behind it). So a request waits
at most one step and its prefill for its first token, however long the batch runs.

Answers stream as vLLM streams them (`stream: true`: SSE `chat.completion.chunk`s, a usage chunk
when `stream_options.include_usage` asks, usage on every chunk with `continuous_usage_stats`), or
come whole without `stream`. With `return_token_ids` (vLLM's request field) each streamed chunk's
choice carries the ids generated since the last one and a whole answer's choice all of them, the
end token included. Prompts are rendered as the client counts them (`chat_prompt_ids`);
answers are decoded and parsed (content, reasoning, tool calls) by transformers serve's own
`parse_assistant_message`, so the records look as they would from `transformers serve`. A
streamed answer sends, as tokens come, the text of that same parse over its tokens so far (all but
the last, trailing whitespace held back) wherever it only extends what was sent; its end sends the
rest of the parse of the whole answer, then its tool calls, so the message a client puts together
from the chunks is the whole answer. A parse that changes text already sent (a marker spelled over
several tokens, say) ends the stream with an error chunk rather than a wrong answer, and the
answer is kept: the client's retry of the same request gets it at once.

Greedy only: a request with temperature > 0 is refused (HTTP 400). Padding, and rows joining or
leaving, change float rounding a little, so where the top two logits are within --tie-tolerance a
batched argmax may differ from a batch-1 decode. The server cannot afford that decode for every
request; it counts what it can see: the tokens of each request's own answer (each row decodes to
its own end token and max_tokens, then leaves) whose top-two margin is below the tolerance, each a
place where its answer may have flipped (`near_tie_tokens`, `near_tie_requests` and their share in
the stats file, which the stage copies into its report, with requests answered and `cancelled`,
`prefills`, decode `steps`, `mean_batch` rows per step and `largest_batch`).

Endpoints: GET /health, GET /v1/models, POST /v1/chat/completions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import queue
import re
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from draftline.core.errors import DraftlineError, entry_point
from draftline.engines.commands import BatchSettings
from draftline.engines.greedy_batch import GreedyBatch, Row
from draftline.tokens.chat import chat_prompt_ids

# by name: the server runs as `python -m draftline.engines.batch_server` (__main__, a logger
# nothing sets up)
log = logging.getLogger("draftline.engines.batch_server")

# not streamed before the answer ends: trailing whitespace, and U+FFFD (a character whose bytes
# are still being generated)
HELD_BACK = re.compile(r"[\s\ufffd]+\Z")
TEXT_FIELDS = ("reasoning_content", "content")


class BatchServerError(DraftlineError):
    """A target this server cannot decode (the message says why and what serves it instead)."""


@dataclass
class Request:
    """A chat completion waiting for, or in, the decoding batch."""

    prompt_ids: list[int]
    max_tokens: int
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue  # from the inference thread: token ids, then Finished or an exception
    cancelled: bool = False  # its client went away: dropped at the next step, or never started


@dataclass
class Finished:
    ties: int  # near-tie tokens of the answer


@dataclass
class Stats:
    requests: int = 0  # answered
    cancelled: int = 0  # dropped: the client went away before its answer ended
    prefills: int = 0  # groups of requests prefilled together
    steps: int = 0  # batched token picks
    row_steps: int = 0  # rows in them
    completion_tokens: int = 0
    near_tie_tokens: int = 0
    largest_batch: int = 0
    generate_seconds: float = 0.0
    near_tie_requests: int = 0  # requests with a near-tie within their own answer
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "requests": self.requests,
            "cancelled": self.cancelled,
            "prefills": self.prefills,
            "steps": self.steps,
            "mean_batch": round(self.row_steps / self.steps, 2) if self.steps else 0,
            "largest_batch": self.largest_batch,
            "completion_tokens": self.completion_tokens,
            "near_tie_tokens": self.near_tie_tokens,
            "near_tie_requests": self.near_tie_requests,
            "near_tie_request_share": round(self.near_tie_requests / self.requests, 4)
            if self.requests
            else 0.0,
            "generate_seconds": round(self.generate_seconds, 2),
            **self.extra,
        }


# ---- streamed answers --------------------------------------------------------------------------


def parse_answer(tokenizer, model, prompt_ids: list[int], tokens: list[int]):
    """(content, reasoning, tool calls) of generated `tokens`, as transformers serve parses them."""
    # transformers / torch load on first use: regenerate.run imports this module, its server runs it
    from transformers.cli.serving.utils import parse_assistant_message

    cleaned = tokenizer.decode(tokens, skip_special_tokens=True)
    return parse_assistant_message(
        tokenizer, model, tokens, input_ids=prompt_ids, cleaned_content=cleaned
    )


def text_fields(tokenizer, model, prompt_ids: list[int], tokens: list[int]) -> dict | None:
    """The text of an unfinished answer's parse; None where it does not parse yet."""
    try:
        content, reasoning, _ = parse_answer(tokenizer, model, prompt_ids, tokens)
    except Exception:  # noqa: BLE001 - a parser given half a structure
        return None
    return {"reasoning_content": reasoning, "content": content}


@dataclass(frozen=True)
class AnswerReader:
    """What turns generated ids into a chat message: the target's tokenizer and model (which pick
    transformers serve's parser) and its end tokens."""

    tokenizer: object
    model: object
    eos_ids: set[int]


def assistant_message(
    reader: AnswerReader, request_id: str, prompt_ids: list[int], tokens: list[int], max_tokens: int
) -> tuple[dict, str]:
    """The whole answer as a chat message, and its finish reason."""
    content, reasoning, calls = parse_answer(reader.tokenizer, reader.model, prompt_ids, tokens)
    message = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [
            {
                "id": f"{request_id}_tool_call_{i}",
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for i, c in enumerate(calls)
        ]
        finish = "tool_calls"
    elif tokens and tokens[-1] in reader.eos_ids:
        finish = "stop"
    else:
        finish = "length" if len(tokens) >= max_tokens else "stop"
    return message, finish


class StreamMismatch(Exception):
    """The whole answer's parse does not extend the text already streamed."""


@dataclass(frozen=True)
class StreamOptions:
    """What a streamed request asks for beyond the text."""

    include_usage: bool = False  # stream_options.include_usage: a usage chunk at the end
    continuous_usage: bool = False  # stream_options.continuous_usage_stats: usage on every chunk
    return_token_ids: bool = False  # vLLM's field: each chunk's choice has its ids

    @classmethod
    def of(cls, body: dict) -> StreamOptions:
        options = body.get("stream_options") or {}
        return cls(
            bool(options.get("include_usage")),
            bool(options.get("continuous_usage_stats")),
            bool(body.get("return_token_ids")),
        )


class ChunkStream:
    """The chunks of one streamed answer (`chat.completion.chunk`, as vLLM sends them): the text
    sent so far, and what may be sent next."""

    def __init__(
        self,
        request_id: str,
        model: str,
        prompt_tokens: int,
        text_of,
        options: StreamOptions = StreamOptions(),
    ):
        self.request_id, self.model, self.prompt_tokens = request_id, model, prompt_tokens
        self.text_of = text_of  # generated ids -> {reasoning_content, content}, None: no parse yet
        self.include_usage, self.continuous_usage = options.include_usage, options.continuous_usage
        self.return_token_ids = options.return_token_ids
        self.created = int(time.time())
        self.completion_tokens = 0
        self.ids_sent = 0  # generated ids already sent in a chunk's `token_ids`
        self.sent = dict.fromkeys(TEXT_FIELDS, "")

    def usage(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    def chunk(
        self, delta: dict | None, finish: str | None = None, tokens: list[int] | None = None
    ) -> dict:
        """A chunk of one choice's delta; delta None: the usage chunk (no choices). With
        return_token_ids, the choice carries the ids of `tokens` not sent yet (as vLLM's do: the
        client concatenates them)."""
        out = {
            "id": self.request_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": []
            if delta is None
            else [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        if delta is not None and self.return_token_ids:
            new = list(tokens[self.ids_sent :]) if tokens is not None else []
            out["choices"][0]["token_ids"] = new
            self.ids_sent += len(new)
        if delta is None or self.continuous_usage:
            out["usage"] = self.usage()
        return out

    def opening(self) -> list[dict]:
        return [self.chunk({"role": "assistant", "content": ""})]

    def _extend(self, fields: dict, final: bool) -> dict:
        deltas = {}
        for key in TEXT_FIELDS:
            text, sent = fields.get(key) or "", self.sent[key]
            if not final:
                text = HELD_BACK.sub("", text)
            if not text.startswith(sent):
                if final:
                    raise StreamMismatch(
                        f"the answer's {key} does not extend what was streamed of it"
                    )
                continue  # not sent until it does
            if len(text) > len(sent):
                deltas[key], self.sent[key] = text[len(sent) :], text
        return deltas

    def update(self, tokens: list[int]) -> list[dict]:
        """Chunks for the answer generated so far: the text of all its tokens but the last."""
        self.completion_tokens = len(tokens)
        fields = self.text_of(tokens[:-1])
        deltas = self._extend(fields, final=False) if fields else {}
        if deltas:
            return [self.chunk(deltas, tokens=tokens)]
        # the tokens still count
        return [self.chunk({}, tokens=tokens)] if self.continuous_usage else []

    def end(self, tokens: list[int], message: dict, finish: str) -> list[dict]:
        """The last chunks: the rest of the whole answer's text, its tool calls, the finish reason,
        the usage; StreamMismatch where its text does not extend what was sent."""
        self.completion_tokens = len(tokens)
        deltas = self._extend(message, final=True)
        out = [self.chunk(deltas)] if deltas else []
        if message.get("tool_calls"):
            calls = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
            out.append(self.chunk({"tool_calls": calls}))
        out.append(self.chunk({}, finish, tokens=tokens))  # the ids left, the end token included
        return out + ([self.chunk(None)] if self.include_usage else [])


def sse(chunks: list[dict]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)


# ---- the server -------------------------------------------------------------------------------


class BatchServer:
    def __init__(
        self,
        model_dir: str,
        served_name: str,
        batch: BatchSettings,
        stats_file: Path | None,
        trust_remote_code: bool = False,
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.served_name, self.max_batch = served_name, batch.max_batch
        self.gather_s = batch.gather_ms / 1000
        self.tie_tolerance, self.stats_file = batch.tie_tolerance, stats_file
        self.tokenizer = AutoTokenizer.from_pretrained(
            model_dir, trust_remote_code=trust_remote_code
        )
        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, trust_remote_code=trust_remote_code
        ).eval()
        if (
            torch.cuda.is_available()
        ):  # a small target on one GPU; float32 keeps it the reference decode
            self.model.to("cuda")
        if not self.model._supports_default_dynamic_cache():
            raise BatchServerError(
                f"{model_dir}: regenerate.backend hf decodes on transformers' DynamicCache, which this "
                "model does not use; serve it with backend transformers, vllm or sglang"
            )
        eos = self.model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos] if eos is not None else []
        self.eos_ids = {e for e in [*eos, self.tokenizer.eos_token_id] if e is not None}
        if not self.eos_ids:
            raise BatchServerError(
                f"{model_dir}: neither the tokenizer nor the generation config names an end token"
            )
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids)
        self.queue: queue.Queue[Request] = queue.Queue()
        # answers whose stream went wrong (StreamMismatch), kept for the client's retry
        self.kept: OrderedDict[tuple, list[int]] = OrderedDict()
        self.stats = Stats()
        self.stats_written = 0.0
        self.write_stats()
        threading.Thread(target=self.inference_loop, daemon=True, name="batch-decode").start()

    def write_stats(self) -> None:
        self.stats_written = time.monotonic()
        if self.stats_file is not None:
            tmp = self.stats_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.stats.as_dict()))
            tmp.replace(self.stats_file)

    # ---- inference thread

    def take(self, running: int, can_join: bool) -> list[Request]:
        """Waiting requests to start: up to max_batch in all; with none running, blocks for the first
        and gathers for gather_s; a request whose client went away is not started."""
        room = self.max_batch - running
        if room <= 0 or not can_join:
            return []
        taken = [] if running else [self.queue.get()]
        deadline = time.monotonic() + (0.0 if running else self.gather_s)
        while len(taken) < room:
            try:
                taken.append(self.queue.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
        live = [r for r in taken if not r.cancelled]
        self.stats.cancelled += len(taken) - len(live)
        return live

    def inference_loop(self) -> None:
        batch = GreedyBatch(self.model, self.pad_id, self.eos_ids, self.tie_tolerance)
        while True:
            new = self.take(len(batch), batch.can_join())
            start = time.perf_counter()
            try:
                if new:
                    batch.join([Row(r.prompt_ids, r.max_tokens, r) for r in new])
                    self.stats.prefills += 1
                if len(batch):
                    batch.pick()
                    events, going_on = self.hand_out(batch)
                    deliver(events)
                    batch.keep(going_on)
                if len(batch):
                    batch.step()
            except Exception as err:  # noqa: BLE001 - every request of the batch gets the error
                failed = {id(r.request): r.request for r in batch.rows}
                failed.update({id(r): r for r in new})
                deliver([(r, err) for r in failed.values()])
                batch = GreedyBatch(self.model, self.pad_id, self.eos_ids, self.tie_tolerance)
            self.stats.generate_seconds += time.perf_counter() - start
            if not len(batch) or time.monotonic() - self.stats_written > 1.0:
                self.write_stats()

    def hand_out(self, batch: GreedyBatch) -> tuple[list[tuple[Request, object]], list[int]]:
        """Each row's new token for its request (and Finished for those that ended); the indices
        of the rows that go on."""
        self.stats.steps += 1
        self.stats.row_steps += len(batch)
        self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
        events, going_on = [], []
        for i, row in enumerate(batch.rows):
            request = row.request
            if request.cancelled:
                self.stats.cancelled += 1
                continue
            events.append((request, row.tokens[-1]))
            if not batch.done(row):
                going_on.append(i)
                continue
            events.append((request, Finished(row.ties)))
            self.stats.requests += 1
            self.stats.completion_tokens += len(row.tokens)
            self.stats.near_tie_tokens += row.ties
            self.stats.near_tie_requests += bool(row.ties)
        return events, going_on

    # ---- HTTP

    def message(
        self, request_id: str, prompt_ids: list[int], tokens: list[int], max_tokens: int
    ) -> tuple[dict, str]:
        reader = AnswerReader(self.tokenizer, self.model, self.eos_ids)
        return assistant_message(reader, request_id, prompt_ids, tokens, max_tokens)

    def completion(
        self,
        request_id: str,
        prompt_ids: list[int],
        tokens: list[int],
        max_tokens: int,
        return_token_ids: bool = False,
    ) -> dict:
        message, finish = self.message(request_id, prompt_ids, tokens, max_tokens)
        choice = {"index": 0, "message": message, "finish_reason": finish}
        if return_token_ids:  # vLLM's field: every generated id, the end token included
            choice["token_ids"] = list(tokens)
        return {
            "id": request_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.served_name,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(tokens),
                "total_tokens": len(prompt_ids) + len(tokens),
            },
        }

    async def chat_completions(self, request):
        from aiohttp import web

        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": {"message": "body is not JSON"}}, status=400)
        if body.get("model") not in (None, self.served_name):
            return web.json_response(
                {
                    "error": {
                        "message": f"this server runs {self.served_name!r}, "
                        f"not {body.get('model')!r}"
                    }
                },
                status=400,
            )
        if (body.get("temperature") or 0) > 0:
            return web.json_response(
                {
                    "error": {
                        "message": "regenerate.backend hf decodes greedily: temperature must be 0"
                    }
                },
                status=400,
            )
        messages, max_tokens = body.get("messages"), body.get("max_tokens") or 256
        if not isinstance(messages, list) or not isinstance(max_tokens, int) or max_tokens < 1:
            return web.json_response(
                {"error": {"message": "need a messages list and max_tokens >= 1"}}, status=400
            )
        try:
            prompt_ids = chat_prompt_ids(
                self.tokenizer, messages, body.get("tools"), body.get("chat_template_kwargs") or {}
            )
        except Exception as err:  # noqa: BLE001 - a template that rejects these messages
            return web.json_response(
                {"error": {"message": f"chat template: {type(err).__name__}: {err}"}}, status=400
            )
        request_id = f"chatcmpl-{uuid.uuid4().hex[:16]}"
        pending = Request(prompt_ids, max_tokens, asyncio.get_running_loop(), asyncio.Queue())
        key = (tuple(prompt_ids), max_tokens)
        kept = self.kept.pop(key, None) if body.get("stream") else None
        if kept is None:
            self.queue.put(pending)
        try:
            if body.get("stream"):
                return await self.stream(request, pending, request_id, body, kept)
            try:
                tokens = await answer_tokens(pending)
            except Exception as err:  # noqa: BLE001
                return web.json_response(
                    {"error": {"message": f"generation failed: {err}"}}, status=500
                )
            return web.json_response(
                self.completion(
                    request_id, prompt_ids, tokens, max_tokens, bool(body.get("return_token_ids"))
                )
            )
        finally:  # answered, or its client went away (the handler is cancelled): not decoded on
            pending.cancelled = True

    async def stream(
        self, request, pending: Request, request_id: str, body: dict, kept: list[int] | None
    ):
        """The answer as SSE chunks while it is generated (`kept`: already generated)."""
        from aiohttp import web

        chunks = ChunkStream(
            request_id,
            self.served_name,
            len(pending.prompt_ids),
            lambda tokens: text_fields(self.tokenizer, self.model, pending.prompt_ids, tokens),
            StreamOptions.of(body),
        )
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        try:
            await response.write(sse(chunks.opening()))
            tokens, finished = list(kept or []), kept is not None
            while not finished:
                items = [await pending.events.get()]
                while not pending.events.empty():
                    items.append(pending.events.get_nowait())
                for item in items:
                    if isinstance(item, BaseException):
                        await response.write(sse([error_chunk(f"generation failed: {item}")]))
                        return response
                    if isinstance(item, Finished):
                        finished = True
                    else:
                        tokens.append(item)
                if not finished:
                    await response.write(sse(chunks.update(tokens)))
            message, finish = self.message(
                request_id, pending.prompt_ids, tokens, pending.max_tokens
            )
            try:
                last = chunks.end(tokens, message, finish)
            except StreamMismatch as err:
                self.kept[(tuple(pending.prompt_ids), pending.max_tokens)] = tokens
                while len(self.kept) > self.max_batch:
                    self.kept.popitem(last=False)
                await response.write(sse([error_chunk(f"{err}; retry: the answer is kept")]))
                return response
            await response.write(sse(last) + b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionResetError:  # the client closed the stream
            pass
        return response

    def prompt_logprobs(self, ids: list[int], k: int) -> list[dict | None]:
        """vLLM's `prompt_logprobs` of `ids` teacher-forced: per position after the first, the
        logprob and rank of the token there and of the k most likely ({token id: {...}})."""
        import torch

        device = next(self.model.parameters()).device
        with torch.no_grad():
            logits = self.model(torch.tensor([ids], device=device)).logits[0].float()
        dists = torch.log_softmax(logits, dim=-1)[:-1].cpu()
        out: list[dict | None] = [None]
        for t, dist in enumerate(dists, start=1):
            top = torch.topk(dist, k)
            picked = {int(i): float(v) for i, v in zip(top.indices, top.values)}
            picked.setdefault(ids[t], float(dist[ids[t]]))
            out.append(
                {
                    str(i): {"logprob": v, "rank": int((dist > v).sum()) + 1}
                    for i, v in picked.items()
                }
            )
        return out

    async def completions(self, request):
        """/v1/completions for scoring only: the prompt's token ids teacher-forced, with
        `prompt_logprobs` as vLLM gives them; nothing is generated (the regenerate stage's
        spot-check of kept answers: draftline/regenerate/spot_check.py)."""
        from aiohttp import web

        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": {"message": "body is not JSON"}}, status=400)
        ids, k = body.get("prompt"), body.get("prompt_logprobs")
        if not (isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids)):
            message = "this server's /v1/completions scores a prompt of token ids only"
            return web.json_response({"error": {"message": message}}, status=400)
        if not isinstance(k, int) or k < 1:
            message = "this server's /v1/completions only scores: give prompt_logprobs >= 1"
            return web.json_response({"error": {"message": message}}, status=400)
        scored = await asyncio.to_thread(self.prompt_logprobs, ids, k)
        choice = {"index": 0, "text": "", "finish_reason": "length", "prompt_logprobs": scored}
        return web.json_response(
            {
                "object": "text_completion",
                "model": self.served_name,
                "choices": [choice],
                "usage": {"prompt_tokens": len(ids), "completion_tokens": 0},
            }
        )

    async def models(self, request):
        from aiohttp import web

        return web.json_response(
            {"object": "list", "data": [{"id": self.served_name, "object": "model"}]}
        )

    async def health(self, request):
        from aiohttp import web

        return web.json_response({"status": "ok"})


def error_chunk(message: str) -> dict:
    return {"error": {"message": message, "type": "server_error"}}


async def answer_tokens(pending: Request) -> list[int]:
    """The whole answer's tokens, once the inference thread finished it."""
    tokens = []
    while True:
        item = await pending.events.get()
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, Finished):
            return tokens
        tokens.append(item)


def deliver(events: list[tuple[Request, object]]) -> None:
    """From the inference thread: each item to its request's queue, one wake-up per event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for request, item in events:
        by_loop.setdefault(request.loop, []).append((request, item))
    for loop, items in by_loop.items():
        loop.call_soon_threadsafe(_put_all, items)


def _put_all(items: list[tuple[Request, object]]) -> None:
    for request, item in items:
        request.events.put_nowait(item)


def make_app(server: BatchServer):
    from aiohttp import web

    app = web.Application(client_max_size=64 * 2**20)
    app.add_routes(
        [
            web.get("/health", server.health),
            web.get("/v1/models", server.models),
            web.post("/v1/chat/completions", server.chat_completions),
            web.post("/v1/completions", server.completions),
        ]
    )
    return app


@entry_point
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="greedy batched OpenAI-compatible chat server (regenerate.backend hf)"
    )
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument(
        "--served-model-name", default=None, help="default: the model path as given"
    )
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--gather-ms", type=float, default=20.0)
    parser.add_argument("--tie-tolerance", type=float, default=1e-4)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's)"
    )
    parser.add_argument("--stats-file", type=Path, default=None)
    parser.add_argument(
        "--trust-remote-code", action="store_true", help="the target ships its own model code"
    )
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from aiohttp import web

    server = BatchServer(
        args.model,
        args.served_model_name or args.model,
        BatchSettings(args.max_batch, args.gather_ms, args.tie_tolerance),
        args.stats_file,
        args.trust_remote_code,
    )
    web.run_app(  # a client that goes away cancels its handler: its request leaves the batch
        make_app(server),
        host=args.host,
        port=args.port,
        print=log.info,
        access_log=None,
        handler_cancellation=True,
    )


if __name__ == "__main__":
    main()
