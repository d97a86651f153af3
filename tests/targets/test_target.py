"""Targets of the multimodal-wrapper class with custom code (tests/wrapped_target.py): refused at
the `target` stage without target.trust_remote_code, and with it: the card from the text config,
verifier tensors found by name that equal the loaded model's, capture inside the wrapper, and the
stages target -> tokenize -> vocab -> hidden_states -> train -> evaluate."""

import json
from dataclasses import replace

import pytest
import torch
from safetensors import safe_open
from stage_runner import corpus, run_stage, write_params, write_prompts, write_regenerated
from wrapped_target import build_wrapped_target

from draftline.core.card import TargetCard
from draftline.engines.config import VllmEngineConfig
from draftline.hidden_states.capture import capture, decoder_parts
from draftline.targets.model import (
    RemoteCodeRequired,
    build_card,
    load_target,
    read_verifier_tensors,
)

AUX = [1, 2, 3]


@pytest.fixture(scope="module")
def wrapped_dir(tmp_path_factory, tiny_tokenizer):
    return build_wrapped_target(tiny_tokenizer, tmp_path_factory.mktemp("wrapped_target"))


@pytest.fixture(scope="module")
def wrapped_card(wrapped_dir):
    return build_card(str(wrapped_dir), "test", None, AUX, {}, trust_remote_code=True)


def test_target_stage_without_trust_remote_code_names_the_param(wrapped_dir, tmp_path):
    write_params(tmp_path, {"model": str(wrapped_dir), "aux_layer_ids": AUX})
    with pytest.raises(
        SystemExit, match=r"target\.trust_remote_code: the config of target .* ships as custom code"
    ):
        run_stage(tmp_path, "target", "models/target")
    assert not (tmp_path / "models/target/card.json").exists()


def test_tokenizer_with_custom_code_alone_is_refused_too(wrapped_dir, tmp_path):
    """Config and model in transformers, only the tokenizer shipped as code."""
    import shutil

    from transformers import LlamaConfig

    shutil.copytree(wrapped_dir, tmp_path / "t")
    text = json.loads((wrapped_dir / "config.json").read_text())["text_config"]
    LlamaConfig(**text).save_pretrained(tmp_path / "t")  # replaces the wrapper's config.json
    with pytest.raises(
        RemoteCodeRequired, match=r"target\.trust_remote_code: the tokenizer of target"
    ):
        build_card(str(tmp_path / "t"), "test", None, AUX, {})


def test_card_from_text_config_and_verifier_tensors_equal_the_loaded_model(wrapped_card):
    card = wrapped_card
    assert card.config_model_type == "draftline_wrapper" and card.model_type == "llama"
    assert (card.num_layers, card.hidden_size, card.trust_remote_code) == (5, 64, True)
    # names by prefix, not suffix: the vision tower's embed_tokens / post_norm never match
    assert card.verifier_tensors == {
        "embed_tokens": "language_model.model.embed_tokens.weight",
        "lm_head": "language_model.lm_head.weight",
        "norm": "language_model.model.norm.weight",
    }
    tensors = read_verifier_tensors(card)
    model, tokenizer = load_target(card)
    assert type(tokenizer).__name__ == "WrapperTokenizer"
    _, norm = decoder_parts(model)
    assert torch.equal(tensors["embed_tokens"], model.get_input_embeddings().weight)
    assert torch.equal(tensors["lm_head"], model.get_output_embeddings().weight)
    assert torch.equal(tensors["norm"], norm.weight)
    assert not torch.equal(
        norm.weight, torch.ones_like(norm.weight)
    )  # a fallback to ones would show


def test_tied_embeddings_give_no_lm_head_name(random_target, tmp_path):
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    with safe_open(f"{random_target.model}/model.safetensors", "pt") as f:
        weights = {k: f.get_tensor(k) for k in f.keys() if k != "lm_head.weight"}
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads(open(f"{random_target.model}/config.json").read())
    cfg["tie_word_embeddings"] = True
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    AutoTokenizer.from_pretrained(random_target.model).save_pretrained(tmp_path)
    card = build_card(str(tmp_path), "test", None, AUX, {})
    assert card.verifier_tensors["lm_head"] is None and card.tie_word_embeddings
    tensors = read_verifier_tensors(card)
    assert torch.equal(tensors["lm_head"], tensors["embed_tokens"])


