"""Mooncake transfer: a real mooncake_master on 127.0.0.1, our producer publishing the random
target's captured states, and the trainer side reading them through hs-connectors'
MooncakeTransfer built from the speculators.train arguments our params give.

Skipped, with the import error as the reason, where the Mooncake transfer engine does not import:
not installed (an optional dependency: `make setup-mooncake`), or installed on a host without the
RDMA libraries its CPU build links (`ImportError: libibverbs.so.1: cannot open shared object
file`; `apt-get install libibverbs1 librdmacm1`, which `make setup-mooncake` does when it runs as
root)."""

import argparse
import importlib
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from draftline.hidden_states.capture import capture
from draftline.hidden_states.config import HiddenStatesConfig
from draftline.hidden_states.online_server import speculators_hidden_states_args


def mooncake_store_import_error() -> str | None:
    """Why `mooncake.store` does not import here, or None when it does. A missing shared library
    is an ImportError that is no ModuleNotFoundError (pytest.importorskip lets it through), and a
    library loaded with ctypes raises OSError: both are reasons to skip, not failures."""
    try:
        importlib.import_module("mooncake.store")
    except (ImportError, OSError) as err:
        return f"Mooncake transfer engine does not import: {type(err).__name__}: {err}"
    return None


def require_mooncake_store() -> None:
    if (why := mooncake_store_import_error()) is not None:
        pytest.skip(why)


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
    require_mooncake_store()
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

    from draftline.hidden_states.mooncake import publish
    from draftline.targets.model import load_target_model

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
    args = speculators_hidden_states_args(Path("hs"), hs.format, online, "http://127.0.0.1:1/v1")
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
    for k, (ids, states) in enumerate(zip(rows, capture(target, rows, random_target.aux_ids))):
        states = states.to(torch.bfloat16)
        spec = publish(producer, f"row-{k}-{os.getpid()}", ids, states)
        got = trainer.get_generated(spec)
        assert got["token_ids"].tolist() == ids
        assert torch.equal(got["hidden_states"], states)
        trainer.delete(spec["handle"])


# ---- the skip, on a host where the engine does not import


@pytest.mark.parametrize(
    "store_py, error",
    [
        # what an extension module linked against a missing library raises at import
        (
            'raise ImportError("libibverbs.so.1: cannot open shared object file: No such file or directory")',
            "ImportError: libibverbs.so.1: cannot open shared object file",
        ),
        # a library loaded with ctypes
        (
            'import ctypes; ctypes.CDLL("libdraftline-absent.so.1")',
            "OSError: libdraftline-absent.so.1: cannot open shared object file",
        ),
        # not installed at all
        (None, "ModuleNotFoundError: No module named 'mooncake"),
    ],
    ids=["missing-shared-library", "ctypes", "not-installed"],
)
def test_an_engine_that_does_not_import_skips_with_its_error(
    tmp_path, monkeypatch, store_py, error
):
    """A `mooncake` package first on sys.path whose `store` fails as on a host without
    libibverbs1 (or no package at all): the test skips, and the reason is the import error."""
    for name in [m for m in sys.modules if m == "mooncake" or m.startswith("mooncake.")]:
        monkeypatch.delitem(sys.modules, name)
    if store_py is None:
        monkeypatch.setattr(sys, "path", [p for p in sys.path if "site-packages" not in p])
    else:
        (tmp_path / "mooncake").mkdir()
        (tmp_path / "mooncake" / "__init__.py").write_text("")
        (tmp_path / "mooncake" / "store.py").write_text(store_py + "\n")
        monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert error in (mooncake_store_import_error() or "")
    with pytest.raises(pytest.skip.Exception, match=error.split(":")[0]) as skipped:
        require_mooncake_store()
    assert error in str(skipped.value)
