"""Server processes and nothing else: launch, health, stop, ports.

`ManagedServer` runs a server in its own process group with its output in a log file, waits for
/health (its progress logged, the log tail in the error when it fails), and always stops the
whole group, also on Ctrl-C or an exception, escalating from SIGTERM to SIGKILL. The group id goes to a pid file so a run
killed with SIGKILL has its orphaned server stopped by the next run; the server also gets SIGTERM
when the stage process dies (PR_SET_PDEATHSIG). Without a fixed port (params `port: null`) it
picks a free one at start, and when another process takes that port first (two pipelines on one
host) it notices (its server could not bind, or what answers is not its own process) and tries
another. Commands are argv lists, never run through a shell; draftline/engines/commands.py builds them.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from draftline.engines.config import vllm_engine

log = logging.getLogger(__name__)


def has_cuda() -> bool:
    try:
        # torch loads only to ask for CUDA: launching and stopping servers need none
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def server_env(cache_dir: Path) -> dict[str, str]:
    """Offline hub settings for `transformers serve` with a local model directory: without
    HF_HUB_OFFLINE and an existing HF_HUB_CACHE, its /v1/models answers 500. Nothing else gets them:
    a server given a hub id must find the user's own cache (`launch_env`)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(
        {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache_dir), "TOKENIZERS_PARALLELISM": "false"}
    )
    return env


def launch_env(engine: str, model: str, cache_dir: Path) -> dict[str, str]:
    """The environment of a server the stage launches for `model`. `transformers serve` with a local
    directory gets `server_env(cache_dir)`; every other server (vLLM, SGLang, the built-in hf server,
    transformers serve given a hub id) runs with the stage's own environment: the user's HF_HUB_CACHE /
    HF_HOME, HF_TOKEN and network settings, offline only where HF_HUB_OFFLINE is set there."""
    if engine == "transformers" and Path(model).is_dir():
        return server_env(cache_dir)
    env = dict(os.environ)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if engine == "vllm":  # VLLM_CPU_KVCACHE_SPACE for the CPU build (engines.vllm)
        env = vllm_engine().env(env)
    return env


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) == 0


