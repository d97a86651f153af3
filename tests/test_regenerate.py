"""Regeneration: a real `transformers serve` launched by the stage; fault injection through a local
proxy in front of a real server, SIGKILL mid-run and rerun; vLLM/SGLang launch commands against
their documented flags; the preflight and structured replies against stubs of their wire format."""

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
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

from draftline.card import TargetCard
from draftline.chat import chat_prompt_ids
from draftline.commands import (
    sglang_regenerate_command,
    transformers_serve_command,
    vllm_regenerate_command,
)
from draftline.config import ParamsError, parse_params
from draftline.conversation_index import entry as index_entry
from draftline.conversation_index import index_path, read_index
from draftline.conversation_store import Wanted, load_finished, prompt_sha256
from draftline.io import read_json, write_jsonl
from draftline.openai_client import Endpoint, EndpointPool, RetryPolicy, close_pool, open_pool
from draftline.preflight import PreflightError, preflight_regeneration
from draftline.regeneration import Sampling, called_tools, regenerate_all, relink_tool_results
from draftline.regeneration_run import engine_request_fields
from draftline.servers import ManagedServer, server_env, server_url

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
    from draftline.corpus import generate_conversations

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

    from draftline.target import build_card

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


# ---- a real transformers serve, launched by the stage ------------------------------------------


