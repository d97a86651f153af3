"""hidden_states.vllm.endpoint: an extraction server already running is checked before use (the
card's target, a hidden-state file this machine reads, 3 aux layers + the last), against the vLLM
stand-in of test_hidden.py (vLLM needs a GPU)."""

import json
import os
import subprocess
import sys
import time

import pytest

from draftline.engines.preflight import PreflightError, ProbeLimits, preflight_extraction
from tests.hidden_states.test_hidden import FAKE_VLLM, free_port


def start_fake(tmp_path, model: str, layers: list[int], hidden: int):
    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE_VLLM)
    storage = tmp_path / "staging"
    storage.mkdir(exist_ok=True)
    port = free_port()
    spec = {
        "method": "extract_hidden_states",
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layers}},
    }
    cmd = [
        sys.executable,
        str(script),
        "--model",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--speculative-config",
        json.dumps(spec),
        "--kv-transfer-config",
        json.dumps(
            {
                "kv_connector": "ExampleHiddenStatesConnector",
                "kv_role": "kv_producer",
                "kv_connector_extra_config": {"shared_storage_path": str(storage)},
            }
        ),
    ]
    env = dict(os.environ, FAKE_VLLM_HIDDEN=str(hidden), FAKE_VLLM_ARGS=str(tmp_path / "args.json"))
    proc = subprocess.Popen(cmd, env=env)
    import httpx

    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc, f"http://127.0.0.1:{port}", storage
        except httpx.HTTPError:
            assert proc.poll() is None
            time.sleep(0.1)


@pytest.mark.parametrize("case", ["ok", "three_layers", "other_model", "no_file"])
def test_extraction_endpoint_preflight(tmp_path, random_target, case):
    card = random_target
    aux, N, H = card.aux_ids, card.num_layers, card.hidden_size
    layers = [*aux, N] if case != "three_layers" else aux
    model = card.model if case != "other_model" else "org/another-model"
    proc, url, storage = start_fake(tmp_path, model, layers, H)
    try:
        probe = [5, 6, 7, 8, 9]
        if case == "ok":
            seen = preflight_extraction(url, card, aux, probe, ProbeLimits(30, 1))
            assert seen["probe_shape"] == [5, 4, H] and seen["model"] == card.model
            assert not list(storage.iterdir())  # the probe's file is removed
        elif (
            case == "no_file"
        ):  # a Mooncake transfer: the model is checked, no probe file is asked for
            assert "probe_shape" not in preflight_extraction(
                url, card, aux, probe, ProbeLimits(30, 1), probe_file=False
            )
            assert not list(storage.iterdir())
        else:
            match = "have shape" if case == "three_layers" else "not the target"
            with pytest.raises(PreflightError, match=match):
                preflight_extraction(url, card, aux, probe, ProbeLimits(30, 1))
    finally:
        proc.terminate()
        proc.wait()


def test_hidden_states_stage_uses_a_running_extraction_server(tmp_path, random_target):
    """backend vllm with vllm.endpoint: nothing is launched, speculators' client fills every row
    through the running server; a server that extracts other layers is refused before any row."""
    import contextlib

    import yaml

    from datasets import Dataset
    from draftline.hidden_states.files import hs_path, is_valid_file
    from stages.hidden_states import main

    card = random_target
    aux, N, H = card.aux_ids, card.num_layers, card.hidden_size
    rows = [[(7 * i + j) % 200 + 3 for j in range(10 + i)] for i in range(6)]
    data = Dataset.from_dict(
        {
            "input_ids": rows,
            "loss_mask": [[1] * len(r) for r in rows],
            "seq_len": [len(r) for r in rows],
        }
    )
    data.set_format(
        type="torch", columns=["input_ids", "loss_mask", "seq_len"]
    )  # as the tokenize stage saves it
    data.save_to_disk(str(tmp_path / "tokenized"))
    card.write(tmp_path / "card.json")
    for case, layers in (("other_layers", aux), ("ok", [*aux, N])):
        (tmp_path / case).mkdir()
        proc, url, _ = start_fake(tmp_path / case, card.model, layers, H)
        params = {
            "samples": 10,
            "datasets": {"d": {"path": "d.jsonl", "format": "openai"}},
            "mix": {"weights": {"d": 1.0}},
            "hidden_states": {
                "backend": "vllm",
                "dtype": "bfloat16",
                "vllm": {"endpoint": url, "concurrency": 2, "request_timeout_s": 30},
            },
        }
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
        try:
            with contextlib.chdir(tmp_path):
                if case == "other_layers":
                    with pytest.raises(
                        SystemExit, match=r"hidden_states\.vllm\.endpoint: .* have shape"
                    ):
                        main("card.json", "tokenized", "hs", "hs.json")
                    assert not list((tmp_path / "hs").glob("hs_*.safetensors"))
                else:
                    main("card.json", "tokenized", "hs", "hs.json")
        finally:
            proc.terminate()
            proc.wait()
    report = json.loads((tmp_path / "hs.json").read_text())
    assert report["extracted_now"] == 6
    for i, ids in enumerate(rows):
        assert is_valid_file(hs_path(tmp_path / "hs", i), ids, H)
    assert not (tmp_path / "hs.vllm.log").exists()  # no server was launched