def test_capture_finds_the_decoder_inside_the_wrapper(wrapped_card):
    model, _ = load_target(wrapped_card)
    ids = [[5, 9, 12, 40, 7, 3], [8, 8, 2]]
    states = capture(model, ids, AUX)
    inner = model.language_model(input_ids=torch.tensor([ids[0]]), output_hidden_states=True)
    for slot, layer in enumerate(AUX):
        assert torch.allclose(states[0][:, slot], inner.hidden_states[layer][0], atol=1e-5)
    # the last slot is pre-norm: through the final norm and lm_head it gives the model's logits
    logits = model.get_output_embeddings()(decoder_parts(model)[1](states[0][:, 3]))
    assert torch.allclose(logits, inner.logits[0], atol=1e-4)


def test_stages_run_on_the_wrapped_target(wrapped_dir, tmp_path):
    from draftline.draft.checkpoint import load_saved_draft

    write_params(
        tmp_path,
        {"model": str(wrapped_dir), "aux_layer_ids": AUX, "trust_remote_code": True},
        tokenize={"max_length": 256},
        vocab={"draft_vocab_size": 128},
        hidden_states={"device": "cpu"},
        train={"epochs": 1, "pack_len": 256, "device": "cpu", "checkpoint_every_steps": 50},
        evaluate={"k": 3, "max_new_tokens": 12, "device": "cpu", "dtype": "float32"},
    )
    run_stage(tmp_path, "target", "models/target")
    card = TargetCard.load(tmp_path / "models/target/card.json")
    assert (
        card.trust_remote_code
        and card.verifier_tensors["norm"] == "language_model.model.norm.weight"
    )

    conversations = corpus(12, 0)
    prompts = write_prompts(tmp_path / "prompts/train.jsonl", conversations)
    write_regenerated(tmp_path / "regenerated/conversations.jsonl", prompts, conversations)
    tok = run_stage(
        tmp_path,
        "tokenize",
        "models/target/card.json",
        "prompts/train.jsonl",
        "regenerated/conversations.jsonl",
        "tokenized",
        "reports/tokenize.json",
    )
    assert tok["rows"] == 12
    run_stage(
        tmp_path,
        "vocab",
        "models/target/card.json",
        "tokenized/token_freq.pt",
        "models/vocab",
        "reports/vocab.json",
    )
    hs = run_stage(
        tmp_path,
        "hidden_states",
        "models/target/card.json",
        "tokenized",
        "hidden_states",
        "reports/hidden_states.json",
    )
    assert hs["extracted_now"] == 12
    report = run_stage(
        tmp_path,
        "train",
        "models/target/card.json",
        "models/vocab",
        "tokenized",
        "hidden_states",
        "models/draft",
        "reports/train.json",
        "models/draft_checkpoints",
    )
    assert report["steps"] >= 1
    draft = load_saved_draft(tmp_path / "models/draft", card)
    tensors = read_verifier_tensors(card)
    assert torch.equal(draft.verifier_norm.weight, tensors["norm"])
    assert torch.equal(draft.embed_tokens.weight, tensors["embed_tokens"])
    assert torch.equal(draft.verifier_lm_head.weight, tensors["lm_head"][draft.t2d.bool()])
    write_prompts(tmp_path / "prompts/eval.jsonl", corpus(3, 9), prefix="e")
    acc = run_stage(
        tmp_path,
        "evaluate",
        "models/target/card.json",
        "models/draft",
        "prompts/eval.jsonl",
        "reports/acceptance.json",
        "reports/evaluate",
    )
    assert acc["lossless_checked_prompts"] == 3 and acc["near_tie_divergences"] == 0