def test_stage_launches_transformers_serve(tmp_path, chatty_target):
    port = free_port()
    rows = prompts(6)
    workdir = stage_dir(
        tmp_path,
        chatty_target,
        rows,
        backend="transformers",
        port=port,
        max_tokens=8,
        short={"concurrency": 2, "max_context": None},
    )
    proc = run_stage(workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]

    done = output_rows(workdir)
    assert sorted(r["id"] for r in done) == sorted(r["id"] for r in rows)
    by_id = {r["id"]: r for r in rows}
    for r in done:
        assert r["messages"][-1]["role"] == "assistant"
        assert r["regeneration"]["prompt_sha256"] == prompt_sha256(by_id[r["id"]])
        first_prompt = by_id[r["id"]]["messages"][
            : next(i for i, m in enumerate(by_id[r["id"]]["messages"]) if m["role"] == "assistant")
        ]
        assert r["messages"][: len(first_prompt)] == first_prompt  # system/user turns kept verbatim
    report = read_json(workdir / "report.json")
    assert (
        report["ok"] == report["sent"] == report["conversations"] == 6
        and report["failed"] == report["missing"] == 0
    )
    assert report["requests"] == sum(report["finish_reasons"].values()) >= 6
    assert report["partitions"]["short"]["ok"] + report["partitions"]["long"]["ok"] == 6
    assert report["completion_tokens"] > 0 and report["prompt_tokens"] > 0
    # the preflight's token count of the probe matched the target's chat template on the real server
    (seen,) = report["endpoints"]
    assert seen["engine"] == "transformers" and seen["probe_prompt_tokens"] > 10
    assert (
        read_json(workdir / "out/meta.json")["fingerprint"]
        == done[0]["regeneration"]["fingerprint"]
    )
    # the server was stopped: port closed, pid file gone, its log kept
    assert not port_open(port) and not (workdir / "out/server.pid").exists()
    assert "chat/completions" in (workdir / "out/server.log").read_text()

    # nothing missing: a rerun sends nothing and starts no server
    proc = run_stage(workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rerun = read_json(workdir / "report.json")
    assert (
        rerun["sent"] == 0
        and rerun["reused"] == 6
        and rerun["endpoints"] == []
        and len(output_rows(workdir)) == 6
    )


# ---- fault injection: proxy in front of a real server, SIGKILL, rerun --------------------------

# Per 20 chat requests: 10% HTTP 500, 5% 429, 5% hang past the client's timeout, 5% dropped connection.
FAULT_CYCLE = {3: "500", 9: "500", 6: "429", 13: "hang", 17: "drop"}


class Faults:
    """Shared by every proxy: the fault schedule, and a gate that holds chat requests once
    `gate_after` have been forwarded (the test then kills the stage with requests in flight)."""

    def __init__(self, upstream: str, hang_s: float):
        self.upstream, self.hang_s = upstream.split("//")[1], hang_s
        self.lock = threading.Lock()
        self.n = self.forwarded = 0
        self.injected = Counter()
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
            self.connection.settimeout(self.faults.hang_s)
            with contextlib.suppress(OSError):
                self.connection.recv(1)
            return self._drop()
        if fault == "drop":
            return self._drop()
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


def start_proxy(faults: Faults) -> QuietServer:
    handler = type("Proxy", (FaultProxy,), {"faults": faults})
    server = QuietServer(("127.0.0.1", 0), handler)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    return server


@pytest.fixture(scope="module")
def served_chatty(tmp_path_factory, chatty_target):
    """A real `transformers serve` on the chatty target, warmed up (its first requests are slow)."""
    import httpx

    port, log_dir = free_port(), tmp_path_factory.mktemp("served")
    url = f"http://127.0.0.1:{port}"
    cmd = transformers_serve_command(chatty_target.model, "127.0.0.1", port, "cpu", False, 16, [])
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


def test_faults_sigkill_and_rerun_lose_nothing_duplicate_nothing(
    tmp_path, chatty_target, served_chatty
):
    faults = Faults(served_chatty, hang_s=10.0)
    proxies = [start_proxy(faults) for _ in range(2)]
    try:
        rows = prompts(30)
        endpoints = [f"http://127.0.0.1:{p.server_port}" for p in proxies]
        workdir = stage_dir(
            tmp_path,
            chatty_target,
            rows[:24],
            backend="external",
            endpoints=endpoints,
            external_engine="transformers",
            max_tokens=8,
            first_token_timeout_s=4.0,
            token_timeout_s=4.0,
            max_retries=8,
            retry_backoff_s=0.05,
            retry_backoff_max_s=0.5,
            # the server answers one request at a time: more in flight only queue up
            short={"concurrency": 2, "max_context": None},
            long={"concurrency": 1, "max_context": 1024},
        )
        faults.gate_after = 8
        proc = subprocess.Popen(
            stage_cmd(),
            cwd=workdir,
            env=stage_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            assert faults.blocked.wait(120), "the stage never reached the gate"
            out = workdir / "out/conversations.jsonl"
            deadline, last, still = time.monotonic() + 30, -1, 0
            while (
                time.monotonic() < deadline and still < 6
            ):  # written lines settle, requests stay held
                size = out.stat().st_size if out.exists() else 0
                still = still + 1 if size == last and size else 0
                last = size
                time.sleep(0.05)
            os.kill(proc.pid, signal.SIGKILL)  # with requests in flight, held at the gate
        finally:
            proc.kill()
            proc.wait()
        before = [
            json.loads(line) for line in out.read_text().splitlines()
        ]  # every written line is whole
        assert 0 < len(before) < 24
        with open(out, "a") as f:
            f.write(
                '{"id": "p23", "messages": [{"role": "us'
            )  # a line cut by a kill, for good measure

        faults.gate_after = None
        faults.gate.set()
        write_jsonl(workdir / "train.jsonl", rows)  # `samples` grew from 24 to 30 meanwhile
        proc = run_stage(workdir)
        assert proc.returncode == 0, proc.stderr[-3000:]
    finally:
        faults.gate.set()
        for p in proxies:
            p.shutdown()

    done = output_rows(workdir)
    ids = [r["id"] for r in done]
    assert len(ids) == len(set(ids)) == 30 and set(ids) == {r["id"] for r in rows}
    assert done[: len(before)] == before  # kept as written, the new ones appended
    report = read_json(workdir / "report.json")
    assert report["reused"] == len(before) and report["resume"]["bad_lines"] == 1
    assert report["sent"] == report["ok"] == 30 - len(before) and report["failed"] == 0
    assert report["conversations"] == 30 and report["missing"] == 0
    assert sum(report["stopped"].values()) == report["ok"]
    assert (workdir / "out/failures.jsonl").read_text() == ""
    # every kind of fault hit the rerun and was retried
    assert {"http_500", "http_429", "first_token_timeout", "connection"} <= set(
        report["retries"]
    ), report["retries"]
    # answers that ended by themselves led to later turns, replayed on the model's own answers
    multi = [r for r in done if sum(m["role"] == "assistant" for m in r["messages"]) > 1]
    assert multi and all(r["regeneration"]["finish_reasons"][0] == "stop" for r in multi)


# ---- failures, retries, balancing --------------------------------------------------------------


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
            return await regenerate_all(
                pool,
                "m",
                rows,
                sampling or Sampling(8, 0.0, 1.0, 0),
                policy,
                partitions or {"short": (4, None), "long": (1, None)},
                tmp_path / "c.jsonl",
                tmp_path / "f.jsonl",
                {"fingerprint": "f"},
                count_ids,
                max_failures,
                extra_body=extra_body,
            ), pool
        finally:
            await close_pool(pool)

    tally, pool = asyncio.run(go())
    out = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    failures = [json.loads(line) for line in (tmp_path / "f.jsonl").read_text().splitlines()]
    return tally, out, failures, pool


def test_failures_are_recorded_with_reasons_and_retried(tmp_path, stub):
    weather = lambda body: "weather" in json.dumps(body["messages"])  # noqa: E731
    url, handler = stub(
        status_for=lambda body: (
            500 if weather(body) else (400 if "colour" in json.dumps(body["messages"]) else 200)
        )
    )
    rows = prompts(30)
    tally, out, failures, _ = run_rows([url], rows, tmp_path)
    by_reason = {f["id"]: f for f in failures}
    for row in rows:
        text = json.dumps(row["messages"][:2])
        if weather({"messages": row["messages"][:2]}):
            assert (
                by_reason[row["id"]]["reason"] == "http_500"
                and by_reason[row["id"]]["attempts"] == 3
            )  # retried
        elif "colour" in text:
            assert (
                by_reason[row["id"]]["reason"] == "http_400"
                and by_reason[row["id"]]["attempts"] == 1
            )  # not retried
    assert len(failures) == tally.failed == len({f["id"] for f in failures}) > 0
    assert tally.ok == len(out) == len(rows) - tally.failed
    assert tally.retries["http_500"] == 2 * tally.failure_reasons["http_500"]


BROKEN_ANSWERS = {  # a word of the prompt -> what the server answers, and the failure it is
    "weather": (b'{"choices": [{"message": {"content": "cut', "bad_response"),  # not JSON
    "colour": (b'{"object": "error"}', "bad_response"),  # no choices
    "minus": (b'{"choices": []}', "empty_response"),
    "Compute": (
        b'{"choices": [{"message": {"content": "x", "tool_calls": [{"id": "c", "function": {}}]}}]}',
        "bad_response",
    ),
    "add": (b'{"choices": [{"message": {"content": 7}}]}', "bad_response"),
    "plus": (b"[1, 2]", "bad_response"),
}


def test_answers_that_are_not_chat_completions_fail_their_conversation_only(tmp_path, stub):
    def broken(messages):  # the first answer of a conversation decides: it fails there
        text = json.dumps(
            messages[: next(i for i, m in enumerate(messages) if m["role"] == "assistant")]
        )
        return next(
            (answer for word, answer in BROKEN_ANSWERS.items() if word in text), (None, None)
        )

    url, _ = stub(raw_for=lambda body: broken(body["messages"] + [{"role": "assistant"}])[0])
    rows = prompts(60)
    tally, out, failures, _ = run_rows([url], rows, tmp_path)
    expected = {row["id"]: broken(row["messages"])[1] for row in rows if broken(row["messages"])[1]}
    assert {f["id"]: f["reason"] for f in failures} == expected and set(expected.values()) == {
        "bad_response",
        "empty_response",
    }
    assert all(
        f["attempts"] == 3 for f in failures
    )  # retried: a server can send a broken answer once
    assert tally.ok == len(out) == len(rows) - len(expected) > 0
    assert all(
        m["content"] == "ok" for row in out for m in row["messages"] if m["role"] == "assistant"
    )


def test_the_api_key_goes_with_every_request(tmp_path, stub):
    url, handler = stub()
    tally, out, _, _ = run_rows([url], prompts(12), tmp_path, api_key="sk-test-123")
    assert tally.ok == 12 and len(handler.auth) == tally.requests > 0
    assert set(handler.auth) == {"Bearer sk-test-123"}


def test_too_many_failures_stop_the_run_early(tmp_path, stub):
    url, handler = stub(status_for=lambda body: 503)
    tally, out, failures, _ = run_rows(
        [url],
        prompts(40),
        tmp_path,
        partitions={"short": (1, None), "long": (1, None)},
        max_failures=3,
    )
    assert tally.aborted and tally.failed == len(failures) < 10 and not out


def test_endpoints_balanced_by_outstanding_requests():
    a, b, c = (Endpoint(u, None) for u in "abc")
    pool = EndpointPool([a, b, c])
    picked = [pool.acquire() for _ in range(3)]
    assert {e.url for e in picked} == {"a", "b", "c"}  # one each while all are equally busy
    pool.release(b)
    assert pool.acquire() is b  # the least outstanding
    pool.release(a, failed_for_s=60)
    pool.release(c)
    assert pool.acquire() is c  # a rests after its failure although it has fewer outstanding
    a.resting_until = b.resting_until = c.resting_until = time.monotonic() + 60
    assert pool.acquire() is a  # all resting: the least busy anyway


def test_two_endpoints_share_the_work(tmp_path, stub):
    (u1, h1), (u2, h2) = stub(), stub()
    tally, out, _, pool = run_rows([u1, u2], prompts(24), tmp_path)
    assert tally.ok == 24 and len(h1.requests) > 4 and len(h2.requests) > 4
    assert sum(e.requests for e in pool.endpoints) == tally.requests


# ---- a slow server that runs one request at a time (transformers serve on a small CPU) -----------


class OneAtATimeEngine(ScriptedEngine):
    """transformers serve's streaming as it behaves on CPU: headers and the role chunk at once, then
    the request waits for the one inference thread; each token is one SSE chunk after `token_s`, and
    a client that went away is noticed before the next token and its generation stopped.

    It records what the server saw: `most_at_once` (requests holding or waiting for the thread),
    `handling` (requests being handled now),
    `cancelled` (prompts of requests stopped because the client closed the stream), `wasted`
    (answers generated to the end for a client that had gone), and `stall(body)` scripts a request
    that goes silent after `stall(body)` tokens (None: no stall) until its client closes it."""

    engine = "transformers"
    token_s = 0.002
    tokens = 4
    stall = staticmethod(lambda body: None)
    hold = None  # a threading.Event: the first streamed request waits for it before its first token
    thread = threading.Lock()
    state: dict  # at_once, most_at_once, cancelled, wasted, streams

    def _client_gone(self) -> bool:
        import select

        readable, _, _ = select.select([self.connection], [], [], 0)
        if not readable:
            return False
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _sse(self, delta: dict, finish=None, usage=None) -> None:
        chunk = {
            "id": "x",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        if usage:
            chunk["usage"] = usage
        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.flush()

    def do_POST(self):
        with self.state["lock"]:
            self.state["handling"] += 1
        try:
            self._post()
        finally:
            with self.state["lock"]:
                self.state["handling"] -= 1

    def _post(self):
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        body = json.loads(raw)
        if not body.get("stream"):
            self.rfile = __import__("io").BytesIO(raw)
            self.headers.replace_header("Content-Length", str(len(raw)))
            return super().do_POST()
        self.requests.append(body)
        status = self.status_for(body)
        if status != 200:
            return self._json({"object": "error", "message": "scripted", "code": status}, status)
        state = self.state
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self._sse({"role": "assistant", "content": ""})
        except OSError:  # the client closed it already
            state["cancelled"].append(json.dumps(body["messages"][:2]))
            return
        with self.thread:  # counted while holding or waiting: requests at the server
            pass
        with state["lock"]:
            state["at_once"] += 1
            state["most_at_once"] = max(state["most_at_once"], state["at_once"])
            state["streams"] += 1
            first = state["streams"] == 1
        try:
            with self.thread:
                if first and self.hold is not None:
                    self.hold.wait(60)
                self._generate(body)
        finally:
            with state["lock"]:
                state["at_once"] -= 1

    def _generate(self, body) -> None:
        stall_after = self.stall(body)
        prompt = json.dumps(body["messages"][:2])
        for i in range(self.tokens):
            if self._client_gone():
                self.state["cancelled"].append(prompt)
                return
            if stall_after is not None and i == stall_after:
                for _ in range(3000):  # silent until the client closes the stream (at most 30 s)
                    if self._client_gone():
                        self.state["cancelled"].append(prompt)
                        return
                    time.sleep(0.01)
                self.state["wasted"] += 1
                return
            time.sleep(self.token_s)
            self._sse({"content": f"t{i} "})
        usage = {
            "prompt_tokens": 5,
            "completion_tokens": self.tokens,
            "total_tokens": 5 + self.tokens,
        }
        try:
            self._sse({}, "stop", usage)
        except OSError:
            self.state["wasted"] += 1


@pytest.fixture
def slow_server():
    servers = []

    def start(**attrs):
        attrs = {
            k: staticmethod(v) if k in ("stall", "status_for", "answer") else v
            for k, v in attrs.items()
        }
        state = {
            "lock": threading.Lock(),
            "at_once": 0,
            "most_at_once": 0,
            "cancelled": [],
            "wasted": 0,
            "streams": 0,
            "handling": 0,
        }
        handler = type(
            "Slow",
            (OneAtATimeEngine,),
            {"requests": [], "auth": [], "state": state, "thread": threading.Lock(), **attrs},
        )
        server = QuietServer(("127.0.0.1", 0), handler)
        threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}", handler

    yield start
    for server in servers:
        server.shutdown()


def test_stage_with_shipped_defaults_never_queues_on_a_one_at_a_time_server(
    tmp_path, slow_server, random_target
):
    """The shipped concurrency (32 short, 4 long) against a server that runs one request at a time:
    one request at the server at any moment, zero timeouts, every conversation done, progress lines."""
    from transformers import AutoTokenizer

    url, handler = slow_server(
        tokenizer=AutoTokenizer.from_pretrained(random_target.model), served=[random_target.model]
    )
    rows = prompts(240)
    workdir = stage_dir(
        tmp_path,
        random_target,
        rows,
        backend="external",
        endpoints=[url],
        external_engine="transformers",
        progress_every_s=0.25,
    )
    proc = run_stage(workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = read_json(workdir / "report.json")
    assert (
        report["ok"] == report["conversations"] == 240
        and report["failed"] == report["missing"] == 0
    )
    assert report["retries"] == {} and report["server_slots"] == 1
    assert handler.state["most_at_once"] == 1  # nothing ever waited in the server's queue
    assert handler.state["cancelled"] == [] and handler.state["wasted"] == 0
    assert (
        report["requests"] == sum(bool(b.get("stream")) for b in handler.requests) >= 240
    )  # the preflight probe aside
    lines = [
        ln for ln in proc.stderr.splitlines() if ln.startswith("regenerate: ") and "in flight" in ln
    ]
    assert lines and all("(at most 1)" in ln and "tok/s" in ln and "ETA" in ln for ln in lines)


def test_server_slots_known_for_launched_servers_or_given():
    from draftline.regeneration_run import server_slots

    def cfg(**raw):
        params = yaml.safe_load((ROOT / "params.yaml").read_text())
        params["regenerate"].update(raw)
        return parse_params(params).regenerate

    assert server_slots(cfg(), "transformers") == 1  # one inference thread
    assert server_slots(cfg(continuous_batching=True), "transformers") is None
    assert server_slots(cfg(continuous_batching=True, server_slots=8), "transformers") == 8
    assert server_slots(cfg(backend="vllm", extra_args=["--max-num-seqs", "64"]), "vllm") == 64
    assert (
        server_slots(cfg(backend="sglang", extra_args=["--max-running-requests=48"]), "sglang")
        == 48
    )
    assert server_slots(cfg(backend="vllm"), "vllm") is None  # batches what it is sent
    external = cfg(backend="external", endpoints=["http://h:1"], external_engine="transformers")
    assert server_slots(external, "transformers") == 1


def test_given_up_requests_are_closed_and_the_server_stops_them(tmp_path, slow_server):
    """A request silent past token_timeout_s (or first_token_timeout_s) is closed and retried; the
    server sees each close and stops generating: nothing runs on for a client that has gone."""
    attempts = Counter()

    def stall(
        body,
    ):  # the first attempt of some prompts goes silent: before any token, or after two
        key = json.dumps(body["messages"])
        attempts[key] += 1
        if attempts[key] > 1:
            return None
        return {0: 0, 1: 2}.get(len(attempts) % 4)

    url, handler = slow_server(stall=stall)
    policy = RetryPolicy(
        max_retries=2,
        backoff_s=0.01,
        backoff_max_s=0.05,
        first_token_timeout_s=0.5,
        token_timeout_s=0.5,
    )
    rows = prompts(12)
    tally, out, failures, pool = run_rows([url], rows, tmp_path, policy=policy, slots=1)
    stalled = tally.retries["first_token_timeout"] + tally.retries["token_timeout"]
    assert (
        tally.ok == 12
        and not failures
        and tally.retries["first_token_timeout"]
        and tally.retries["token_timeout"]
    )
    assert len(handler.state["cancelled"]) == stalled and handler.state["wasted"] == 0
    assert handler.state["most_at_once"] == 1 and pool.in_flight == 0


def test_stopping_early_closes_the_requests_in_flight(tmp_path, slow_server):
    """Past max_failures the run stops at once: the conversations in flight are cancelled, not
    retried to the end, and the server sees their streams closed."""
    weather = lambda body: "weather" in json.dumps(body["messages"])  # noqa: E731
    url, handler = slow_server(
        stall=lambda body: 0,
        status_for=lambda body: 400 if weather(body) else 200,
        thread=contextlib.nullcontext(),
    )  # runs all at once: many silent streams
    rows = prompts(40)
    assert any(weather({"messages": r["messages"]}) for r in rows)
    policy = RetryPolicy(
        max_retries=5,
        backoff_s=0.01,
        backoff_max_s=0.05,
        first_token_timeout_s=300,
        token_timeout_s=300,
    )
    tally, out, failures, pool = run_rows(
        [url],
        rows,
        tmp_path,
        policy=policy,
        max_failures=0,
        partitions={"short": (40, None), "long": (40, None)},
    )
    assert tally.aborted and tally.failed == len(failures) >= 1 and tally.cancelled >= 1 and not out
    assert pool.in_flight == 0
    for _ in range(3000):  # the server notices each close before its next token; late arrivals too
        streams = [b for b in handler.requests if not weather(b)]
        if handler.state["handling"] == 0 and len(handler.state["cancelled"]) == len(streams):
            break
        time.sleep(0.01)
    assert len(handler.state["cancelled"]) == len(streams) > 0 and handler.state["wasted"] == 0


def test_progress_ticks_while_no_conversation_finishes(tmp_path, slow_server):
    hold = threading.Event()
    ticks = []

    def on_tick(t):
        ticks.append((t.done, t.in_flight))
        hold.set()  # the server answers only after a tick: ticks cannot wait for answers

    url, handler = slow_server(hold=hold)

    async def go():
        pool = open_pool([url], None, slots=1)
        try:
            return await regenerate_all(
                pool,
                "m",
                prompts(3),
                Sampling(8, 0.0, 1.0, 0),
                FAST_RETRY,
                {"short": (4, None), "long": (1, None)},
                tmp_path / "c.jsonl",
                tmp_path / "f.jsonl",
                {"fingerprint": "f"},
                on_tick=on_tick,
                tick_s=0.05,
            )
        finally:
            await close_pool(pool)

    tally = asyncio.run(go())
    assert tally.ok == 3 and ticks[0] == (0, 1)  # nothing done, one request at the server


# ---- multi-turn replay on structured replies (vLLM / SGLang wire format) ------------------------

WEATHER_CHAT = {
    "id": "w1",
    "partition": "short",
    "tools": [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "add_numbers", "parameters": {"type": "object"}}},
    ],
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the weather in Cairo?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_orig",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Cairo"}'},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_orig",
            "content": '{"sky": "hot", "temperature": 33}',
        },
        {"role": "assistant", "content": "It is hot in Cairo."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "You are welcome."},
    ],
}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_multi_turn_keeps_reasoning_and_splices_matching_tool_results(tmp_path, stub, engine):
    def answer(body):
        last = body["messages"][-1]
        if last["role"] == "user" and "weather" in last["content"]:
            return {
                "reasoning": "I need the weather tool.",
                "tool_calls": [("get_weather", {"city": "Cairo"})],
            }
        if last["role"] == "tool":
            return {"reasoning": "The tool says hot.", "content": "Hot, 33 degrees."}
        return {"content": "Bye."}

    url, handler = stub(engine=engine, answer=answer)
    sampling = Sampling(16, 0.0, 0.9, 7, ((0.0, 1.0), (1.0, 1.0)), {"enable_thinking": True})
    tally, (row,), _, _ = run_rows([url], [WEATHER_CHAT], tmp_path, sampling=sampling)
    msgs = row["messages"]
    assert [m["role"] for m in msgs] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
    ]
    call = msgs[2]["tool_calls"][0]
    assert (
        msgs[2]["reasoning_content"] == "I need the weather tool."
        and call["function"]["name"] == "get_weather"
    )
    assert (
        msgs[3]["tool_call_id"] == call["id"] != "call_orig"
    )  # the original result answers the new call
    assert msgs[3]["content"] == WEATHER_CHAT["messages"][3]["content"]
    assert msgs[4] == {
        "role": "assistant",
        "content": "Hot, 33 degrees.",
        "reasoning_content": "The tool says hot.",
    }
    assert msgs[6]["content"] == "Bye."
    assert row["regeneration"]["finish_reasons"] == ["tool_calls", "stop", "stop"]
    # each turn was asked on the model's own previous answers, with the sampling of the conversation
    temperature, seed = sampling.for_conversation("w1")
    second = handler.requests[1]
    assert second["messages"][2]["tool_calls"][0]["id"] == call["id"]
    for body in handler.requests:
        assert body["temperature"] == temperature and body["seed"] == seed and body["top_p"] == 0.9
        assert (
            body["chat_template_kwargs"] == {"enable_thinking": True} and body["max_tokens"] == 16
        )
        assert body["tools"] == WEATHER_CHAT["tools"]


