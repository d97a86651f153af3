"""Long loads: the start-up limit derived from the checkpoint size, progress lines while waiting,
and the server log's last lines when it dies before it is ready."""

import subprocess
import sys

import pytest

from draftline import servers


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

    def say(line):
        lines.append(line)
        marker.touch()

    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-c", child], stdout=f, stderr=subprocess.STDOUT)
    with pytest.raises(
        RuntimeError, match=r"(?s)exited with code 3.*loading shard 59.*CUDA out of memory"
    ):
        servers.wait_healthy("http://127.0.0.1:9", proc, 600, log, say, progress_every_s=0)
    assert (
        lines
        and lines[0].startswith("server: loading,")
        and "of 600s" in lines[0]
        and "loading shard" in lines[0]
    )
