"""The target's OpenAI-compatible server: launch commands, lifecycle, and the preflight.

Launch commands are built from params for three engines (flags as defined by each engine's own
argument parser):

- `transformers serve MODEL` (transformers 5.x): naming the model preloads it (the port opens once
  it is loaded) and pins the server to it: a request naming another model gets HTTP 400.
- `vllm serve MODEL`: `--served-model-name`, `--tensor-parallel-size`, `--data-parallel-size`,
  `--max-model-len`, `--reasoning-parser`, `--enable-auto-tool-choice --tool-call-parser`
  (vllm/engine/arg_utils.py, vllm/entrypoints/openai/cli_args.py).
- `python -m sglang.launch_server --model-path MODEL`: `--served-model-name`, `--tp-size`,
  `--dp-size`, `--context-length`, `--reasoning-parser`, `--tool-call-parser`
  (python/sglang/srt/server_args.py).

`ManagedServer` runs the server in its own process group with its output in a log file, waits
for /health (printing the log tail when it fails), and always stops the whole group, also on
Ctrl-C or an exception, escalating from SIGTERM to SIGKILL. The group id goes to a pid file so a
run killed with SIGKILL has its orphaned server stopped by the next run; the server also gets
SIGTERM when the stage process dies (PR_SET_PDEATHSIG). Without a fixed port (params `port:
null`) it picks a free one at start, and when another process takes that port first (two
pipelines on one host) it notices (its server could not bind, or what answers is not its own
process) and tries another. Commands are argv lists, never run through a shell.

`preflight` checks every endpoint before the first request: it serves the card's target under
the expected name, its tokenizer and chat template count the probe prompt as the target's do,
and it is not speculative. What the server is gets probed whatever params declare: every
engine's evidence is read (vLLM: `vllm:` metrics and `vllm:spec_decode_*`, which exist only with a
speculative config; SGLang: /get_server_info and its `speculative_algorithm`; `owned_by` of
/v1/models), a speculative one is refused, and so is one that answers as another engine than
declared. A draft attached to the server, or another model, would change the data without any error.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from draftline.chat import chat_prompt_ids

# Varied text (digits, accents, CJK, emoji, code, markup) so that another tokenizer or template
# is very unlikely to give the same count.
PROBE_MESSAGES = [{"role": "user", "content": "Preflight probe: 7 × 8 = 56; naïve café, 東京, 🙂, "
                                              "`x = [1, 2]`, <b>bold</b> and   spaces.\nDone?"}]


class PreflightError(RuntimeError):
    """An endpoint that must not be used for regeneration; the message says why."""


# ---- launch commands -------------------------------------------------------------------------


def _port_flag(port: int | None) -> list[str]:
    """--port PORT; none for None (the engine's default: a command shown, not launched)."""
    return ["--port", str(port)] if port else []


def transformers_serve_command(model: str, host: str, port: int, device: str, continuous_batching: bool,
                               cb_num_blocks: int, extra_args: list[str], trust_remote_code: bool = False,
                               chat_template_kwargs: dict | None = None) -> list[str]:
    """`transformers serve` pinned to the target.

    Continuous batching is off by default: on CPU it was slower than the plain server, sized its KV
    cache from total RAM (one server took 88% of 24 GB), and kept the sampling settings of the
    first request for all later ones. When on, the cache is bounded by --cb-num-blocks.
    chat_template_kwargs become the server's defaults too (every request also carries them).
    """
    exe = Path(sys.executable).with_name("transformers")
    cmd = [str(exe), "serve", model, "--device", device, "--host", host, *_port_flag(port)]
    if trust_remote_code:
        cmd.append("--trust-remote-code")
    if chat_template_kwargs:
        cmd += ["--chat-template-kwargs", json.dumps(chat_template_kwargs, sort_keys=True)]
    if continuous_batching:
        cmd += ["--continuous-batching", "--cb-num-blocks", str(cb_num_blocks)]
    return cmd + list(extra_args)


def hf_batch_serve_command(module: str, model: str, host: str, port: int, max_batch: int, gather_ms: float,
                           tie_tolerance: float, threads: int | None, stats_file: Path | None,
                           trust_remote_code: bool = False) -> list[str]:
    """`module` (draftline.batch_server) pinned to the target: greedy batches of the requests in flight."""
    cmd = [sys.executable, "-m", module, model, "--host", host, *_port_flag(port),
           "--max-batch", str(max_batch), "--gather-ms", str(gather_ms), "--tie-tolerance", str(tie_tolerance)]
    cmd += ["--stats-file", str(stats_file)] if stats_file else []
    return cmd + (["--threads", str(threads)] if threads else []) + (["--trust-remote-code"] if trust_remote_code else [])


def transformers_serve_loads(architecture: str, config_model_type: str) -> bool:
    """Whether `transformers serve` can load this target: its model manager (transformers 5.x,
    cli/serving/model_manager.py `_load_model`) takes AutoModelForMultimodalLM for the model types
    registered there and otherwise `getattr(transformers, architectures[0])`, so an architecture
    that ships as the checkpoint's own code cannot be served by it, with or without --trust-remote-code."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES

    return config_model_type in MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES or hasattr(transformers, architecture)


def vllm_serve_command(model: str, served_name: str, host: str, port: int, revision: str | None,
                       tensor_parallel_size: int, data_parallel_size: int, max_model_len: int | None,
                       reasoning_parser: str | None, tool_call_parser: str | None, extra_args: list[str],
                       trust_remote_code: bool = False) -> list[str]:
    cmd = ["vllm", "serve", model, "--host", host, *_port_flag(port), "--served-model-name", served_name,
           "--tensor-parallel-size", str(tensor_parallel_size), "--data-parallel-size", str(data_parallel_size)]
    if trust_remote_code:
        cmd.append("--trust-remote-code")
    if revision:
        cmd += ["--revision", revision]
    if max_model_len:
        cmd += ["--max-model-len", str(max_model_len)]
    if reasoning_parser:
        cmd += ["--reasoning-parser", reasoning_parser]
    if tool_call_parser:  # vLLM parses tool calls only with auto tool choice on
        cmd += ["--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser]
    return cmd + list(extra_args)


def sglang_serve_command(model: str, served_name: str, host: str, port: int, revision: str | None,
                         tensor_parallel_size: int, data_parallel_size: int, max_model_len: int | None,
                         reasoning_parser: str | None, tool_call_parser: str | None, extra_args: list[str],
                         trust_remote_code: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--host", host, *_port_flag(port),
           "--served-model-name", served_name, "--tp-size", str(tensor_parallel_size),
           "--dp-size", str(data_parallel_size)]
    if trust_remote_code:
        cmd.append("--trust-remote-code")
    if revision:
        cmd += ["--revision", revision]
    if max_model_len:
        cmd += ["--context-length", str(max_model_len)]
    if reasoning_parser:
        cmd += ["--reasoning-parser", reasoning_parser]
    if tool_call_parser:
        cmd += ["--tool-call-parser", tool_call_parser]
    return cmd + list(extra_args)


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def server_env(cache_dir: Path) -> dict[str, str]:
    """Offline hub settings: without an existing HF_HUB_CACHE, transformers' /v1/models answers 500."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache_dir), "TOKENIZERS_PARALLELISM": "false"})
    return env


# ---- lifecycle -------------------------------------------------------------------------------


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
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
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
# MoE gets ~45 min, twice the 20+ min such targets were seen to take. A server that dies fails at
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


def startup_timeout_s(explicit: float | None, model: str, revision: str | None = None) -> tuple[float, str]:
    """(seconds, how they were chosen): the param when given, else derived from the checkpoint size."""
    if explicit is not None:
        return float(explicit), "set in params"
    size = checkpoint_bytes(model, revision)
    if size is None:
        return STARTUP_UNKNOWN_SIZE_S, "checkpoint size unknown"
    return round(STARTUP_BASE_S + STARTUP_S_PER_GB * size / 1e9), f"{size / 1e9:.1f} GB on disk"


def wait_healthy(base_url: str, proc: subprocess.Popen, timeout_s: float, log_path: Path, say=None,
                 progress_every_s: float = 30.0, check_owner: bool = False) -> None:
    """Poll /health until it answers 200 from the server `proc` started; every progress_every_s a
    line (elapsed, limit, the log's last line) through `say`. A server that exits fails at once with
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
                raise PortTaken(f"{base_url}: another process holds the port; the server exited with code "
                                f"{proc.returncode}; last lines of {log_path}:\n{tail}")
            raise RuntimeError(f"server exited with code {proc.returncode} before it was ready "
                               f"(after {time.monotonic() - start:.0f}s); last lines of {log_path}:\n{tail}")
        try:
            healthy = httpx.get(f"{base_url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            healthy = False
        if healthy:
            if check_owner and listener_is_ours(port, proc.pid) is False:
                raise PortTaken(f"{base_url} answers, but from a process this stage did not start (another pipeline "
                                "took the port first)")
            return
        now = time.monotonic()
        if say is not None and now - last_line >= progress_every_s:
            last_line = now
            say(f"server: loading, {now - start:.0f}s of {timeout_s:.0f}s; log: {log_tail(log_path, 1).strip()[-160:]}")
        time.sleep(0.5)
    raise RuntimeError(f"server not healthy after {timeout_s:.0f}s (a larger checkpoint needs a larger startup_timeout_s); "
                       f"last lines of {log_path}:\n{log_tail(log_path)}")


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
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp ...
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
        ours = any(Path(part.decode(errors="replace")).name == Path(cmd0).name for part in cmdline if part)
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

    def __init__(self, command, env: dict[str, str] | None, base_url: str, log_path: Path,
                 startup_timeout_s: float, pid_file: Path | None = None, say=None):
        self.command, self.env, self.base_url = command, env, base_url
        self.log_path, self.startup_timeout_s, self.say = log_path, startup_timeout_s, say
        self.pid_file = pid_file or log_path.with_suffix(".pid")
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> str:
        host, port = _split_url(self.base_url)
        if stop_orphan(self.pid_file):
            print(f"stopped the server a killed run left behind ({self.pid_file})", file=sys.stderr)
            deadline = time.monotonic() + 10  # its listening socket closes as the process finishes exiting
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
                raise RuntimeError(f"{self.base_url} is already in use by another process; choose another port "
                                   "(or null: a free one is chosen at start)")
            url = f"http://{host}:{port}"
            try:
                self._start(self.command(port) if callable(self.command) else self.command, url, auto)
            except PortTaken as err:
                if not auto:
                    raise RuntimeError(f"{err}; choose another port (or null: a free one is chosen at start)") from None
                print(f"port {port} was taken by another process; trying another ({attempt + 1}/{self.PORT_ATTEMPTS})",
                      file=sys.stderr)
                continue
            self.base_url = url
            return url
        raise RuntimeError(f"no free port held for {self.PORT_ATTEMPTS} attempts on {host}: other processes took each "
                           "one first, or what answers is not the launched process (a launcher such as a container "
                           "runtime: give the server a fixed port)")

    def _start(self, command: list[str], url: str, check_owner: bool) -> None:
        preexec = _die_with_parent if sys.platform.startswith("linux") else None
        with open(self.log_path, "w") as log:  # an argv list: no shell sees the params
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                         start_new_session=True, preexec_fn=preexec)
        self.pid_file.write_text(f"{self.proc.pid} {command[0]}\n")
        try:
            wait_healthy(url, self.proc, self.startup_timeout_s, self.log_path, self.say, check_owner=check_owner)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc is not None:
            kill_group(self.proc.pid, leader=self.proc)
            self.proc.wait()
            self.pid_file.unlink(missing_ok=True)
            self.proc = None

    def __exit__(self, *exc) -> None:
        self.stop()


# ---- preflight -------------------------------------------------------------------------------


def _request(client, method: str, url: str, attempts: int, **kwargs):
    """One HTTP call, retried (1 s, 2 s, ...) on connection errors, timeouts, 429 and 5xx."""
    import httpx

    for attempt in range(attempts):
        try:
            resp = client.request(method, url, **kwargs)
            if resp.status_code != 429 and resp.status_code < 500:
                return resp
            error = f"HTTP {resp.status_code}"
        except httpx.HTTPError as err:
            error = f"{type(err).__name__}: {err}"
        if attempt + 1 < attempts:
            time.sleep(min(2 ** attempt, 10))
    raise PreflightError(f"{url}: no answer after {attempts} attempts ({error})")


def _answer(client, method: str, url: str, attempts: int):
    """`_request`, or None when the endpoint never answers (a path this engine does not have)."""
    try:
        return _request(client, method, url, attempts)
    except PreflightError:
        return None


def probe_engine(client, base_url: str, attempts: int, models: list) -> dict:
    """What the server shows of itself, whatever params say it is: the engines it answers as
    ("vllm", "sglang"), which of them could be checked for speculative decoding, and any sign
    that it decodes speculatively.

    vLLM: `vllm:` metrics on /metrics, where `vllm:spec_decode_*` exist only with
    --speculative-config (vllm/v1/spec_decode/metrics.py); a dev-mode /server_info with its
    vllm_config. SGLang: /get_server_info (newer: /server_info) with `speculative_algorithm`;
    `sglang:` metrics. Both: `owned_by` of /v1/models. transformers serve has none of these and
    no speculative mode."""
    engines, checked, speculative, facts = set(), set(), [], {}
    resp = _answer(client, "GET", f"{base_url}/metrics", attempts)
    text = resp.text if resp is not None and resp.status_code == 200 else ""
    if re.search(r"^vllm:", text, re.M):
        engines.add("vllm")
        checked.add("vllm")
    if re.search(r"^sglang:", text, re.M):
        engines.add("sglang")
    if spec := sorted(set(re.findall(r"vllm:spec_decode\w*", text))):
        speculative.append(f"vLLM metrics {', '.join(spec)} (they exist only with --speculative-config)")
    for path in ("/get_server_info", "/server_info"):
        resp = _answer(client, "GET", f"{base_url}{path}", attempts)
        try:
            info = resp.json() if resp is not None and resp.status_code == 200 else None
        except ValueError:
            info = None
        if isinstance(info, dict) and "speculative_algorithm" in info:
            engines.add("sglang")
            checked.add("sglang")
            facts.update(speculative_algorithm=info["speculative_algorithm"], model_path=info.get("model_path"))
            if info["speculative_algorithm"]:
                speculative.append(f"SGLang speculative_algorithm={info['speculative_algorithm']} "
                                   f"(draft {info.get('speculative_draft_model_path')})")
            break
        if isinstance(info, dict) and "vllm_config" in info:  # vLLM with VLLM_SERVER_DEV_MODE
            engines.add("vllm")
            checked.add("vllm")
            found = re.search(r"speculative_config=([^,)]+)", str(info["vllm_config"]))
            if found and found.group(1).strip() != "None":
                speculative.append(f"vLLM /server_info speculative_config={found.group(1).strip()}")
            break
    for entry in models:
        if isinstance(entry, dict) and entry.get("owned_by") in ("vllm", "sglang"):
            engines.add(entry["owned_by"])
    return {"engines": sorted(engines), "checked": sorted(checked), "speculative": speculative, **facts}


def check_engine(base_url: str, declared: str, probe: dict) -> None:
    """Refuse a speculative server whatever was declared; refuse one that answers as another
    engine than declared, or that cannot be checked for a draft as the engine it is."""
    if probe["speculative"]:
        raise PreflightError(f"{base_url}: the server runs speculative decoding ({'; '.join(probe['speculative'])}); "
                             "it must serve the plain target: start it without a draft")
    if probe["engines"] and declared not in probe["engines"]:
        raise PreflightError(f"{base_url} answers as {' and '.join(probe['engines'])}, not {declared} as declared "
                             "(regenerate.external_engine or benchmark.engine; for a launched server, another "
                             "process holds the port); say what it is so the right checks run")
    if declared in ("vllm", "sglang") and declared not in probe["checked"]:
        how = ("/metrics has no vllm: metrics (not vLLM, or started with --disable-log-stats)" if declared == "vllm"
               else "/get_server_info has no speculative_algorithm")
        raise PreflightError(f"{base_url}: {how}, so it cannot be checked for a draft; check regenerate.external_engine")


def listed_models(client, base_url: str, attempts: int) -> list:
    """The entries of /v1/models ([] when it does not answer with a list)."""
    try:
        resp = _request(client, "GET", f"{base_url}/v1/models", attempts)
        models = resp.json().get("data", []) if resp.status_code == 200 else []
    except (PreflightError, ValueError, AttributeError):
        return []
    return models if isinstance(models, list) else []


def check_not_speculative(client, base_url: str, engine: str, attempts: int) -> dict:
    """What the server says about speculative decoding, probed whatever `engine` declares
    (probe_engine, check_engine); raises PreflightError when it decodes speculatively, answers as
    another engine, or cannot be checked. Returns vLLM: spec_decode_metrics False; SGLang:
    speculative_algorithm None and its model_path."""
    from draftline.config import redact_url

    probe = probe_engine(client, base_url, attempts, listed_models(client, base_url, attempts))
    check_engine(redact_url(base_url), engine, probe)
    if engine == "vllm":
        return {"spec_decode_metrics": False}
    if engine == "sglang":
        return {"speculative_algorithm": None, "model_path": probe.get("model_path")}
    return {}


def preflight(base_url: str, engine: str, model_name: str, tokenizer, chat_template_kwargs: dict,
              api_key: str | None = None, timeout_s: float = 60, attempts: int = 4) -> dict:
    """Check one endpoint before the first request (see the module docstring); returns what it saw."""
    import httpx

    from draftline.config import redact_url

    shown = redact_url(base_url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(timeout=timeout_s, headers=headers) as client:
        # transformers serve lists only hub-cached models (none for a local path; HTTP 500 without
        # an HF_HUB_CACHE); it is pinned to the model it was started with and answers 400 to any
        # other name: the probe below checks both.
        models = listed_models(client, base_url, attempts)
        probe = probe_engine(client, base_url, attempts, models)
        check_engine(shown, engine, probe)
        seen = {"url": shown, "engine": engine, "answers_as": probe["engines"] or [engine],
                **{k: v for k, v in probe.items() if k not in ("engines", "checked", "speculative")},
                "speculative": False}

        served = [m.get("id") for m in models if isinstance(m, dict)]
        if served and model_name not in served:
            raise PreflightError(f"{shown} serves {served}, not the target {model_name!r} of the card; "
                                 "point regenerate at the target's server (or set regenerate.served_model_name)")
        seen["served_models"] = served

        expected = chat_prompt_ids(tokenizer, PROBE_MESSAGES, None, chat_template_kwargs)
        body = {"model": model_name, "messages": PROBE_MESSAGES, "max_tokens": 1, "temperature": 0.0}
        if chat_template_kwargs:
            body["chat_template_kwargs"] = chat_template_kwargs
        resp = _request(client, "POST", f"{base_url}/v1/chat/completions", attempts, json=body)
        if resp.status_code != 200:
            raise PreflightError(f"{shown}: the probe request for model {model_name!r} got HTTP {resp.status_code}: "
                                 f"{resp.text[:300]}")
        counted = (resp.json().get("usage") or {}).get("prompt_tokens")
        if counted != len(expected):
            raise PreflightError(f"{shown}: the server counts {counted} prompt tokens for the probe, the target's "
                                 f"tokenizer and chat template {len(expected)}: it serves another model, tokenizer or "
                                 "chat template than the card's target")
        seen["probe_prompt_tokens"] = counted

        if engine == "vllm":  # exact ids through vLLM's /tokenize (chat form)
            tok = _request(client, "POST", f"{base_url}/tokenize", attempts,
                           json={"model": model_name, "messages": PROBE_MESSAGES, "add_generation_prompt": True,
                                 **({"chat_template_kwargs": chat_template_kwargs} if chat_template_kwargs else {})})
            if tok.status_code == 200:
                if tok.json().get("tokens") != expected:
                    raise PreflightError(f"{shown}: vLLM's /tokenize gives other token ids for the probe than the "
                                         "target's tokenizer and chat template")
                seen["probe_token_ids"] = "match"
    return seen