# A /v1/chat/completions stream in the shape vLLM's chat_completion/serving.py writes it when
# asked for return_token_ids and include_usage (reasoning parser on): the prompt's ids on the role
# chunk, each chunk's own ids in its choice, chunks whose tokens the parser held back (empty delta,
# ids only), the end token on the finish chunk, then the usage chunk.
VLLM_TOKEN_ID_STREAM = [
    '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[1,5,9]}',
    '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":null,"token_ids":[515]}]}',
    '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"reasoning":"2+2"},"logprobs":null,"finish_reason":null,"token_ids":[40,7,40]}]}',
    '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":null,"token_ids":[516]}]}',
    '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"4"},"logprobs":null,"finish_reason":null,"token_ids":[42]}]}',
    '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":[2]}]}',
    '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3,"total_tokens":10,"completion_tokens":7}}',
]


def test_streamed_token_ids_are_put_together_in_order():
    from draftline.answer_stream import BadAnswer, StreamedAnswer, add_chunk, answer_choice

    streamed = StreamedAnswer()
    carried = [add_chunk(streamed, line.encode()) for line in VLLM_TOKEN_ID_STREAM]
    assert carried == [0, 1, 1, 1, 1, 1, 0]  # a chunk of ids only is progress (token timeout)
    choice = answer_choice(streamed.answer())
    assert choice["token_ids"] == [515, 40, 7, 40, 516, 42, 2]
    assert choice["message"] == {"role": "assistant", "content": "4", "reasoning": "2+2"}
    assert len(choice["token_ids"]) == streamed.answer()["usage"]["completion_tokens"]

    without = StreamedAnswer()  # a server that returns no ids: none are made up
    for line in VLLM_TOKEN_ID_STREAM:
        chunk = json.loads(line)
        for c in chunk["choices"]:
            c.pop("token_ids", None)
        without.add(chunk)
    assert "token_ids" not in without.answer()["choices"][0]
    with pytest.raises(BadAnswer, match="token_ids"):
        StreamedAnswer().add(
            {"choices": [{"index": 0, "delta": {"content": "a"}, "token_ids": ["a"]}]}
        )
    with pytest.raises(BadAnswer, match="token_ids"):
        answer_choice({"choices": [{"message": {"content": "a"}, "token_ids": [1.5]}]})