def free_port(host: str) -> int:
    """A port nothing listens on now (the kernel's pick); the server binds it a moment later, so
    ManagedServer checks that what answers there is its own."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def server_url(host: str, port: int | None) -> str:
    """Base URL for ManagedServer; port None (params `port: null`) = a free port chosen at start."""
    return f"http://{host}:{port or 0}"


def _split_url(base_url: str) -> tuple[str, int]:
    host, port = base_url.split("//", 1)[1].rsplit(":", 1)
    return host.strip("[]"), int(port.rstrip("/"))


def _listening_inodes(port: int) -> set[str] | None:
    """Inodes of the TCP sockets listening on `port` in this network namespace (Linux); None elsewhere."""
    found, readable = set(), False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()  # sl local_address rem_address st ... inode (index 9)
            if (
                len(fields) > 9
                and fields[3] == "0A"
                and int(fields[1].rsplit(":", 1)[1], 16) == port
            ):
                found.add(fields[9])
    return found if readable else None


def _holds_socket(pid: str, inodes: set[str]) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            return True
    return False


def listener_is_ours(port: int, pgid: int) -> bool | None:
    """Whether the process listening on `port` belongs to process group `pgid`: True, False (a
    process we can see, outside the group: another pipeline's server), or None when it cannot be
    told (no /proc, or a listener we may not inspect, e.g. a container runtime's proxy)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    others = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # state ppid pgrp ...
        except (OSError, IndexError):
            continue
        pid = stat.parent.name
        if int(fields[2]) == pgid:
            if _holds_socket(pid, inodes):
                return True
        else:
            others.append(pid)
    return False if any(_holds_socket(pid, inodes) for pid in others) else None


class PortTaken(RuntimeError):
    """Another process got the port a server was started on."""


# Start-up time: a checkpoint is read from disk (or page cache) and moved to the devices. 300 s for
# the engine itself (CUDA graphs, compilation), then 4 s per GB on disk (250 MB/s): a 600 GB INT4
# MoE gets 45 min, twice the 20+ min such targets were seen to take. A server that dies fails at
# once whatever the limit; only a hung one waits it out.
STARTUP_BASE_S = 300.0
STARTUP_S_PER_GB = 4.0
STARTUP_UNKNOWN_SIZE_S = 3600.0  # a hub id not in the local cache: size unknown until downloaded


def checkpoint_bytes(model: str, revision: str | None = None) -> int | None:
    """Size of the weight files of a local directory, or of a hub model in the local cache; None if unknown."""
    root = Path(model)
    if not root.is_dir():
        try:
            from huggingface_hub import snapshot_download

            root = Path(snapshot_download(model, revision=revision, local_files_only=True))
        except Exception:  # not cached (or not a hub id): unknown until downloaded
            return None
    files = [f for f in root.iterdir() if f.suffix in {".safetensors", ".bin", ".pt", ".gguf"}]
    return sum(f.stat().st_size for f in files) if files else None


def startup_timeout_s(
    explicit: float | None, model: str, revision: str | None = None
) -> tuple[float, str]:
    """(seconds, how they were chosen): the param when given, else derived from the checkpoint size."""
    if explicit is not None:
        return float(explicit), "set in params"
    size = checkpoint_bytes(model, revision)
    if size is None:
        return STARTUP_UNKNOWN_SIZE_S, "checkpoint size unknown"
    return round(STARTUP_BASE_S + STARTUP_S_PER_GB * size / 1e9), f"{size / 1e9:.1f} GB on disk"


def wait_healthy(
    base_url: str,
    proc: subprocess.Popen,
    timeout_s: float,
    log_path: Path,
    progress_every_s: float = 30.0,
    check_owner: bool = False,
) -> None:
    """Poll /health until it answers 200 from the server `proc` started; every progress_every_s a
    line (elapsed, limit, the log's last line) logged. A server that exits fails at once with
    its log's last lines; PortTaken when another process holds its port (it exited unable to bind,
    or, with check_owner, what answers is a process outside its group)."""
    import httpx

    host, port = _split_url(base_url)
    start = last_line = time.monotonic()
    deadline = start + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_tail(log_path)
            if port_in_use(host, port) or "address already in use" in tail.lower():
                raise PortTaken(
                    f"{base_url}: another process holds the port; the server exited with code "
                    f"{proc.returncode}; last lines of {log_path}:\n{tail}"
                )
            raise RuntimeError(
                f"server exited with code {proc.returncode} before it was ready "
                f"(after {time.monotonic() - start:.0f}s); last lines of {log_path}:\n{tail}"
            )
        try:
            healthy = httpx.get(f"{base_url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            healthy = False
        if healthy:
            if check_owner and listener_is_ours(port, proc.pid) is False:
                raise PortTaken(
                    f"{base_url} answers, but from a process this stage did not start (another pipeline "
                    "took the port first)"
                )
            return
        now = time.monotonic()
        if now - last_line >= progress_every_s:
            last_line = now
            log.info(
                f"server: loading, {now - start:.0f}s of {timeout_s:.0f}s; log: {log_tail(log_path, 1).strip()[-160:]}"
            )
        time.sleep(0.5)
    raise RuntimeError(
        f"server not healthy after {timeout_s:.0f}s (a larger checkpoint needs a larger startup_timeout_s); "
        f"last lines of {log_path}:\n{log_tail(log_path)}"
    )


def group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs (zombies, which hold no port, do not count)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = (
                stat.read_text().rsplit(")", 1)[1].split()
            )  # after "pid (comm)": state ppid pgrp ...
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def kill_group(pgid: int, grace_s: float = 10, leader: subprocess.Popen | None = None) -> None:
    """SIGTERM the group, SIGKILL whatever is left after grace_s (with continuous batching the
    server sometimes outlived a first SIGTERM; worker processes can outlive the leader)."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if leader is not None:
            leader.poll()  # reap it once it exits
        if not group_alive(pgid):
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def stop_orphan(pid_file: Path) -> bool:
    """Stop the server group a killed run left behind (its pid file survived); True if one was."""
    try:
        pgid, cmd0 = pid_file.read_text().split("\n", 1)[0].split(" ", 1)
        pgid = int(pgid)
    except (OSError, ValueError):
        return False
    try:  # the leader still runs the server's program (its pid was not reused by another one)
        cmdline = Path(f"/proc/{pgid}/cmdline").read_bytes().split(b"\0")
        ours = any(
            Path(part.decode(errors="replace")).name == Path(cmd0).name for part in cmdline if part
        )
    except OSError:  # the leader is gone: processes left in its group can only be its own
        ours = True
    found = ours and group_alive(pgid)
    if found:
        kill_group(pgid)
    pid_file.unlink(missing_ok=True)
    return found


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the stage process dies, even by SIGKILL."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class ManagedServer:
    """`with ManagedServer(cmd, env, base_url, log_path, timeout) as url:` — a ready server.

    `command` is the argv, or a function port -> argv. With port 0 in base_url (`server_url(host,
    None)`) it must be a function: a free port is picked at start, and another one (up to
    PORT_ATTEMPTS) when another process takes it first. `url` is the server's actual base URL."""

    PORT_ATTEMPTS = 5

    def __init__(
        self,
        command,
        env: dict[str, str] | None,
        base_url: str,
        log_path: Path,
        startup_timeout_s: float,
        pid_file: Path | None = None,
    ):
        self.command, self.env, self.base_url = command, env, base_url
        self.log_path, self.startup_timeout_s = log_path, startup_timeout_s
        self.pid_file = pid_file or log_path.with_suffix(".pid")
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None  # launch to healthy, once started

    def __enter__(self) -> str:
        host, port = _split_url(self.base_url)
        if stop_orphan(self.pid_file):
            log.warning(f"stopped the server a killed run left behind ({self.pid_file})")
            deadline = (
                time.monotonic() + 10
            )  # its listening socket closes as the process finishes exiting
            while port and port_in_use(host, port) and time.monotonic() < deadline:
                time.sleep(0.1)
        auto = port == 0
        if auto and not callable(self.command):
            raise ValueError("a port chosen at start needs the command as a function of the port")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(self.PORT_ATTEMPTS if auto else 1):
            if auto:
                port = free_port(host)
            elif port_in_use(host, port):
                # a health check would pass against whatever listens there, possibly another model
                raise RuntimeError(
                    f"{self.base_url} is already in use by another process; choose another port "
                    "(or null: a free one is chosen at start)"
                )
            url = f"http://{host}:{port}"
            try:
                self._start(
                    self.command(port) if callable(self.command) else self.command, url, auto
                )
            except PortTaken as err:
                if not auto:
                    raise RuntimeError(
                        f"{err}; choose another port (or null: a free one is chosen at start)"
                    ) from None
                log.warning(
                    f"port {port} was taken by another process; trying another ({attempt + 1}/{self.PORT_ATTEMPTS})"
                )
                continue
            self.base_url = url
            return url
        raise RuntimeError(
            f"no free port held for {self.PORT_ATTEMPTS} attempts on {host}: other processes took each "
            "one first, or what answers is not the launched process (a launcher such as a container "
            "runtime: give the server a fixed port)"
        )

    def _start(self, command: list[str], url: str, check_owner: bool) -> None:
        preexec = _die_with_parent if sys.platform.startswith("linux") else None
        with open(self.log_path, "w") as server_log:  # an argv list: no shell sees the params
            self.proc = subprocess.Popen(
                command,
                stdout=server_log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
                preexec_fn=preexec,
            )
        self.pid_file.write_text(f"{self.proc.pid} {command[0]}\n")
        started = time.monotonic()
        try:
            wait_healthy(
                url,
                self.proc,
                self.startup_timeout_s,
                self.log_path,
                check_owner=check_owner,
            )
        except BaseException:
            self.stop()
            raise
        self.startup_s = round(time.monotonic() - started, 1)  # launch to healthy
        log.info(f"server at {url} ready in {self.startup_s} s (log: {self.log_path})")

    def stop(self) -> None:
        if self.proc is not None:
            kill_group(self.proc.pid, leader=self.proc)
            self.proc.wait()
            self.pid_file.unlink(missing_ok=True)
            self.proc = None

    def __exit__(self, *exc) -> None:
        self.stop()
