"""A small OpenAI-compatible chat server that decodes greedily in batches: `regenerate.backend: hf`.

    python -m draftline.batch_server MODEL_DIR --port 8011 [--max-batch 32] [--stats-file F]

On CPU, `transformers serve` answers one request at a time, so the regenerate stage ran at a tenth
of what a batched `generate` of the same model does, and at a fifth with its continuous batching
(overhead/regen_throughput.py). This server keeps the stage's client, records, resume and
failure handling exactly as they are (it is one more OpenAI-compatible endpoint) and runs the
requests in flight together: one inference thread takes every waiting request (up to --max-batch,
after a --gather-ms pause for stragglers), left-pads them and runs one `model.generate`
(float32, do_sample=False), then answers each request whole (no stream; the client reads a
plain JSON answer). Prompts are rendered as the client counts them (`chat_prompt_ids`); answers
are decoded and parsed (content, reasoning, tool calls) by transformers serve's own
`parse_assistant_message`, so the records look as they would from `transformers serve`.

Greedy only: a request with temperature > 0 is refused (HTTP 400). Padding changes float
rounding a little, so where the top two logits are within --tie-tolerance the batched argmax may
differ from a batch-1 decode. The server cannot afford that decode for every request; it counts
what it can see: the positions of each request's own answer (up to its end token and its own
max_tokens, not the batch's longest) whose top-two margin is below the tolerance, each a place
where its answer may have flipped (`near_tie_tokens`, `near_tie_requests` and their share in the
stats file, which the stage copies into its report).

Endpoints: GET /health, GET /v1/models, POST /v1/chat/completions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Pending:
    prompt_ids: list[int]
    max_tokens: int
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


@dataclass
class Stats:
    requests: int = 0
    batches: int = 0
    completion_tokens: int = 0
    near_tie_tokens: int = 0
    largest_batch: int = 0
    generate_seconds: float = 0.0
    near_tie_requests: int = 0  # requests with a near-tie within their own answer
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "requests": self.requests,
            "batches": self.batches,
            "mean_batch": round(self.requests / self.batches, 2) if self.batches else 0,
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


def own_answer(
    row: list[int], margins: list[float], max_tokens: int, eos_ids: set[int], tie_tolerance: float
) -> tuple[list[int], int]:
    """One request's answer out of its row of a batched decode (which runs to the longest
    request's max_tokens, past each row's end), and the near-ties within that answer: positions
    whose top-two margin is below tie_tolerance, up to and including its first end token and at
    most its own max_tokens: past that cut are tokens the request never returns."""
    end = next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))
    end = min(end, max_tokens)
    return row[:end], sum(m < tie_tolerance for m in margins[:end])


def decode_batch(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    pad_id: int,
    eos_ids: set[int],
    tie_tolerance: float,
    max_tokens: list[int] | None = None,
) -> list[tuple[list[int], int]]:
    """Greedy answers of left-padded prompts: per prompt (generated ids up to and including the first
    end token and at most its max_tokens (default max_new_tokens), near-tie count among them:
    own_answer)."""
    import torch

    width = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor(
        [[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device
    )
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            pad_token_id=pad_id,
            eos_token_id=sorted(eos_ids),
            output_scores=True,
            return_dict_in_generate=True,
        )
    generated = out.sequences[:, width:].tolist()
    margins = [[] for _ in prompts]
    if out.scores:
        top2 = torch.stack(
            [s.float().topk(2, dim=-1).values for s in out.scores], dim=1
        )  # (B, steps, 2)
        margins = (top2[..., 0] - top2[..., 1]).tolist()  # (B, steps)
    cuts = max_tokens or [max_new_tokens] * len(prompts)
    return [
        own_answer(tokens, row_margins, cut, eos_ids, tie_tolerance)
        for tokens, row_margins, cut in zip(generated, margins, cuts)
    ]


class BatchServer:
    def __init__(
        self,
        model_dir: str,
        served_name: str,
        max_batch: int,
        gather_s: float,
        tie_tolerance: float,
        stats_file: Path | None,
        trust_remote_code: bool = False,
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.served_name, self.max_batch, self.gather_s = served_name, max_batch, gather_s
        self.tie_tolerance, self.stats_file = tie_tolerance, stats_file
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
        eos = self.model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos] if eos is not None else []
        self.eos_ids = {e for e in [*eos, self.tokenizer.eos_token_id] if e is not None}
        if not self.eos_ids:
            raise SystemExit(
                f"{model_dir}: neither the tokenizer nor the generation config names an end token"
            )
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids)
        self.queue: queue.Queue[Pending] = queue.Queue()
        self.stats = Stats()
        self.write_stats()
        threading.Thread(target=self.inference_loop, daemon=True, name="batch-decode").start()

    def write_stats(self) -> None:
        if self.stats_file is not None:
            tmp = self.stats_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.stats.as_dict()))
            tmp.replace(self.stats_file)

    # ---- inference thread

    def take_batch(self) -> list[Pending]:
        batch = [self.queue.get()]
        deadline = time.monotonic() + self.gather_s
        while len(batch) < self.max_batch:
            try:
                batch.append(self.queue.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
        return batch

    def inference_loop(self) -> None:
        while True:
            batch = self.take_batch()
            start = time.perf_counter()
            try:
                answers = decode_batch(
                    self.model,
                    [p.prompt_ids for p in batch],
                    max(p.max_tokens for p in batch),
                    self.pad_id,
                    self.eos_ids,
                    self.tie_tolerance,
                    # each request's near-ties are counted within its own cut
                    max_tokens=[p.max_tokens for p in batch],
                )
            except Exception as err:  # noqa: BLE001 - every waiting request gets the error (HTTP 500)
                for p in batch:
                    p.loop.call_soon_threadsafe(_set, p.future, err)
                continue
            self.stats.generate_seconds += time.perf_counter() - start
            self.stats.batches += 1
            self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
            for p, (tokens, ties) in zip(batch, answers):
                tokens = tokens[: p.max_tokens]  # the batch ran to its longest request's max_tokens
                self.stats.requests += 1
                self.stats.completion_tokens += len(tokens)
                self.stats.near_tie_tokens += ties
                self.stats.near_tie_requests += bool(ties)
                p.loop.call_soon_threadsafe(_set, p.future, tokens)
            self.write_stats()

    # ---- HTTP

    def completion(
        self, request_id: str, prompt_ids: list[int], tokens: list[int], max_tokens: int
    ) -> dict:
        from transformers.cli.serving.utils import parse_assistant_message

        cleaned = self.tokenizer.decode(tokens, skip_special_tokens=True)
        content, reasoning, calls = parse_assistant_message(
            self.tokenizer, self.model, tokens, input_ids=prompt_ids, cleaned_content=cleaned
        )
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
        elif tokens and tokens[-1] in self.eos_ids:
            finish = "stop"
        else:
            finish = "length" if len(tokens) >= max_tokens else "stop"
        return {
            "id": request_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.served_name,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(tokens),
                "total_tokens": len(prompt_ids) + len(tokens),
            },
        }

    async def chat_completions(self, request):
        from aiohttp import web

        from draftline.chat import chat_prompt_ids

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
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.queue.put(Pending(prompt_ids, max_tokens, future, loop))
        try:
            tokens = await future
        except Exception as err:  # noqa: BLE001
            return web.json_response(
                {"error": {"message": f"generation failed: {err}"}}, status=500
            )
        return web.json_response(
            self.completion(f"chatcmpl-{uuid.uuid4().hex[:16]}", prompt_ids, tokens, max_tokens)
        )

    async def models(self, request):
        from aiohttp import web

        return web.json_response(
            {"object": "list", "data": [{"id": self.served_name, "object": "model"}]}
        )

    async def health(self, request):
        from aiohttp import web

        return web.json_response({"status": "ok"})


def _set(future: asyncio.Future, value) -> None:
    if future.done():  # the client went away
        return
    if isinstance(value, BaseException):
        future.set_exception(value)
    else:
        future.set_result(value)


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
        args.max_batch,
        args.gather_ms / 1000,
        args.tie_tolerance,
        args.stats_file,
        args.trust_remote_code,
    )
    app = web.Application(client_max_size=64 * 2**20)
    app.add_routes(
        [
            web.get("/health", server.health),
            web.get("/v1/models", server.models),
            web.post("/v1/chat/completions", server.chat_completions),
        ]
    )
    web.run_app(
        app, host=args.host, port=args.port, print=lambda *a: print(*a, flush=True), access_log=None
    )


if __name__ == "__main__":
    main()