def test_token_ids_are_asked_only_of_engines_that_know_the_field():
    assert engine_request_fields("transformers") == {}  # it answers 422 to unknown fields
    for engine in ("vllm", "sglang"):
        assert engine_request_fields(engine, "hermes") == {
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }
    # vLLM without a tool-call parser refuses tool_choice "auto" (400): requests with tools ask "none"
    assert engine_request_fields("vllm")["with_tools"] == {"tool_choice": "none"}
    assert "with_tools" not in engine_request_fields("sglang")
    # the hf server also puts the usage on every chunk: tokens held back as text still count
    assert engine_request_fields("hf") == {
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "return_token_ids": True,
    }


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_servers_token_ids_are_recorded_per_turn(tmp_path, stub, engine):
    generated = {"tool": [11, 12, 13, 14, 2], "result": [21, 22, 2], "thanks": [31, 2]}

    def answer(body):
        last = body["messages"][-1]
        if last["role"] == "tool":
            return {"content": "Hot.", "token_ids": generated["result"]}
        if "Thanks" in last["content"]:
            return {"content": "Bye.", "token_ids": generated["thanks"]}
        return {"tool_calls": [("get_weather", {"city": "Cairo"})], "token_ids": generated["tool"]}

    url, handler = stub(engine=engine, answer=answer)
    _, (row,), _, _ = run_rows(
        [url], [WEATHER_CHAT], tmp_path, extra_body=engine_request_fields(engine)
    )
    regen = row["regeneration"]
    assert all(body["return_token_ids"] is True for body in handler.requests)
    if engine == "vllm":  # streamed: the ids of every chunk, in order
        assert regen["completion_token_ids"] == [
            generated["tool"],
            generated["result"],
            generated["thanks"],
        ]
    else:  # SGLang returns them only in a whole answer, never in a stream
        assert regen["completion_token_ids"] == [None, None, None]
    assert regen["turn_completion_tokens"] == [3, 3, 3]  # usage.completion_tokens of each turn
    # the ids stay in the record: the messages sent back to the server carry none
    assert all("token_ids" not in json.dumps(body["messages"]) for body in handler.requests)
    assert not any("token_ids" in m for m in row["messages"])


def test_another_tool_call_ends_the_conversation_at_the_call(tmp_path, stub):
    url, _ = stub(answer=lambda body: {"tool_calls": [("add_numbers", {"a": 1, "b": 2})]})
    tally, (row,), _, _ = run_rows([url], [WEATHER_CHAT], tmp_path)
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant"]
    assert row["messages"][-1]["tool_calls"][0]["function"]["name"] == "add_numbers"
    assert row["regeneration"]["stopped"] == "tool_mismatch" and tally.stopped["tool_mismatch"] == 1


def test_max_context_cuts_max_tokens_and_ends_conversations(tmp_path, stub, random_target):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_target.model)

    def answer(body):
        if body["messages"][-1]["role"] == "user":
            return {"tool_calls": [("get_weather", {"city": "Cairo"})]}
        return {"content": "Fine."}

    url, handler = stub(tokenizer=tokenizer, answer=answer)

    def count_ids(messages, tools):
        return chat_prompt_ids(tokenizer, messages, tools, {})

    first = len(count_ids(WEATHER_CHAT["messages"][:2], WEATHER_CHAT["tools"]))
    # room for 5 answer tokens after the first prompt; the second prompt (with the call and its
    # result) no longer fits
    tally, out, failures, _ = run_rows(
        [url],
        [WEATHER_CHAT],
        tmp_path,
        partitions={"short": (1, first + 5), "long": (1, None)},
        count_ids=count_ids,
    )
    assert handler.requests[0]["max_tokens"] == 5 and len(handler.requests) == 1
    assert [m["role"] for m in out[0]["messages"]] == ["system", "user", "assistant"]
    assert out[0]["regeneration"]["stopped"] == "context_full"
    (tmp_path / "b").mkdir()
    tally, out, failures, _ = run_rows(
        [url],
        [WEATHER_CHAT],
        tmp_path / "b",
        partitions={"short": (1, first), "long": (1, None)},
        count_ids=count_ids,
    )
    assert failures[0]["reason"] == "prompt_too_long" and not out and len(handler.requests) == 1


