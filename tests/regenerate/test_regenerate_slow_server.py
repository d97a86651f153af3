"""Regeneration against a slow server that runs one request at a time (transformers serve on a small CPU)."""

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections import Counter

import pytest
import yaml
from regenerate_support import (
    FAST_RETRY,
    ROOT,
    QuietServer,
    ScriptedEngine,
    prompts,
    run_rows,
    run_stage,
    stage_dir,
)

from draftline.core.io import read_json
from draftline.params import parse_params
from draftline.regenerate.client import RetryPolicy, close_pool, open_pool
from draftline.regenerate.replay import ProgressHooks, ReplayJob, Sampling, regenerate_all


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
    from draftline.regenerate.run import server_slots

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
            job = ReplayJob(
                "m",
                Sampling(8, 0.0, 1.0, 0),
                FAST_RETRY,
                {"short": (4, None), "long": (1, None)},
                {"fingerprint": "f"},
            )
            return await regenerate_all(
                pool,
                job,
                prompts(3),
                tmp_path / "c.jsonl",
                tmp_path / "f.jsonl",
                ProgressHooks(on_tick=on_tick, tick_s=0.05),
            )
        finally:
            await close_pool(pool)

    tally = asyncio.run(go())
    assert tally.ok == 3 and ticks[0] == (0, 1)  # nothing done, one request at the server
