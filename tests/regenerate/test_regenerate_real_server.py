"""Regeneration against a real `transformers serve`: launched by the stage, and behind a fault-injecting
proxy (errors, hangs and dropped connections before and mid-stream, a SIGKILL mid-run and a rerun)."""

import json
import os
import signal
import subprocess
import threading
import time

import regenerate_support
from regenerate_support import (
    FaultProxy,
    Faults,
    QuietServer,
    free_port,
    output_rows,
    port_open,
    prompts,
    run_stage,
    stage_cmd,
    stage_dir,
    stage_env,
)

from draftline.core.io import read_json, write_jsonl
from draftline.regenerate.settings import prompt_sha256

# shared fixtures (regenerate_support.py)
chatty_target = regenerate_support.chatty_target
served_chatty = regenerate_support.served_chatty


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


def start_proxy(faults: Faults) -> QuietServer:
    handler = type("Proxy", (FaultProxy,), {"faults": faults})
    server = QuietServer(("127.0.0.1", 0), handler)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    return server


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
    # kept as written and first (their run), in the prompts' order once the run ended
    # (regenerate's canonical order); the new ones after them
    place = {r["id"]: i for i, r in enumerate(rows)}
    assert done[: len(before)] == sorted(before, key=lambda r: place[r["id"]])
    report = read_json(workdir / "report.json")
    assert report["reused"] == len(before) and report["resume"]["bad_lines"] == 1
    assert report["sent"] == report["ok"] == 30 - len(before) and report["failed"] == 0
    assert report["conversations"] == 30 and report["missing"] == 0
    assert sum(report["stopped"].values()) == report["ok"]
    assert (workdir / "out/failures.jsonl").read_text() == ""
    # every kind of fault hit the rerun and was retried, streams cut mid-answer included (a dropped
    # one as a lost connection, a hung one past the token timeout): no half answer was kept
    assert {"http_500", "http_429", "first_token_timeout", "connection", "token_timeout"} <= set(
        report["retries"]
    ), report["retries"]
    assert faults.cut_streams >= 2 and faults.injected["mid_hang"] and faults.injected["mid_drop"]
    # answers that ended by themselves led to later turns, replayed on the model's own answers
    multi = [r for r in done if sum(m["role"] == "assistant" for m in r["messages"]) > 1]
    assert multi and all(r["regeneration"]["finish_reasons"][0] == "stop" for r in multi)
