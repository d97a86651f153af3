"""What the regeneration tests share: the stage run in a scratch directory, prompts, free ports,
fault injection in front of a real server, and stubs of vLLM's wire format (ScriptedEngine), with
the fixtures on them (chatty_target, served_chatty, stub: assign them in a module to use them)."""

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from stubs import StubHandler

from draftline.core.card import TargetCard
from draftline.core.io import write_jsonl
from draftline.engines.commands import ServeSettings, transformers_serve_command
from draftline.engines.servers import ManagedServer, server_env
from draftline.regenerate.client import RetryPolicy, close_pool, open_pool
from draftline.regenerate.replay import ReplayJob, Sampling, regenerate_all
from draftline.tokens.chat import chat_prompt_ids

ROOT = Path(__file__).resolve().parents[1]


FAST_RETRY = RetryPolicy(max_retries=2, backoff_s=0.01, backoff_max_s=0.05, first_token_timeout_s=5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def prompts(n: int, seed: int = 11) -> list[dict]:
    from draftline.targets.corpus import generate_conversations

    return [
        {"id": f"p{i}", "source": "t", "partition": "long" if i % 5 == 4 else "short", **c}
        for i, c in enumerate(generate_conversations(n, seed))
    ]


@pytest.fixture(scope="module")
def chatty_target(tmp_path_factory, random_target):
    """The random target with a large end-of-turn row in lm_head: about a third of its greedy
    answers end by themselves within a few tokens, so conversations go on to later turns."""
    import torch
    from transformers import LlamaForCausalLM

    from draftline.targets.model import build_card

    path = tmp_path_factory.mktemp("chatty_target")
    shutil.copytree(random_target.model, path, dirs_exist_ok=True)
    model = LlamaForCausalLM.from_pretrained(path)
    with torch.no_grad():
        row = model.lm_head.weight[random_target.eos_token_id]
        direction = torch.randn(row.shape, generator=torch.Generator().manual_seed(1))
        model.lm_head.weight[random_target.eos_token_id] = (
            direction / direction.norm() * row.norm() * 30
        )
    model.save_pretrained(path)
    return build_card(str(path), "test", None, [1, 2, 3], {})


def stage_dir(tmp_path: Path, card: TargetCard, rows: list[dict], **regenerate) -> Path:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    # random weights answer up to max_tokens: the check on that has its own test
    # (test_answers_cut_by_max_tokens_fail_the_stage_and_stay)
    raw["regenerate"].update({"max_length_share": 1.0, **regenerate})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    card.write(tmp_path / "card.json")
    write_jsonl(tmp_path / "train.jsonl", rows)
    return tmp_path


def stage_cmd() -> list[str]:
    return [
        sys.executable,
        "-m",
        "stages.regenerate",
        "card.json",
        "train.jsonl",
        "out",
        "report.json",
    ]


def stage_env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT))


def run_stage(workdir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        stage_cmd(), cwd=workdir, env=stage_env(), capture_output=True, text=True, timeout=300
    )


def output_rows(workdir: Path) -> list[dict]:
    return [
        json.loads(line) for line in (workdir / "out/conversations.jsonl").read_text().splitlines()
    ]


# Per 20 chat requests: 10% HTTP 500, 5% 429, 5% hang past the client's timeout, 5% dropped
# connection before any answer; 5% a stream cut after its first events, 5% a stream that stops after
# its first events and hangs past the client's token timeout.
FAULT_CYCLE = {
    3: "500",
    9: "500",
    6: "429",
    13: "hang",
    17: "drop",
    11: "mid_drop",
    19: "mid_hang",
}


class Faults:
    """Shared by every proxy: the fault schedule, and a gate that holds chat requests once
    `gate_after` have been forwarded (the test then kills the stage with requests in flight)."""

    def __init__(self, upstream: str, hang_s: float):
        self.upstream, self.hang_s = upstream.split("//")[1], hang_s
        self.lock = threading.Lock()
        self.n = self.forwarded = 0
        self.injected = Counter()
        self.cut_streams = 0  # answers cut after their first streamed events
        self.gate_after: int | None = None
        self.gate = threading.Event()
        self.blocked = threading.Event()

    def next_fault(self) -> str | None:
        with self.lock:
            fault = FAULT_CYCLE.get(self.n % 20)
            self.n += 1
            self.injected[fault] += 1
            return fault