def test_prompt_tokens_are_counted_beside_the_event_loop(tmp_path, stub):
    """With max_context every turn's prompt is rendered and tokenized; that runs in a thread
    while the loop goes on (here: its progress ticks), not on the loop."""
    url, _ = stub()
    counted, ticks, windows = [], [], []

    def count_ids(messages, tools):
        counted.append(threading.current_thread() is threading.main_thread())
        began = time.monotonic()
        time.sleep(0.3)  # a long prompt's template and tokenizer
        windows.append((began, time.monotonic()))
        return [0] * 10

    async def go():
        pool = open_pool([url], None)
        try:
            return await regenerate_all(
                pool,
                "m",
                prompts(2),
                Sampling(8, 0.0, 1.0, 0),
                FAST_RETRY,
                {"short": (2, 1000), "long": (1, None)},
                tmp_path / "c.jsonl",
                tmp_path / "f.jsonl",
                {"fingerprint": "f"},
                count_ids,
                on_tick=lambda t: ticks.append(time.monotonic()),
                tick_s=0.02,
            )
        finally:
            await close_pool(pool)

    tally = asyncio.run(go())
    assert tally.ok == 2 and counted and not any(counted)  # never on the loop's thread
    # the loop ticked while a count ran (15 ticks in 0.3 s when idle; a blocked loop ticks none)
    assert max(len([t for t in ticks if a < t < b]) for a, b in windows) >= 3


def test_called_tools_and_relinking():
    assert called_tools({"content": '<tool_call>{"name": "a", "arguments": {}}</tool_call>'}) == [
        "a"
    ]
    assert called_tools(
        {"content": "", "tool_calls": [{"function": {"name": "b", "arguments": "{}"}}]}
    ) == ["b"]
    assert called_tools({"content": "<tool_call>not json</tool_call>"}) == ["<unparsable>"]
    assert called_tools({"content": "plain"}) == []
    results = [{"role": "tool", "tool_call_id": "old", "content": "1"}]
    assert relink_tool_results(results, {"tool_calls": [{"id": "new"}]})[0]["tool_call_id"] == "new"
    assert (
        relink_tool_results(results, {"content": '<tool_call>{"name": "a"}</tool_call>'}) == results
    )


def test_temperature_draw_is_seeded_per_conversation():
    sampling = Sampling(8, 0.0, 1.0, 3, ((0.0, 3.0), (0.7, 1.0)))
    draws = [sampling.for_conversation(f"p{i}") for i in range(2000)]
    assert draws == [
        sampling.for_conversation(f"p{i}") for i in range(2000)
    ]  # a rerun draws the same
    share = Counter(t for t, _ in draws)[0.0] / len(draws)
    assert 0.70 < share < 0.80  # weights 3:1
    assert len({s for _, s in draws}) > 1990  # distinct request seeds
    assert Sampling(8, 0.5, 1.0, None).for_conversation("p1") == (0.5, None)


# ---- resume ------------------------------------------------------------------------------------


def test_resume_keeps_only_lines_that_still_hold(tmp_path):
    """The lines that do not hold are moved to superseded.jsonl with their reason, never deleted."""
    rows = {r["id"]: r for r in prompts(6)}

    def line(pid, fp="F", prompt=None, **regeneration):
        return {
            "id": pid,
            "messages": [],
            "regeneration": {
                "fingerprint": fp,
                "prompt_sha256": prompt_sha256(prompt or rows[pid]),
                **regeneration,
            },
        }

    path = tmp_path / "c.jsonl"
    other = {"messages": [{"role": "user", "content": "changed"}]}
    lines = [
        line("p0"),
        line("p1"),
        line("p0"),
        line("p2", fp="OLD"),
        line("p3", prompt=other),
        {"id": "p5", "messages": []},
        line("gone", prompt=other),
        line("p1", fp="G", settings={"max_tokens": 4}),
        "not json",
        line("p4"),
    ]
    path.write_text(
        "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines)
    )  # no final newline: cut by a kill
    wanted = Wanted("F", {"max_tokens": 8})
    done, counts = load_finished(path, rows, wanted)
    assert done == {"p0", "p1", "gone", "p4"}
    assert counts == {
        "bad_lines": 1,
        "duplicates": 2,
        "stale_settings": 0,
        "unrecorded_settings": 2,
        "stale_prompt": 1,
        "not_in_prompts": 1,
        "restored": 0,
        "upgraded": 0,
        "last_run": 0,
    }
    kept = path.read_text()
    assert kept.endswith("\n") and [json.loads(x)["id"] for x in kept.splitlines()] == [
        "p0",
        "p1",
        "gone",
        "p4",
    ]
    aside = [json.loads(x) for x in (tmp_path / "superseded.jsonl").read_text().splitlines()]
    assert [(e["reason"], e.get("line", e.get("text"))) for e in aside] == [
        ("duplicate", lines[2]),
        ("unrecorded_settings", lines[3]),
        ("stale_prompt", lines[4]),
        ("unrecorded_settings", lines[5]),
        ("duplicate", lines[7]),
        ("bad_line", "not json"),
    ]
    # a clean file is left untouched
    mtime = path.stat().st_mtime_ns
    assert load_finished(path, rows, wanted)[0] == done and path.stat().st_mtime_ns == mtime
    # a line made with other settings: its changed fields are said
    path.write_text(json.dumps(line("p2", fp="G", settings={"max_tokens": 4})) + "\n")
    assert load_finished(path, rows, wanted)[1]["stale_settings"] == 1
    last = json.loads((tmp_path / "superseded.jsonl").read_text().splitlines()[-1])
    assert last["reason"] == "stale_settings" and last["changed"] == ["max_tokens"]


def parsed_entries(path: Path) -> list:
    """The index entries of a file's lines, from parsing every line."""
    out, start = [], 0
    for line in path.read_bytes().splitlines(keepends=True):
        out.append(index_entry(start, line, json.loads(line)))
        start += len(line)
    return out


def test_resume_reads_the_index_and_the_lines_where_it_is_off(tmp_path, stub, monkeypatch):
    """A rerun knows the done conversations from the index beside the file, parsing none of
    them; where the index is short of the file, torn, gone, or the file was edited by hand, the
    lines say, and the index is written anew."""
    from draftline import conversation_store
    from draftline.regeneration_run import length_check

    url, _ = stub()
    rows = prompts(24)
    tally, out, _, _ = run_rows([url], rows, tmp_path)  # the writer appends each line's entry
    path = tmp_path / "c.jsonl"
    assert tally.ok == 24 and read_index(path) == parsed_entries(path)
    by_id, wanted = {r["id"]: r for r in rows}, Wanted("f", {})
    changed = dict(rows[3], messages=[{"role": "user", "content": "changed"}])
    by_id[rows[3]["id"]] = changed  # a prompt changed since: the index's hash says so
    real_parse, parsed = conversation_store._parse, []
    monkeypatch.setattr(
        conversation_store, "_parse", lambda line: parsed.append(line) or real_parse(line)
    )

    def truth() -> tuple[set, dict]:  # what parsing every line gives
        plain = tmp_path / "plain"
        plain.mkdir(exist_ok=True)
        shutil.copy(path, plain / "c.jsonl")
        index_path(plain / "c.jsonl").unlink(missing_ok=True)
        return load_finished(plain / "c.jsonl", by_id, wanted, rewrite=False)

    expected = truth()
    assert expected[1]["stale_prompt"] == 1 and len(expected[0]) == 23
    parsed.clear()
    assert load_finished(path, by_id, wanted, rewrite=False) == expected and not parsed
    assert length_check(path, by_id, "f", 0.5)["conversations"] == 24 and not parsed
    index = index_path(path)
    whole = index.read_bytes()
    extra = json.dumps(dict(out[5], id="p_extra")) + "\n"
    damages = {
        "short of the file": lambda: index.write_bytes(whole[: whole.rstrip().rfind(b"\n") + 1]),
        "torn": lambda: index.write_bytes(whole[:-7]),
        "gone": lambda: index.unlink(),
        "a line added by hand": lambda: path.write_text(extra + path.read_text()),
        "lines cut off by hand": lambda: path.write_text(
            "".join(path.read_text().splitlines(keepends=True)[:-2])
        ),
    }
    for name, damage in damages.items():
        damage()
        expected, parsed[:] = truth(), []
        assert load_finished(path, by_id, wanted, rewrite=False) == expected, name
        assert parsed and read_index(path) == parsed_entries(path), name  # written anew
        parsed.clear()
        assert load_finished(path, by_id, wanted, rewrite=False) == expected and not parsed, name
    # lines moved out: the rewritten file comes with its index
    load_finished(path, by_id, wanted)
    assert read_index(path) == parsed_entries(path) and len(read_index(path)) == 22


