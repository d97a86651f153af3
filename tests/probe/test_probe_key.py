"""The key of the probe's extraction pass (draftline/probe/checks.py extraction_key) against what
decides the pass: the probe stage run through the vLLM stand-in of test_hidden.py (vLLM itself
needs a GPU), one input changed at a time; wherever the probe's outcome changes, the key changes.

A key that misses something says "passed before" for a path that now fails: the hidden_states
stage then fails after regeneration, which the probe exists to prevent."""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from draftline.hidden_states.config import HiddenStatesConfig, VllmExtractionConfig
from draftline.probe import checks
from draftline.targets.model import build_card
from tests.hidden_states.test_hidden import fake_vllm_python
from tests.probe.test_probe import engines_of, run_probe, vllm_section

# hidden_states.vllm fields by how the key treats them (checks.KEY_SKIPS): a field added to
# VllmExtractionConfig without a line here fails test_every_vllm_extraction_field_is_classified.
VLLM_KEYED = {
    "endpoint": "another server, another vLLM",
    "tensor_parallel_size": "whether the target's layers split across the GPUs",
    "max_model_len": "whether the server starts with the KV cache it asks for",
    "gpu_memory_utilization": "whether the server starts: weights and cache in the memory",
    "extra_args": "anything vLLM is told (quantization, eager mode...)",
}
VLLM_SKIPPED = {
    "host": "where the server listens",
    "port": "where the server listens",
    "concurrency": "one row is probed",
    "request_timeout_s": "how long a request may take",
    "max_retries": "how often a request is retried",
    "startup_timeout_s": "how long a start may take (a giant target's start is the probe's cost)",
    "probe": "whether to probe at all (false: nothing is recorded)",
}


def test_every_vllm_extraction_field_is_classified():
    fields = set(VllmExtractionConfig.model_fields)
    assert fields == set(VLLM_KEYED) | set(VLLM_SKIPPED)
    assert checks.KEY_SKIPS["vllm"] == set(VLLM_SKIPPED)
    assert {"format", "dtype"} <= set(HiddenStatesConfig.model_fields)


def outcome(root: Path, card, python, **hidden_states) -> tuple[tuple, str]:
    """The probe stage with hidden_states.backend vllm (+ `hidden_states`) through `python`: what
    the pass holds (passed and what was seen, or the error), and the key it is (or, failed,
    would have been) recorded under."""
    root.mkdir()
    section = {**vllm_section(), **hidden_states}
    section["vllm"] = {**section["vllm"], **hidden_states.get("vllm", {})}
    try:
        report = run_probe(root, card, engines=engines_of(python), hidden_states=section)
    except SystemExit:
        report = json.loads((root / "reports" / "probe.json").read_text())
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)  # engines.vllm of the run's params.yaml, as the stage read it
        key = checks.extraction_key(card, HiddenStatesConfig(**section), "offline")
    extraction = report["extraction"]
    if extraction is None:
        return ("failed", report["error"].split("\n")[0]), key
    assert extraction["probed"] and extraction["key"] == key  # the key recorded is this one
    return ("passed", json.dumps(extraction["seen"], sort_keys=True)), key


def refusing_python(tmp_path: Path, python: Path) -> Path:
    """Another interpreter: a vLLM that cannot extract this target (the stand-in's refusal)."""
    other = tmp_path / "python-with-older-vllm"
    other.write_text(
        "#!/bin/sh\nFAKE_VLLM_REFUSE='this vLLM has no extract_hidden_states' "
        f'exec {python} "$@"\n'
    )
    other.chmod(0o755)
    return other


def test_wherever_the_probes_outcome_changes_the_key_changes(tmp_path, random_target, monkeypatch):
    """The differential check of the pass's key: the probe under vllm_section(), then one change
    at a time (the stored dtype, the card's hidden size, the chat template edited in place, the
    vLLM interpreter, operational settings); wherever the outcome differs from the base run's, the
    key differs."""
    python = fake_vllm_python(tmp_path, random_target, monkeypatch)
    model = tmp_path / "target"
    shutil.copytree(random_target.model, model)
    card = build_card(str(model), "test", None, [1, 2, 3], {})
    base, base_key = outcome(tmp_path / "base", card, python)
    assert base[0] == "passed"

    # operational: neither the outcome nor the key
    for name, vllm in {
        "concurrency": {"concurrency": 3},
        "timeout": {"request_timeout_s": 9},
    }.items():
        assert outcome(tmp_path / name, card, python, vllm=vllm) == (base, base_key), name

    changed = set()

    def check(name: str, card, interpreter, **hidden_states) -> None:
        now, key = outcome(tmp_path / name, card, interpreter, **hidden_states)
        if now != base:
            changed.add(name)
            assert key != base_key, f"{name} changed the probe's outcome ({now}) but not its key"

    check("dtype", card, python, dtype="float16")
    check("hidden_size", replace(card, hidden_size=96), python)
    check("interpreter", card, refusing_python(tmp_path, python))
    template = model / "chat_template.jinja"
    template.write_text("{{- 'Be brief.\\n' -}}" + template.read_text())
    check("chat_template", build_card(str(model), "test", None, [1, 2, 3], {}), python)
    assert changed == {"dtype", "hidden_size", "interpreter", "chat_template"}