class FaultProxy(StubHandler):
    faults: Faults

    def _forward(self, body: bytes | None) -> None:
        import http.client

        conn = http.client.HTTPConnection(self.faults.upstream, timeout=60)
        conn.request(
            self.command, self.path, body=body, headers={"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        self._send(data, resp.getheader("Content-Type", "application/json"), resp.status)

    def _drop(self) -> None:
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)

    def _hang(self) -> None:
        """No more bytes until the client gives up (its timeout), at most hang_s; then drop."""
        self.connection.settimeout(self.faults.hang_s)
        with contextlib.suppress(OSError):
            self.connection.recv(1)
        self._drop()

    def _cut_stream(self, body: bytes, then) -> None:
        """The upstream answer's first events only (a stream that has begun), then `then`: a
        dropped connection or a hang mid-answer."""
        import http.client

        conn = http.client.HTTPConnection(self.faults.upstream, timeout=60)
        conn.request("POST", self.path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        events = data.split(b"\n\n")
        self.send_response(resp.status)
        self.send_header("Content-Type", resp.getheader("Content-Type", "text/event-stream"))
        self.end_headers()
        self.wfile.write(b"\n\n".join(events[:2]) + b"\n\n")  # the role chunk and a token
        self.wfile.flush()
        self.faults.cut_streams += 1
        then()

    def _error(self, status: int) -> None:
        data = json.dumps({"error": {"message": f"injected {status}", "code": status}}).encode()
        self._send(
            data, "application/json", status, {"Retry-After": "0"} if status == 429 else None
        )

    def do_GET(self):
        self._forward(None)

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path != "/v1/chat/completions":
            return self._forward(body)
        fault = self.faults.next_fault()
        if fault in ("500", "429"):
            return self._error(int(fault))
        if fault == "hang":  # no answer until the client gives up (its timeout), at most hang_s
            return self._hang()
        if fault == "drop":
            return self._drop()
        if fault == "mid_drop":
            return self._cut_stream(body, self._drop)
        if fault == "mid_hang":
            return self._cut_stream(body, self._hang)
        with self.faults.lock:
            hold = (
                self.faults.gate_after is not None
                and self.faults.forwarded >= self.faults.gate_after
            )
            self.faults.forwarded += not hold
        if hold:
            self.faults.blocked.set()
            self.faults.gate.wait()
            return self._drop()
        self._forward(body)


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # clients that went away (timeouts, the killed stage)


@pytest.fixture(scope="module")
def served_chatty(tmp_path_factory, chatty_target):
    """A real `transformers serve` on the chatty target, warmed up (its first requests are slow)."""
    import httpx

    port, log_dir = free_port(), tmp_path_factory.mktemp("served")
    url = f"http://127.0.0.1:{port}"
    cmd = transformers_serve_command(ServeSettings(chatty_target.model, "127.0.0.1", port), "cpu")
    with ManagedServer(
        cmd, server_env(log_dir / "hf"), url, log_dir / "server.log", 120
    ) as base_url:
        body = {
            "model": chatty_target.model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
        }
        for _ in range(20):
            t = time.monotonic()
            httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=60).raise_for_status()
            if time.monotonic() - t < 0.3:
                break
        yield base_url


class ScriptedEngine(StubHandler):
    """Stub of vLLM's / SGLang's wire format (GPU engines that cannot run here): /health,
    /v1/models, /metrics, /get_server_info, /tokenize and chat completions with structured
    `tool_calls` and `reasoning`; `answer(body)` scripts each reply."""

    engine = "vllm"
    speculative = False
    served = ["m"]
    tokenizer = None
    count_offset = 0
    status_for = staticmethod(lambda body: 200)
    answer = staticmethod(lambda body: {"content": "ok"})
    raw_for = staticmethod(
        lambda body: None
    )  # bytes: sent as the 200 answer instead of a chat completion
    requests: list
    auth: list  # the Authorization header of each chat request

    def do_GET(self):
        if self.path == "/health":
            return self._json({})
        if self.path == "/v1/models":
            return self._json(
                {
                    "object": "list",
                    "data": [
                        {"id": m, "object": "model", "root": "/models/x"} for m in self.served
                    ],
                }
            )
        if self.path == "/metrics" and self.engine == "vllm":
            text = (
                "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
                '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0",model_name="m"} 0.0\n'
            )
            if (
                self.speculative
            ):  # registered only with a speculative config (vllm/v1/spec_decode/metrics.py)
                text += (
                    "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.\n"
                    "# TYPE vllm:spec_decode_num_drafts_total counter\n"
                    'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 12.0\n'
                )
            return self._text(text)
        if self.path == "/get_server_info" and self.engine == "sglang":
            return self._json(
                {
                    "model_path": "/models/x",
                    "served_model_name": self.served[0],
                    "tp_size": 1,
                    "speculative_algorithm": "EAGLE3" if self.speculative else None,
                    "speculative_draft_model_path": "/models/draft" if self.speculative else None,
                    "version": "0.5.0",
                    "internal_states": [{}],
                }
            )
        self._json({"detail": "Not Found"}, 404)

    def _stream(self, message: dict, finish: str, usage: dict, token_ids=None) -> None:
        """The answer as the engines stream it: role, then text and reasoning in pieces, tool calls
        by index (id and name first, arguments in two pieces), finish_reason, then the usage chunk.
        token_ids (vLLM, asked with return_token_ids): one id on each chunk after the role's, the
        rest on the finish chunk, as vLLM sends the end-of-turn token with the finish_reason."""

        def piece(text):
            return [text[: len(text) // 2], text[len(text) // 2 :]] if text else []

        deltas = [{"role": "assistant", "content": ""}]
        reasoning_key = next(
            (k for k in ("reasoning", "reasoning_content") if message.get(k)), None
        )
        deltas += [{reasoning_key: p} for p in piece(message.get(reasoning_key) or "")]
        deltas += [{"content": p} for p in piece(message.get("content") or "")]
        for i, call in enumerate(message.get("tool_calls") or []):
            deltas.append(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": call["function"]["name"], "arguments": ""},
                        }
                    ]
                }
            )
            deltas += [
                {"tool_calls": [{"index": i, "function": {"arguments": p}}]}
                for p in piece(call["function"]["arguments"])
            ]
        chunks = [{"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
        chunks += [
            {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
            {"choices": [], "usage": usage},
        ]
        if token_ids is not None:
            chunks[0]["prompt_token_ids"] = [1, 2, 3]  # vLLM: the prompt's ids, first chunk only
            ids = list(token_ids)
            for chunk in chunks[1:-2]:
                chunk["choices"][0]["token_ids"] = ids[:1]
                ids = ids[1:]
            chunks[-2]["choices"][0]["token_ids"] = ids
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(
            b"".join(
                b"data: "
                + json.dumps({"id": "x", "object": "chat.completion.chunk", **c}).encode()
                + b"\n\n"
                for c in chunks
            )
            + b"data: [DONE]\n\n"
        )

    def _count(self, body) -> list[int]:
        ids = chat_prompt_ids(
            self.tokenizer,
            body["messages"],
            body.get("tools"),
            body.get("chat_template_kwargs") or {},
        )
        return ids + [0] * self.count_offset

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize" and self.engine == "vllm":
            ids = self._count(body)
            return self._json({"count": len(ids), "max_model_len": 4096, "tokens": ids})
        self.requests.append(body)
        self.auth.append(self.headers.get("Authorization"))
        status = self.status_for(body)
        if status != 200:
            return self._json({"object": "error", "message": "scripted", "code": status}, status)
        if body["model"] not in self.served:
            return self._json(
                {"object": "error", "message": f"The model `{body['model']}` does not exist."}, 404
            )
        raw = self.raw_for(body)
        if raw is not None:
            return self._send(raw, "application/json")
        reply = self.answer(body)
        message = {"role": "assistant", "content": reply.get("content")}
        if reply.get("reasoning"):
            message["reasoning" if self.engine == "vllm" else "reasoning_content"] = reply[
                "reasoning"
            ]
        if reply.get("tool_calls"):
            message["tool_calls"] = [
                {
                    "id": f"call_{name}_{len(self.requests)}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
                for name, args in reply["tool_calls"]
            ]
        prompt = len(self._count(body)) if self.tokenizer else 5
        usage = {"prompt_tokens": prompt, "completion_tokens": 3, "total_tokens": prompt + 3}
        finish = "tool_calls" if reply.get("tool_calls") else reply.get("finish", "stop")
        # reply["token_ids"]: what the model generated; sent when asked, by vLLM per streamed
        # chunk, by SGLang only in a whole answer
        token_ids = reply.get("token_ids") if body.get("return_token_ids") else None
        if body.get("stream"):
            return self._stream(
                message, finish, usage, token_ids if self.engine == "vllm" else None
            )
        self._json(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": "tool_calls"
                        if reply.get("tool_calls")
                        else reply.get("finish", "stop"),
                        **({"token_ids": token_ids} if token_ids is not None else {}),
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": 3,
                    "total_tokens": prompt + 3,
                },
            }
        )


@pytest.fixture
def stub():
    servers = []

    def start(**attrs) -> tuple[str, type]:
        attrs = {
            k: staticmethod(v) if k in ("answer", "status_for", "raw_for") else v
            for k, v in attrs.items()
        }
        handler = type("Stub", (ScriptedEngine,), {"requests": [], "auth": [], **attrs})
        server = QuietServer(("127.0.0.1", 0), handler)
        threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}", handler

    yield start
    for server in servers:
        server.shutdown()


def run_rows(
    urls,
    rows,
    tmp_path,
    sampling=None,
    policy=FAST_RETRY,
    partitions=None,
    count_ids=None,
    max_failures=None,
    api_key=None,
    slots=None,
    extra_body=None,
):
    async def go():
        pool = open_pool(urls, api_key, slots=slots)
        try:
            job = ReplayJob(
                "m",
                sampling or Sampling(8, 0.0, 1.0, 0),
                policy,
                partitions or {"short": (4, None), "long": (1, None)},
                {"fingerprint": "f"},
                count_ids,
                max_failures,
                extra_body=extra_body,
            )
            return await regenerate_all(
                pool, job, rows, tmp_path / "c.jsonl", tmp_path / "f.jsonl"
            ), pool
        finally:
            await close_pool(pool)

    tally, pool = asyncio.run(go())
    out = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    failures = [json.loads(line) for line in (tmp_path / "f.jsonl").read_text().splitlines()]
    return tally, out, failures, pool