def test_a_rerun_reads_and_hashes_only_the_prompts_whose_line_changed(tmp_path, stub, monkeypatch):
    """The prompts of done conversations are neither parsed nor hashed again while their line in
    the prompts file stays as it was checked (its digest in the index); a changed line is."""
    from draftline import conversation_store
    from draftline.conversation_store import PromptFile

    url, _ = stub()
    rows = prompts(12)
    write_jsonl(tmp_path / "train.jsonl", rows)
    run_rows([url], rows, tmp_path)
    path, hashed = tmp_path / "c.jsonl", []
    real_hash = conversation_store.prompt_sha256
    monkeypatch.setattr(
        conversation_store, "prompt_sha256", lambda row: hashed.append(row["id"]) or real_hash(row)
    )

    def rerun() -> tuple[set, dict, PromptFile]:
        by_id = PromptFile(tmp_path / "train.jsonl")
        done, counts = load_finished(path, by_id, "f", False, by_id.digests)
        return done, counts, by_id

    done, _, _ = rerun()  # the lines were written without digests: hashed once, the index told
    assert len(done) == 12 and sorted(hashed) == sorted(r["id"] for r in rows)
    hashed.clear()
    done, _, by_id = rerun()
    assert len(done) == 12 and not hashed and not by_id._rows  # nothing parsed, nothing hashed
    rows[4] = dict(rows[4], messages=[{"role": "user", "content": "changed"}])
    write_jsonl(tmp_path / "train.jsonl", rows)
    done, counts, by_id = rerun()
    assert hashed == [rows[4]["id"]] and list(by_id._rows) == [rows[4]["id"]]
    assert counts["stale_prompt"] == 1 and rows[4]["id"] not in done and len(done) == 11


# ---- preflight against the engines' wire formats ------------------------------------------------


def rendered(tokenizer, chat_template_kwargs=None):
    """The prompt ids of a conversation as the stage counts them (preflight's prompt_ids)."""
    return lambda messages, tools: chat_prompt_ids(
        tokenizer, messages, tools, chat_template_kwargs or {}
    )


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_preflight_accepts_the_plain_target(stub, random_target, engine):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_target.model)
    url, _ = stub(engine=engine, tokenizer=tokenizer)
    seen = preflight_regeneration(url, engine, "m", rendered(tokenizer), {}, attempts=1)
    assert seen["served_models"] == ["m"] and seen["probe_prompt_tokens"] > 10
    assert seen.get("probe_token_ids") == ("match" if engine == "vllm" else None)


@pytest.mark.parametrize(
    "engine, attrs, message",
    [
        ("vllm", {"speculative": True}, "vllm:spec_decode_num_drafts_total"),
        ("sglang", {"speculative": True}, "speculative_algorithm=EAGLE3"),
        ("vllm", {"served": ["other/model"]}, "not the target"),
        ("sglang", {"count_offset": 1}, "another model, tokenizer or chat template"),
        (
            "sglang",
            {"engine": "vllm"},
            "answers as vllm, not sglang",
        ),  # external_engine says sglang, it is not
        ("vllm", {"engine": "sglang"}, "answers as sglang, not vllm"),
        ("vllm", {"engine": "transformers"}, "no vllm: metrics"),  # cannot be checked for a draft
        ("sglang", {"engine": "transformers"}, "no speculative_algorithm"),
    ],
)
def test_preflight_refuses(stub, random_target, engine, attrs, message):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_target.model)
    url, _ = stub(**{"engine": engine, "tokenizer": tokenizer, **attrs})
    with pytest.raises(PreflightError, match=message):
        preflight_regeneration(url, engine, "m", rendered(tokenizer), {}, attempts=1)