def test_trust_remote_code_reaches_every_command_line(wrapped_card, vocab_dir, tmp_path):
    """Launched servers (regenerate, hidden_states vllm, benchmark vllm / sglang) and the speculators
    train hand-off get the flag from the card; a plain target's command lines stay without it."""
    import inspect

    from speculators.train.config import TrainConfig as SpeculatorsTrainConfig
    from torch.distributed.run import get_args_parser
    from transformers.cli.serve import Serve

    from draftline.benchmark.commands import benchmark_serve_command
    from draftline.benchmark.config import BenchmarkConfig
    from draftline.engines import commands
    from draftline.regenerate.config import RegenerateConfig
    from draftline.regenerate.launch import regenerate_command
    from draftline.train import speculators as handoff
    from draftline.train.config import TrainConfig

    card = replace(wrapped_card, architecture="LlamaForCausalLM")
    assert "trust_remote_code" in inspect.signature(Serve.__init__).parameters
    for backend in ("transformers", "vllm", "sglang"):
        cmd = regenerate_command(RegenerateConfig(backend=backend), card, "m")
        assert cmd.count("--trust-remote-code") == 1, backend
        assert "--trust-remote-code" not in regenerate_command(
            RegenerateConfig(backend=backend), replace(card, trust_remote_code=False), "m"
        )
    cmd = commands.vllm_extract_command(
        VllmEngineConfig(python="python"),
        commands.ExtractServe(
            card.model,
            None,
            AUX,
            5,
            tmp_path,
            "h",
            1,
            "bfloat16",
            1,
            64,
            0.9,
            [],
            trust_remote_code=True,
        ),
    )
    assert "--trust-remote-code" in cmd
    for engine in ("vllm", "sglang"):
        assert "--trust-remote-code" in benchmark_serve_command(
            engine, card, BenchmarkConfig(engine=engine), "/draft"
        )
    run = handoff.SpeculatorsLaunch(
        vocab_dir, tmp_path / "tok", tmp_path / "hs", tmp_path / "ckpt", tmp_path / "logs", 2
    )
    train_cmd = handoff.speculators_train_command(TrainConfig(backend="speculators"), card, run)
    launch = get_args_parser().parse_args(train_cmd[1:])
    assert (
        SpeculatorsTrainConfig.resolve(launch.training_script_args).flatten()["trust_remote_code"]
        is True
    )
    assert not commands.transformers_serve_loads(
        wrapped_card.architecture, wrapped_card.config_model_type
    )
    assert commands.transformers_serve_loads("LlamaForCausalLM", "llama")


def test_speculators_train_gets_a_verifier_view_it_can_load(wrapped_card, vocab_dir, tmp_path):
    """speculators' own draft construction (what `speculators train` runs) on the view of the
    wrapped target: no custom code needed, and it picks up exactly the card's verifier tensors."""
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.cli import create_transformer_layer_config

    from draftline.train import speculators as handoff

    view = handoff.verifier_for_speculators(wrapped_card, tmp_path / "view")
    assert view != wrapped_card.model
    size = wrapped_card.vocab_size // 2
    d2t, t2d = (
        torch.zeros(size, dtype=torch.long),
        torch.zeros(wrapped_card.vocab_size, dtype=torch.bool),
    )
    t2d[:size] = True
    layer = create_transformer_layer_config(
        view, 1, "llama", "silu", 4096, [0]
    )  # trust_remote_code=False
    model = Eagle3DraftModel.from_training_args(
        verifier_config=layer,
        t2d=t2d,
        d2t=d2t,
        draft_vocab_size=size,
        norm_before_residual=True,
        ttt_steps=3,
        verifier_name_or_path=view,
        target_layer_ids=AUX,
        draft_attn_impl="eager",
    )
    tensors = read_verifier_tensors(wrapped_card)
    assert torch.equal(model.verifier_norm.weight, tensors["norm"])
    assert torch.equal(model.embed_tokens.weight, tensors["embed_tokens"])
    assert torch.equal(model.verifier_lm_head.weight, tensors["lm_head"][:size])
    launch = handoff.SpeculatorsLaunch(
        vocab_dir, tmp_path, tmp_path, tmp_path, tmp_path, 2, verifier=view
    )
    cmd = handoff.speculators_train_command(draft_cfg(), wrapped_card, launch)
    assert cmd[cmd.index("--verifier-name-or-path") + 1] == view


def draft_cfg():
    from draftline.train.config import TrainConfig

    return TrainConfig(backend="speculators")
