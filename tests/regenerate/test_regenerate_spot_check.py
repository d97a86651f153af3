"""The spot-check of kept conversations (draftline/regenerate/spot_check.py) on real servers: the
built-in batch server scores the answers it made and passes them; a batch server on another model
behind `external` is caught before anything is moved or sent."""

import json
import sys

import regenerate_support
from regenerate_support import output_rows, prompts, run_stage, stage_dir

from draftline.engines.servers import ManagedServer, free_port, server_env

chatty_target = regenerate_support.chatty_target


def batch_server(model: str, served_name: str, log_dir):
    port = free_port("127.0.0.1")
    cmd = [
        sys.executable,
        "-m",
        "draftline.engines.batch_server",
        model,
        "--port",
        str(port),
        "--served-model-name",
        served_name,
    ]
    return ManagedServer(
        cmd, server_env(log_dir / "hf"), f"http://127.0.0.1:{port}", log_dir / "server.log", 120
    )


def test_kept_answers_are_scored_and_a_server_on_another_model_stops_the_stage(
    tmp_path, chatty_target, tiny_tokenizer
):
    from tests.conftest import random_llama

    rows = prompts(5)
    common = dict(max_tokens=8, short={"concurrency": 2, "max_context": None})
    (tmp_path / "w").mkdir()
    workdir = stage_dir(
        tmp_path / "w", chatty_target, rows[:3], port=free_port("127.0.0.1"), **common
    )
    proc = run_stage(workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]

    # a rerun on the launched batch server, one more prompt: the three kept ones scored and kept
    stage_dir(workdir, chatty_target, rows[:4], port=free_port("127.0.0.1"), **common)
    proc = run_stage(workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    spot = json.loads((workdir / "report.json").read_text())["spot_check"]
    assert spot["checked"] == 3 and spot["tokens"] > 0 and spot["not_run"] is None
    assert "spot-check: 3 kept conversations scored" in proc.stdout
    kept = (workdir / "out/conversations.jsonl").read_bytes()

    # the same path served by a server running another model (other weights, same tokenizer)
    other = random_llama(tmp_path / "other", tiny_tokenizer, num_hidden_layers=4)
    with batch_server(other.model, chatty_target.model, tmp_path / "served") as url:
        stage_dir(
            workdir,
            chatty_target,
            rows,
            backend="external",
            endpoints=[url],
            external_engine="hf",
            **common,
        )
        proc = run_stage(workdir)
    assert proc.returncode != 0
    assert "the spot-check of kept conversations failed" in proc.stderr
    assert (
        "nats below the server's pick" in proc.stderr and "resume.verify_sample: 0" in proc.stderr
    )
    assert (workdir / "out/conversations.jsonl").read_bytes() == kept  # nothing moved or sent
    assert len(output_rows(workdir)) == 4

    # nothing to send (the four kept prompts only): the kept ones are still scored, and caught
    with batch_server(other.model, chatty_target.model, tmp_path / "served2") as url:
        stage_dir(
            workdir,
            chatty_target,
            rows[:4],
            backend="external",
            endpoints=[url],
            external_engine="hf",
            **common,
        )
        proc = run_stage(workdir)
    assert proc.returncode != 0 and "the spot-check of kept conversations failed" in proc.stderr
    assert (workdir / "out/conversations.jsonl").read_bytes() == kept

    # and with the launched server on the target itself, nothing to send: scored and passed
    stage_dir(workdir, chatty_target, rows[:4], port=free_port("127.0.0.1"), **common)
    proc = run_stage(workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((workdir / "report.json").read_text())
    assert report["sent"] == 0 and report["spot_check"]["checked"] == 4