@pytest.mark.parametrize(
    "actual, speculative, message",
    [
        ("vllm", True, "runs speculative decoding.*vllm:spec_decode_num_drafts_total"),
        ("sglang", True, "runs speculative decoding.*speculative_algorithm=EAGLE3"),
        ("vllm", False, "answers as vllm, not transformers"),
        ("sglang", False, "answers as sglang, not transformers"),
    ],
)
def test_preflight_probes_what_the_server_is_whatever_is_declared(
    stub, random_target, actual, speculative, message
):
    """Declared `external_engine: transformers` (which has no speculative mode), the server is
    really vLLM / SGLang: its own evidence decides, a draft is found and refused."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_target.model)
    url, handler = stub(engine=actual, speculative=speculative, tokenizer=tokenizer)
    with pytest.raises(PreflightError, match=message):
        preflight_regeneration(url, "transformers", "m", rendered(tokenizer), {}, attempts=1)
    assert handler.requests == []  # refused before the probe request, let alone the data


def test_stage_refuses_a_speculative_server_declared_as_transformers(tmp_path, stub, random_target):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_target.model)
    url, handler = stub(
        engine="vllm", speculative=True, tokenizer=tokenizer, served=[random_target.model]
    )
    workdir = stage_dir(
        tmp_path,
        random_target,
        prompts(4),
        backend="external",
        endpoints=[url],
        external_engine="transformers",
    )
    proc = run_stage(workdir)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "speculative decoding" in proc.stderr and "vllm:spec_decode" in proc.stderr
    assert handler.requests == [] and not (workdir / "out/conversations.jsonl").exists()


def test_stage_refuses_a_speculative_server_before_any_request(tmp_path, stub, random_target):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_target.model)
    url, handler = stub(
        engine="vllm", speculative=True, tokenizer=tokenizer, served=[random_target.model]
    )
    workdir = stage_dir(
        tmp_path,
        random_target,
        prompts(4),
        backend="external",
        endpoints=[url],
        external_engine="vllm",
    )
    proc = run_stage(workdir)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "preflight refused" in proc.stderr and "speculative" in proc.stderr
    assert handler.requests == [] and not (workdir / "out/conversations.jsonl").exists()


def test_a_refused_preflight_drops_no_conversation(tmp_path, stub, random_target):
    """Issue #16.1: a changed sampling param makes every line stale; with an endpoint the preflight
    refuses, conversations.jsonl must stay byte for byte (before: all lines were dropped first, and
    reverting the param sent everything again). Once a good endpoint passes, the stale lines move
    to superseded.jsonl (issue 24.2: never deleted)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_target.model)
    rows = prompts(12)
    workdir = stage_dir(tmp_path, random_target, rows)
    out = workdir / "out/conversations.jsonl"
    out.parent.mkdir()
    made_with_other_sampling = [
        {
            **row,
            "regeneration": {
                "fingerprint": "other-sampling",
                "settings": {"max_tokens": 1},
                "prompt_sha256": prompt_sha256(row),
            },
        }
        for row in rows
    ]
    out.write_text(
        "".join(json.dumps(r) + "\n" for r in made_with_other_sampling) + '{"id": "p0", "mess'
    )  # + a cut line
    before = (out.read_bytes(), out.stat().st_mtime_ns)

    bad, bad_handler = stub(
        engine="vllm", speculative=True, tokenizer=tokenizer, served=[random_target.model]
    )
    stage_dir(
        workdir, random_target, rows, backend="external", endpoints=[bad], external_engine="vllm"
    )
    proc = run_stage(workdir)
    assert proc.returncode != 0 and "preflight refused" in proc.stderr
    assert (out.read_bytes(), out.stat().st_mtime_ns) == before and bad_handler.requests == []
    assert "is as it was" in proc.stderr

    good, handler = stub(engine="vllm", tokenizer=tokenizer, served=[random_target.model])
    stage_dir(
        workdir, random_target, rows, backend="external", endpoints=[good], external_engine="vllm"
    )
    proc = run_stage(workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = read_json(workdir / "report.json")
    assert (
        report["resume"]["stale_settings"] == 12
        and report["resume"]["bad_lines"] == 1
        and report["sent"] == 12
    )
    done = output_rows(workdir)
    assert sorted(r["id"] for r in done) == sorted(r["id"] for r in rows)
    assert {r["regeneration"]["fingerprint"] for r in done} == {
        read_json(workdir / "out/meta.json")["fingerprint"]
    }
    aside = [json.loads(x) for x in (workdir / "out/superseded.jsonl").read_text().splitlines()]
    assert [e["line"] for e in aside if "line" in e] == made_with_other_sampling
    assert [e["text"] for e in aside if "text" in e] == ['{"id": "p0", "mess']


def test_answers_cut_by_max_tokens_fail_the_stage_and_stay(tmp_path, stub, random_target):
    """Issue 24: a thinking model at the default max_tokens 96 has nearly every answer cut, and
    nothing refused the run. Past regenerate.max_length_share the stage fails naming max_tokens;
    the conversations stay on disk (a persist output), a rerun that sends nothing checks them
    again, and raising the threshold (operational) accepts them without sending anything."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_target.model)
    url, handler = stub(
        engine="vllm",
        tokenizer=tokenizer,
        served=[random_target.model],
        answer=lambda body: {"content": "Let me think about", "finish": "length"},
    )
    rows = prompts(8)
    shipped = yaml.safe_load((ROOT / "params.yaml").read_text())["regenerate"]["max_length_share"]
    external = dict(backend="external", endpoints=[url], external_engine="vllm")
    workdir = stage_dir(tmp_path, random_target, rows, max_length_share=shipped, **external)
    for sent in (8, 0):  # the run that cut them, then a rerun with nothing left to send
        proc = run_stage(workdir)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr
        assert "8 of 8 answers (100.0%) ended at regenerate.max_tokens 96" in proc.stderr
        assert f"more than regenerate.max_length_share {shipped}" in proc.stderr
        report = read_json(workdir / "report.json")
        assert report["sent"] == sent and report["check"] == {
            "param": "regenerate.max_length_share",
            "conversations": 8,
            "answers": 8,
            "length": 8,
            "share": 1.0,
            "threshold": shipped,
            "verdict": "fail",
        }
        assert len(output_rows(workdir)) == 8  # kept: nothing is lost by failing

    requests = len(handler.requests)
    stage_dir(workdir, random_target, rows, max_length_share=1.0, **external)
    proc = run_stage(workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = read_json(workdir / "report.json")
    assert report["sent"] == 0 and report["reused"] == 8 and len(handler.requests) == requests
    assert report["check"]["verdict"] == "pass" and report["check"]["share"] == 1.0


def test_length_check_counts_the_conversations_the_next_stages_read(tmp_path):
    from draftline.regeneration_run import length_check

    def line(pid, reasons, fingerprint="f"):
        regen = {"fingerprint": fingerprint, "finish_reasons": reasons}
        return json.dumps({"id": pid, "messages": [], "regeneration": regen}) + "\n"

    path = tmp_path / "conversations.jsonl"
    path.write_text(
        line("a", ["stop", "stop", "length"])
        + line("b", ["length"])
        + line("a", ["length"])  # a second line of an id: not read downstream
        + line("c", ["length"], fingerprint="old")  # made with other settings
        + line("gone", ["length"])  # no longer prompted
        + line("d", ["tool_calls", "stop"])
        + '{"id": "e", "mess'  # cut by a kill
    )
    prompted = {pid: {} for pid in "abcde"}
    check = length_check(path, prompted, "f", 0.5)
    assert (check["conversations"], check["answers"], check["length"]) == (3, 6, 2)
    assert check["share"] == round(2 / 6, 4) and check["verdict"] == "pass"
    assert length_check(path, prompted, "f", 0.3)["verdict"] == "fail"
    assert length_check(tmp_path / "none.jsonl", prompted, "f", 0.5)["verdict"] == "skipped"


def test_stage_refuses_sampling_that_transformers_serve_would_ignore(tmp_path, random_target):
    workdir = stage_dir(
        tmp_path, random_target, prompts(2), backend="transformers", temperature=0.7
    )
    proc = run_stage(workdir)
    assert proc.returncode != 0 and "do_sample" in proc.stderr and not (workdir / "out").exists()


# ---- launch commands against vLLM's and SGLang's documented flags -------------------------------


def vllm_serve_parser() -> argparse.ArgumentParser:
    """The flags used, as vLLM defines them: EngineArgs.add_cli_args in vllm/engine/arg_utils.py
    (--served-model-name nargs=+, -tp/-dp aliases, --max-model-len, --reasoning-parser, --revision,
    --speculative-config) and FrontendArgs in vllm/entrypoints/openai/cli_args.py (--host, --port,
    --enable-auto-tool-choice, --tool-call-parser)."""
    p = argparse.ArgumentParser(prog="vllm.entrypoints.openai.api_server", allow_abbrev=False)
    p.add_argument("--model", dest="model_tag")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--served-model-name", nargs="+")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--revision")
    p.add_argument("--reasoning-parser")
    p.add_argument(
        "--enable-auto-tool-choice", action=argparse.BooleanOptionalAction, default=False
    )
    p.add_argument("--tool-call-parser")
    p.add_argument("--gpu-memory-utilization", type=float)
    p.add_argument("--speculative-config", type=json.loads)
    return p


def sglang_launch_parser() -> argparse.ArgumentParser:
    """The flags used, as SGLang's ServerArgs (python/sglang/srt/server_args.py) defines them:
    --model-path (alias --model), --host, --port, --served-model-name, --tp-size (alias
    --tensor-parallel-size), --dp-size (alias --data-parallel-size), --context-length, --revision,
    --reasoning-parser, --tool-call-parser, --speculative-algorithm."""
    p = argparse.ArgumentParser(prog="sglang.launch_server", allow_abbrev=False)
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--served-model-name")
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--dp-size", "--data-parallel-size", type=int, default=1)
    p.add_argument("--context-length", type=int)
    p.add_argument("--revision")
    p.add_argument("--reasoning-parser")
    p.add_argument("--tool-call-parser")
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--speculative-algorithm")
    return p


def test_vllm_command_uses_documented_flags():
    cmd = vllm_regenerate_command(
        "Qwen/Qwen3-8B",
        "Qwen/Qwen3-8B",
        "0.0.0.0",
        8000,
        "abc123",
        4,
        2,
        32768,
        "qwen3",
        "hermes",
        ["--gpu-memory-utilization", "0.85"],
    )
    assert cmd[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "Qwen/Qwen3-8B"]
    args, unknown = vllm_serve_parser().parse_known_args(cmd[3:])
    assert not unknown
    assert (args.model_tag, args.served_model_name, args.port, args.revision) == (
        "Qwen/Qwen3-8B",
        ["Qwen/Qwen3-8B"],
        8000,
        "abc123",
    )
    assert (args.tensor_parallel_size, args.data_parallel_size, args.max_model_len) == (4, 2, 32768)
    assert (
        args.reasoning_parser == "qwen3"
        and args.enable_auto_tool_choice
        and args.tool_call_parser == "hermes"
    )
    assert args.gpu_memory_utilization == 0.85 and args.speculative_config is None
    bare, unknown = vllm_serve_parser().parse_known_args(
        vllm_regenerate_command("m", "m", "h", 1, None, 1, 1, None, None, None, [])[3:]
    )
    assert not unknown and not bare.enable_auto_tool_choice and bare.max_model_len is None


def test_sglang_command_uses_documented_flags():
    cmd = sglang_regenerate_command(
        "/models/glm",
        "glm",
        "0.0.0.0",
        30000,
        None,
        8,
        2,
        65536,
        "glm45",
        "glm45",
        ["--mem-fraction-static", "0.8"],
    )
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    args, unknown = sglang_launch_parser().parse_known_args(cmd[3:])
    assert not unknown
    assert (args.model_path, args.served_model_name, args.port, args.tp_size, args.dp_size) == (
        "/models/glm",
        "glm",
        30000,
        8,
        2,
    )
    assert (args.context_length, args.reasoning_parser, args.tool_call_parser) == (
        65536,
        "glm45",
        "glm45",
    )
    assert args.mem_fraction_static == 0.8 and args.speculative_algorithm is None


@pytest.mark.parametrize(
    "regenerate, key",
    [
        (
            {"backend": "vllm", "extra_args": ["--speculative-config", "{}"]},
            "regenerate.extra_args",
        ),
        (
            {"backend": "sglang", "extra_args": ["--speculative-algorithm", "EAGLE3"]},
            "regenerate.extra_args",
        ),
        ({"backend": "external"}, "regenerate.endpoints"),
        ({"backend": "external", "endpoints": ["http://h:1"]}, "regenerate.external_engine"),
        ({"endpoints": ["http://h:1"]}, "regenerate.endpoints"),
        ({"reasoning_parser": "qwen3"}, "regenerate.reasoning_parser"),
        (
            {"temperature": 0.5, "temperatures": [{"value": 1.0, "weight": 1}]},
            "regenerate.temperatures",
        ),
        ({"short": {"concurrency": 0}}, "regenerate.short.concurrency"),
        ({"request_timeout_s": 120}, "replaced by first_token_timeout_s"),
        ({"server_slots": 0}, "regenerate.server_slots"),
    ],
)
def test_bad_regenerate_params_name_the_key(regenerate, key):
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["regenerate"].update(regenerate)
    with pytest.raises(ParamsError, match=key.replace(".", r"\.")):
        parse_params(raw)


# ---- server lifecycle ---------------------------------------------------------------------------


def http_server_cmd(port: int, directory: Path) -> list[str]:
    (directory / "health").write_text("ok")  # GET /health -> 200
    return [
        sys.executable,
        "-m",
        "http.server",
        str(port),
        "--bind",
        "127.0.0.1",
        "--directory",
        str(directory),
    ]


def test_managed_server_starts_stops_and_reports_failures(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with ManagedServer(
        http_server_cmd(port, tmp_path), dict(os.environ), url, tmp_path / "s.log", 30
    ) as base:
        assert port_open(port) and (tmp_path / "s.pid").exists()
        with pytest.raises(RuntimeError, match="already in use"):
            ManagedServer(
                http_server_cmd(port, tmp_path), dict(os.environ), base, tmp_path / "t.log", 30
            ).__enter__()
    assert not port_open(port) and not (tmp_path / "s.pid").exists()
    crash = [sys.executable, "-c", "print('no such model'); raise SystemExit(3)"]
    with pytest.raises(RuntimeError, match=r"(?s)code 3.*no such model"):
        ManagedServer(crash, dict(os.environ), url, tmp_path / "c.log", 30).__enter__()


def test_server_of_a_killed_stage_does_not_outlive_it(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    script = (
        f"import sys, time; sys.path.insert(0, {str(ROOT)!r})\n"
        "from pathlib import Path\nfrom draftline.servers import ManagedServer\n"
        f"with ManagedServer({http_server_cmd(port, tmp_path)!r}, None, {url!r}, Path({str(tmp_path / 's.log')!r}), 30):\n"
        "    print('ready', flush=True); time.sleep(60)\n"
    )
    stage = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert stage.stdout.readline().strip() == "ready" and port_open(port)
    stage.send_signal(signal.SIGKILL)
    stage.wait()
    deadline = time.monotonic() + 10
    while port_open(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not port_open(port)  # the server got SIGTERM when its parent died

    # an orphan that survived (its pid file left behind) is stopped by the next run, which then starts
    orphan = subprocess.Popen(
        http_server_cmd(port, tmp_path),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    (tmp_path / "s.pid").write_text(f"{orphan.pid} {sys.executable}\n")
    while not port_open(port):
        time.sleep(0.05)
    with ManagedServer(http_server_cmd(port, tmp_path), None, url, tmp_path / "s.log", 30):
        assert orphan.wait(10) is not None
    assert not port_open(port)


def _whoami(url: str) -> str:
    import httpx

    return httpx.get(f"{url}/whoami", timeout=5).text


@contextlib.contextmanager
def started_concurrently(servers: list[ManagedServer]):
    """Each server entered in a thread of its own at the same time; the threads stay alive until
    the end (a launched server gets SIGTERM when the thread that started it exits: PDEATHSIG)."""
    urls, ready, done = (
        [None] * len(servers),
        threading.Barrier(len(servers) + 1),
        threading.Event(),
    )

    def run(k):
        try:
            urls[k] = servers[k].__enter__()
        except Exception as err:  # noqa: BLE001 - reported by the caller's assertion
            urls[k] = err
        ready.wait()
        done.wait(120)
        servers[k].stop()

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(len(servers))]
    for t in threads:
        t.start()
    ready.wait(120)
    try:
        yield urls
    finally:
        done.set()
        for t in threads:
            t.join(60)


def test_two_servers_started_at_once_get_free_ports_of_their_own(tmp_path):
    """Issue #16.8: `port: null` (the default of regenerate, benchmark and extraction servers) picks
    a free port at start, so two pipelines on one host (`dvc queue start -j 2`) do not collide."""
    assert parse_params(yaml.safe_load((ROOT / "params.yaml").read_text())).regenerate.port is None
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["hidden_states"] = {"vllm": {"port": 0}}
    assert (
        parse_params(raw).hidden_states.vllm.port is None
        and parse_params(raw).benchmark.port is None
    )
    servers = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "whoami").write_text(name)
        servers.append(
            ManagedServer(
                lambda port, d=tmp_path / name: http_server_cmd(port, d),
                dict(os.environ),
                server_url("127.0.0.1", None),
                tmp_path / name / "s.log",
                30,
            )
        )
    with started_concurrently(servers) as urls:
        assert all(isinstance(u, str) for u in urls), urls
        assert urls[0] != urls[1] and [_whoami(u) for u in urls] == ["a", "b"]
    assert not any(port_open(int(u.rsplit(":", 1)[1])) for u in urls)


def test_a_port_taken_by_another_pipeline_is_noticed_and_another_one_used(tmp_path, monkeypatch):
    """Both pipelines are handed the same "free" port: whichever server loses the race (it cannot
    bind, or what answers its health check is the other one's) moves to another port."""
    import draftline.servers as servers_module

    real, same, lock, calls = servers_module.free_port, free_port(), threading.Lock(), []

    def racy_free_port(host):
        with lock:
            calls.append(host)
            return same if len(calls) <= 2 else real(host)

    monkeypatch.setattr(servers_module, "free_port", racy_free_port)
    servers = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "whoami").write_text(name)
        servers.append(
            ManagedServer(
                lambda port, d=tmp_path / name: http_server_cmd(port, d),
                dict(os.environ),
                server_url("127.0.0.1", None),
                tmp_path / name / "s.log",
                30,
            )
        )
    with started_concurrently(servers) as urls:
        assert all(isinstance(u, str) for u in urls), urls
        assert len(calls) == 3 and urls[0] != urls[1] and f"http://127.0.0.1:{same}" in urls
        assert [_whoami(u) for u in urls] == ["a", "b"]  # each talks to its own server
    # the loser is slow to bind: its health check first reaches the winner's server, which is not
    # in its process group, so it moves on instead of using the other pipeline's server
    calls.clear()
    first = ManagedServer(
        lambda port: http_server_cmd(port, tmp_path / "a"),
        dict(os.environ),
        server_url("127.0.0.1", None),
        tmp_path / "a.log",
        30,
    )
    slow_dir = tmp_path / "b"
    slow = ManagedServer(
        lambda port: ["sh", "-c", f"sleep 2; exec {' '.join(http_server_cmd(port, slow_dir))}"],
        dict(os.environ),
        server_url("127.0.0.1", None),
        tmp_path / "b.log",
        30,
    )
    with first as url_a, slow as url_b:
        assert url_a == f"http://127.0.0.1:{same}" != url_b and (
            _whoami(url_a),
            _whoami(url_b),
        ) == ("a", "b")
    # a fixed port that is taken is still refused, naming it
    with ManagedServer(
        lambda port: http_server_cmd(port, tmp_path / "a"),
        dict(os.environ),
        server_url("127.0.0.1", None),
        tmp_path / "c.log",
        30,
    ) as url:
        with pytest.raises(RuntimeError, match="already in use"):
            ManagedServer(
                http_server_cmd(int(url.rsplit(":", 1)[1]), tmp_path),
                dict(os.environ),
                url,
                tmp_path / "d.log",
                30,
            ).__enter__()


def test_a_server_that_answers_whole_still_counts_tokens(tmp_path, stub):
    """The built-in hf server answers each request as one JSON object, not a stream: its usage
    still feeds the progress line's tok/s (it read 0 tok/s before)."""
    whole = {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
    }
    url, _ = stub(raw_for=lambda body: json.dumps(whole).encode())
    tally, out, _, _ = run_rows([url], prompts(6), tmp_path)
    assert tally.ok == len(out) == 6 and tally.requests > 0
    assert tally.streamed_tokens == 7 * tally.requests
