"""Mooncake transfer: a real mooncake_master on 127.0.0.1, our producer publishing the random
target's captured states, and the trainer side reading them through hs-connectors'
MooncakeTransfer built from the speculators.train arguments our params give.

Skipped where the Mooncake transfer engine is not installed (it is an optional dependency:
`pip install mooncake-transfer-engine-non-cuda` plus `apt-get install libibverbs1` on CPU hosts)."""

import argparse
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import torch

from draftline import hidden, speculators_states
from draftline.config import HiddenStatesConfig


def mooncake_master_binary() -> str | None:
    try:
        import mooncake
    except ImportError:
        return None
    packaged = Path(mooncake.__file__).parent / "mooncake_master"
    return str(packaged) if packaged.is_file() else shutil.which("mooncake_master")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def master(tmp_path):
    pytest.importorskip("mooncake.store", reason="Mooncake transfer engine not installed")
    binary = mooncake_master_binary()
    if binary is None:
        pytest.skip("mooncake_master not found")
    port = free_port()
    log = open(tmp_path / "master.log", "w")
    proc = subprocess.Popen(
        [
            binary,
            "--rpc_address=127.0.0.1",
            f"--rpc_port={port}",
            "--enable_http_metadata_server=false",
            f"--metrics_port={free_port()}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        assert proc.poll() is None, (tmp_path / "master.log").read_text()[-2000:]
        assert time.monotonic() < deadline, "mooncake_master did not listen"
        time.sleep(0.1)
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


def test_states_move_from_our_producer_to_the_trainer_through_mooncake(
    master, random_target, monkeypatch
):
    from hs_connectors import HiddenStatesBackend
    from hs_connectors.mooncake_store import MooncakeHiddenStatesStore, MooncakeStoreConfig
    from speculators.train.config import TrainConfig as SpeculatorsTrainConfig

    from draftline.mooncake import publish
    from draftline.target import load_target_model

    monkeypatch.setenv("MOONCAKE_LOCAL_HOSTNAME", "127.0.0.1")
    hs = HiddenStatesConfig(
        mode="online",
        online={
            "transfer": "mooncake",
            "mooncake": {
                "master": master,
                "global_segment_gib": 0.0625,
                "local_buffer_gib": 0.0625,
            },
        },
    )
    online = hs.online.model_dump()
    # the trainer's transfer, from the arguments speculators.train gets
    args = speculators_states.speculators_hidden_states_args(
        Path("hs"), hs.format, online, "http://127.0.0.1:1/v1"
    )
    run = SpeculatorsTrainConfig.resolve(
        ["--data-path", "tok", "--verifier-name-or-path", "m", *args]
    ).flatten()
    trainer = HiddenStatesBackend.registry["mooncake"].from_train_args(
        argparse.Namespace(**run), "tok"
    )
    trainer.setup()

    m = online["mooncake"]
    producer = MooncakeHiddenStatesStore(
        MooncakeStoreConfig(
            local_hostname="127.0.0.1",
            metadata_server=m["metadata_server"],
            master_server_address=m["master"],
            global_segment_size=round(m["global_segment_gib"] * 1024**3),
            local_buffer_size=round(m["local_buffer_gib"] * 1024**3),
            protocol=m["protocol"],
            device_name=m["device"],
        )
    ).setup()
    target = load_target_model(random_target, "cpu", torch.float32)
    rows = [[5, 9, 30, 41, 7, 2, 88], [12, 13, 14, 15]]
    for k, (ids, states) in enumerate(
        zip(rows, hidden.capture(target, rows, random_target.aux_ids))
    ):
        states = states.to(torch.bfloat16)
        spec = publish(producer, f"row-{k}-{os.getpid()}", ids, states)
        got = trainer.get_generated(spec)
        assert got["token_ids"].tolist() == ids
        assert torch.equal(got["hidden_states"], states)
        trainer.delete(spec["handle"])
