"""The lifecycle of the servers the regenerate stage launches."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import regenerate_support
import yaml
from regenerate_support import (
    ROOT,
    free_port,
    port_open,
    prompts,
    run_rows,
)

from draftline.engines.servers import ManagedServer, server_url
from draftline.params import parse_params

# shared fixtures (regenerate_support.py)
stub = regenerate_support.stub


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
        "from pathlib import Path\nfrom draftline.engines.servers import ManagedServer\n"
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
    import draftline.engines.servers as servers_module

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
