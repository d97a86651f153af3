"""Long loads: the start-up limit derived from the checkpoint size, progress lines while waiting,
and the server log's last lines when it dies before it is ready; the environment a launched server
gets (the user's hub cache and network settings, the offline trick only for transformers serve of a
local directory)."""

import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from draftline.engines import servers


def test_startup_limit_grows_with_checkpoint_size_and_params_override(tmp_path):
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 3_000_000)
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"\0" * 2_000_000)
    (tmp_path / "config.json").write_text("{}")
    assert servers.checkpoint_bytes(str(tmp_path)) == 5_000_000
    limit, why = servers.startup_timeout_s(None, str(tmp_path))
    assert (
        limit == round(servers.STARTUP_BASE_S + servers.STARTUP_S_PER_GB * 0.005)
        and "GB on disk" in why
    )
    # a 600 GB checkpoint (an INT4 trillion-parameter MoE) gets well over the 20+ minutes it takes
    assert servers.STARTUP_BASE_S + servers.STARTUP_S_PER_GB * 600 > 2 * 20 * 60
    assert servers.startup_timeout_s(42, str(tmp_path)) == (42.0, "set in params")
    assert (
        servers.startup_timeout_s(None, "no-such-org/not-cached")[0]
        == servers.STARTUP_UNKNOWN_SIZE_S
    )


def test_progress_lines_while_loading_then_the_log_tail_when_it_dies(tmp_path):
    """The child 'loads' until it has been reported on once, then dies: the error carries its last lines."""
    marker = tmp_path / "reported"
    child = (
        f"import pathlib, time\nfor i in range(60): print(f'loading shard {{i}}', flush=True)\n"
        f"while not pathlib.Path({str(marker)!r}).exists(): time.sleep(0.05)\n"
        "print('CUDA out of memory while loading layer 61', flush=True)\nraise SystemExit(3)\n"
    )
    log = tmp_path / "server.log"
    lines = []

    class Reported(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())
            marker.touch()

    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-c", child], stdout=f, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60  # the first progress line quotes the log: let it be written
    while "loading shard 59" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    handler = Reported()
    servers.log.addHandler(handler)
    try:
        with pytest.raises(
            RuntimeError, match=r"(?s)exited with code 3.*loading shard 59.*CUDA out of memory"
        ):
            servers.wait_healthy("http://127.0.0.1:9", proc, 600, log, progress_every_s=0)
    finally:
        servers.log.removeHandler(handler)
    assert (
        lines
        and lines[0].startswith("server: loading,")
        and "of 600s" in lines[0]
        and "loading shard" in lines[0]
    )


class Launched(Exception):
    """Raised instead of starting the server: the launch was recorded."""


def launch_of(monkeypatch, tmp_path, card, backend: str) -> tuple[list[str], dict]:
    """(argv, environment) the regenerate stage would launch its `backend` server with."""
    import yaml

    from draftline.params import parse_params
    from draftline.regenerate import run as regeneration_run
    from draftline.targets import model as target

    raw = yaml.safe_load((Path(__file__).resolve().parents[2] / "params.yaml").read_text())
    raw["regenerate"].update(backend=backend, port=8123, temperature=0)
    cfg = parse_params(raw).regenerate
    launched = {}

    class Recorder:
        def __init__(self, command, env, base_url, *args, **kwargs):
            launched["argv"] = command(8123) if callable(command) else command
            launched["env"] = env

        def __enter__(self):
            raise Launched

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(servers, "ManagedServer", Recorder)
    monkeypatch.setattr(target, "card_tokenizer", lambda card: None)
    run = regeneration_run.RegenerateRun(cfg, card, backend, card.model, None, tmp_path / "out")
    nothing = regeneration_run.Pending({}, {}, None, {}, None, [])
    with pytest.raises(Launched):
        regeneration_run.send(run, nothing)
    return launched["argv"], launched["env"]


@pytest.mark.parametrize("backend", ["vllm", "sglang", "hf"])
@pytest.mark.parametrize("offline", [None, "1"])
def test_a_hub_id_is_served_with_the_users_hub_cache_and_network(
    monkeypatch, tmp_path, random_target, backend, offline
):
    """`vllm serve moonshotai/...` must find the user's hub cache and token; offline only if the
    stage itself runs offline. The regenerate stage used to force HF_HUB_OFFLINE=1 and an empty
    HF_HUB_CACHE of its own on every server it launched."""
    import dataclasses

    hub_id = "moonshotai/Kimi-K2.5"
    user = {
        "HF_HOME": str(tmp_path / "home"),
        "HF_HUB_CACHE": str(tmp_path / "home/hub"),
        "HF_TOKEN": "hf_user_token",
    }
    for name, value in user.items():
        monkeypatch.setenv(name, value)
    if offline is None:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    else:
        monkeypatch.setenv("HF_HUB_OFFLINE", offline)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    card = dataclasses.replace(random_target, model=hub_id)
    argv, env = launch_of(monkeypatch, tmp_path, card, backend)
    assert hub_id in argv
    if backend == "vllm":
        assert argv[argv.index("--model") + 1] == hub_id
        assert env["VLLM_CPU_KVCACHE_SPACE"] == "4"  # engines.vllm.cpu_kvcache_space_gb
        assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # the CPU worker in the engine core
    elif backend == "sglang":
        assert argv[argv.index("--model-path") + 1] == hub_id
    assert {name: env.get(name) for name in user} == user
    assert env.get("HF_HUB_OFFLINE") == offline
    assert not (tmp_path / "out/.hf_cache").exists()


def test_transformers_serve_of_a_local_directory_keeps_its_offline_settings(
    monkeypatch, tmp_path, random_target
):
    """With a local model, `transformers serve` answers /v1/models only offline and with an
    existing HF_HUB_CACHE: that stays, for it alone."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "user_hub"))
    argv, env = launch_of(monkeypatch, tmp_path, random_target, "transformers")
    assert argv[argv.index("serve") + 1] == random_target.model
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["HF_HUB_CACHE"] == str(tmp_path / "out/.hf_cache")
    assert (tmp_path / "out/.hf_cache").is_dir()


def test_vllm_sockets_leave_a_temporary_directory_too_long_for_a_socket_path(tmp_path):
    """vLLM names its engine sockets TMPDIR/<uuid4>; past 107 bytes the server dies at start-up
    (ZMQError: ipc path is longer than 107 characters), as it did under a deep test tmp_path."""
    from draftline.engines.config import VllmEngineConfig

    engine = VllmEngineConfig()
    deep = str(tmp_path / ("d" * 80))
    assert engine.env({"TMPDIR": deep})["VLLM_RPC_BASE_PATH"] == "/tmp"
    assert "VLLM_RPC_BASE_PATH" not in engine.env({"TMPDIR": "/tmp/short"})
    # the user's own choice wins
    chosen = {"TMPDIR": deep, "VLLM_RPC_BASE_PATH": "/run/vllm"}
    assert engine.env(chosen)["VLLM_RPC_BASE_PATH"] == "/run/vllm"
