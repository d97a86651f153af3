"""Regeneration through a real `transformers serve`, resume after a kill, and failures recorded."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from draftline.io import read_json, write_json, write_jsonl
from draftline.regeneration import Sampling, called_tools, regenerate_all

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompts(n: int) -> list[dict]:
    from draftline.corpus import generate_conversations

    return [{"id": f"p{i}", "source": "t", "partition": "short", **c} for i, c in enumerate(generate_conversations(n, 11))]


def run_stage(workdir: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "stages.regenerate", "card.json", "train.jsonl", "out", "report.json"],
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=600)


def test_stage_regenerates_and_resumes(tmp_path, random_target):
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["regenerate"].update(port=free_port(), max_tokens=12, concurrency=4)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    write_json(tmp_path / "card.json", random_target)
    rows = prompts(8)
    write_jsonl(tmp_path / "train.jsonl", rows)

    proc = run_stage(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "out/conversations.jsonl"
    done = [json.loads(l) for l in out.read_text().splitlines()]
    assert sorted(r["id"] for r in done) == sorted(r["id"] for r in rows)
    for r in done:
        assert r["messages"][-1]["role"] == "assistant"
    report = read_json(tmp_path / "report.json")
    assert report["sent"] == 8 and report["ok"] == 8 and report["failed"] == 0

    # a kill: three conversations never finished and the last line was cut mid-write
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:5]) + "\n" + lines[5][:20])
    proc = run_stage(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = read_json(tmp_path / "report.json")
    assert report["reused"] == 5 and report["sent"] == 3 and report["dropped_partial_lines"] == 1
    ids = [json.loads(l)["id"] for l in out.read_text().splitlines()]
    assert sorted(ids) == sorted(r["id"] for r in rows)  # all there, no duplicates


class FlakyChat(BaseHTTPRequestHandler):
    """A stand-in server for fault injection: 500 for prompts mentioning 'weather', else an answer."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if "weather" in json.dumps(body["messages"]):
            self.send_response(500)
            self.end_headers()
            return
        answer = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                  "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}],
                  "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_failures_are_recorded_with_reasons(tmp_path):
    from openai import AsyncOpenAI

    server = ThreadingHTTPServer(("127.0.0.1", 0), FlakyChat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{server.server_port}/v1", api_key="x", max_retries=1, timeout=10)
        rows = prompts(30)
        out, failures = tmp_path / "c.jsonl", tmp_path / "f.jsonl"
        tally = asyncio.run(regenerate_all(client, "m", rows, Sampling(8, 0.0, 1.0, 0), {"short": 4, "long": 1}, out, failures))
    finally:
        server.shutdown()
    weather = {r["id"] for r in rows if "weather" in json.dumps(r["messages"])}
    assert weather, "the seed should give some weather prompts"
    failed = [json.loads(l) for l in failures.read_text().splitlines()]
    assert {f["id"] for f in failed} == weather and tally.failed == len(weather)
    assert all(f["reason"] == "InternalServerError" for f in failed)
    assert tally.ok == len(rows) - len(weather) == len(out.read_text().splitlines())


def test_called_tools_structured_and_inline():
    assert called_tools({"content": '<tool_call>{"name": "a", "arguments": {}}</tool_call>'}) == ["a"]
    assert called_tools({"content": "", "tool_calls": [{"function": {"name": "b", "arguments": "{}"}}]}) == ["b"]
    assert called_tools({"content": "<tool_call>not json</tool_call>"}) == ["<unparsable>"]
    assert called_tools({"content": "plain"}) == []
