"""The SGLang copy of a draft: SGLang's LlamaForCausalLMEagle3 layout, the same function as the
trained draft (checked by reading it back through speculators' own Eagle-3 converter), and a
refusal for every draft SGLang would serve as another function."""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from draftline.benchmark.config import BenchmarkConfig
from draftline.benchmark.preflight import check_engine_settings
from draftline.draft import model as draft_model
from draftline.draft import pretrained as draft_init
from draftline.draft.checkpoint import load_draft, read_draft_facts
from draftline.draft.preflight import check_draft
from draftline.draft.sglang_export import SglangExportError, export_sglang
from draftline.evaluate.specdec import SpecPair, speculative_generate
from draftline.targets.model import load_target
from draftline.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]


def test_export_has_sglangs_names_config_and_aux_convention(
    eagle3_draft_dir, random_target, tmp_path
):
    out = export_sglang(eagle3_draft_dir, random_target, tmp_path / "sglang")
    config = json.loads((out / "config.json").read_text())
    assert (
        config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    )
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [
        i - 1 for i in random_target.aux_ids
    ]
    assert (
        config["draft_vocab_size"] == random_target.vocab_size // 2
        and config["vocab_size"] == random_target.vocab_size
    )
    assert config["target_hidden_size"] == random_target.hidden_size and config["rope_theta"] > 0
    names = set(load_file(str(out / "model.safetensors")))
    assert {
        "fc.weight",
        "midlayer.hidden_norm.weight",
        "midlayer.self_attn.q_proj.weight",
        "d2t",
        "t2d",
    } <= names
    assert not any(n.startswith("layers.") or n.startswith("input_norm") for n in names)
    # what the benchmark's preflight makes of it: SGLang layout, ids that fit the card
    facts = read_draft_facts(out)
    assert facts.layout == "eagle" and check_draft(random_target, facts, "sglang") == []
    assert check_engine_settings("sglang", BenchmarkConfig(), facts) == []


def test_export_reads_back_as_the_same_draft(eagle3_draft_dir, random_target, vocab_dir, tmp_path):
    """speculators' Eagle-3 converter (the original EAGLE-3 layout in, speculators out) reads the
    export back: same weights, and speculative decoding accepts exactly the same drafts."""
    out = export_sglang(eagle3_draft_dir, random_target, tmp_path / "sglang")
    back_dir = draft_init.prepare_init(
        out,
        random_target,
        {"eagle_aux_hidden_state_layer_ids": random_target.aux_ids},
        tmp_path / "work",
    )
    back, notes = draft_init.load_init_draft(
        back_dir, random_target, vocab_dir, TrainConfig(architecture="eagle3")
    )
    original = load_draft(eagle3_draft_dir, random_target, "cpu")
    sd = original.state_dict()
    for name, value in back.state_dict().items():
        if name in sd and not name.startswith("verifier_"):
            assert torch.equal(value.float(), sd[name].float()), name
    back.eval()
    target, _ = load_target(random_target)
    for prompt in ([1, 40, 41, 42, 2, 1, 50], list(range(20, 60))):
        ours = speculative_generate(
            SpecPair(target, original, random_target.aux_ids), prompt, 30, 3, {-1}
        )
        theirs = speculative_generate(
            SpecPair(target, back, random_target.aux_ids), prompt, 30, 3, {-1}
        )
        assert ours.accepted_per_round == theirs.accepted_per_round and ours.tokens == theirs.tokens
    assert notes == []


def test_drafts_sglang_would_serve_differently_are_refused(random_target, vocab_dir, tmp_path):
    speculators_arch = tmp_path / "speculators"
    draft_model.build_draft(random_target, vocab_dir, TrainConfig()).save_pretrained(
        speculators_arch
    )
    with pytest.raises(SglangExportError, match="train.architecture: eagle3"):
        export_sglang(speculators_arch, random_target, tmp_path / "out")
    two_layers = tmp_path / "two_layers"
    eagle3 = TrainConfig(architecture="eagle3")
    two = TrainConfig(architecture="eagle3", num_layers=2)
    draft_model.build_draft(random_target, vocab_dir, two).save_pretrained(two_layers)
    with pytest.raises(SglangExportError, match="train.num_layers: 1"):
        export_sglang(two_layers, random_target, tmp_path / "out")
    one_layer = tmp_path / "one_layer"
    draft_model.build_draft(random_target, vocab_dir, eagle3).save_pretrained(one_layer)
    with pytest.raises(SglangExportError, match="aux layer id 0"):
        export_sglang(one_layer, replace(random_target, aux_layer_ids=[0, 2, 3]), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_cli_exports_or_says_why_not(eagle3_draft_dir, random_target, vocab_dir, tmp_path):
    card = tmp_path / "card.json"
    card.write_text(json.dumps(random_target.to_dict()))

    def run(src, dst):
        return subprocess.run(
            [sys.executable, "-m", "draftline.draft.sglang_export", str(src), str(card), str(dst)],  # noqa: E731
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    ok = run(eagle3_draft_dir, tmp_path / "sglang")
    assert (
        ok.returncode == 0
        and "--speculative-draft-model-path" in ok.stdout
        and (tmp_path / "sglang/config.json").is_file()
    )
    speculators_arch = tmp_path / "speculators"
    draft_model.build_draft(random_target, vocab_dir, TrainConfig()).save_pretrained(
        speculators_arch
    )
    refused = run(speculators_arch, tmp_path / "no")
    assert (
        refused.returncode != 0
        and "train.architecture: eagle3" in refused.stderr
        and not (tmp_path / "no").exists()
    )
