"""Launching and stopping an OpenAI-compatible server for the target.

The server runs in its own process group with its output in a log file; `ManagedServer` waits for
it to answer, prints the log tail when it does not, and always stops the whole group (also on
Ctrl-C or an exception), escalating from SIGTERM to SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def transformers_serve_command(model: str, host: str, port: int, continuous_batching: bool, cb_num_blocks: int) -> list[str]:
    """`transformers serve` pinned to the target: naming the model preloads it (the port opens once
    it is loaded) and requests must then name exactly the same string.

    Continuous batching is off by default: on CPU it was slower than the plain server, sized its KV
    cache from total RAM (one server took 88% of 24 GB), and kept the sampling settings of the
    first request for all later ones. When on, the cache is bounded by --cb-num-blocks.
    """
    exe = Path(sys.executable).with_name("transformers")
    cmd = [str(exe), "serve", model, "--device", "cuda" if _has_cuda() else "cpu", "--host", host, "--port", str(port)]
    if continuous_batching:
        cmd += ["--continuous-batching", "--cb-num-blocks", str(cb_num_blocks)]
    return cmd


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def server_env(cache_dir: Path) -> dict[str, str]:
    """Offline hub settings: without an existing HF_HUB_CACHE, /v1/models answers 500."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache_dir), "TOKENIZERS_PARALLELISM": "false"})
    return env


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


def wait_healthy(base_url: str, proc: subprocess.Popen, timeout_s: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before it was ready; log tail:\n{log_tail(log_path)}")
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server not healthy after {timeout_s:.0f}s; log tail:\n{log_tail(log_path)}")


def stop_process_group(proc: subprocess.Popen, grace_s: float = 10) -> None:
    """SIGTERM the group, SIGKILL it after grace_s (a batching worker can outlive uvicorn's exit)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


class ManagedServer:
    """`with ManagedServer(cmd, env, base_url, log_path, timeout) as url:` — a ready server."""

    def __init__(self, command: list[str], env: dict[str, str], base_url: str, log_path: Path, startup_timeout_s: float):
        self.command, self.env, self.base_url = command, env, base_url
        self.log_path, self.startup_timeout_s = log_path, startup_timeout_s
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> str:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        try:
            wait_healthy(self.base_url, self.proc, self.startup_timeout_s, self.log_path)
        except BaseException:
            stop_process_group(self.proc)
            raise
        return self.base_url

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            stop_process_group(self.proc)
