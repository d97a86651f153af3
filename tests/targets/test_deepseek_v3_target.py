"""A tiny DeepSeek-V3-architecture target (MLA attention, routed + shared experts, random weights,
tests/family_targets.py) through the whole pipeline on CPU, each stage's main() in a temp dir:
target -> regenerate (a real `transformers serve`) -> tokenize (DeepSeek-V3-style chat template)
-> vocab -> hidden_states -> train -> evaluate (speculative output checked equal to greedy)."""

import json

import torch
from family_targets import build_tiny_deepseek_v3, deepseek_tokenizer
from regenerate_support import free_port
from stage_runner import corpus, run_stage, write_params, write_prompts

AUX = [1, 2, 3]


def test_tiny_deepseek_v3_runs_the_pipeline(tiny_tokenizer, tmp_path):
    model_dir = build_tiny_deepseek_v3(deepseek_tokenizer(tiny_tokenizer), tmp_path / "deepseek_v3")
    write_params(
        tmp_path,
        {"model": str(model_dir), "aux_layer_ids": AUX},
        # random weights answer up to max_tokens, with tokens of the whole vocabulary: the
        # degenerate-run checks have their own tests
        regenerate={
            "port": free_port(),
            "max_tokens": 24,
            "short": {"concurrency": 4},
            "max_length_share": 1.0,
        },
        tokenize={"max_length": 384},
        vocab={"draft_vocab_size": 256, "min_coverage": 0.0},
        hidden_states={"device": "cpu"},
        train={
            "epochs": 6,
            "pack_len": 512,
            "lr": 0.003,
            "device": "cpu",
            "checkpoint_every_steps": 200,
        },
        evaluate={"k": 3, "max_new_tokens": 24, "device": "cpu", "dtype": "float32"},
    )
    run_stage(tmp_path, "target", "models/target")
    card = json.loads((tmp_path / "models/target/card.json").read_text())
    assert (card["architecture"], card["model_type"], card["num_layers"]) == (
        "DeepseekV3ForCausalLM",
        "deepseek_v3",
        5,
    )
    assert card["verifier_tensors"] == {
        "embed_tokens": "model.embed_tokens.weight",
        "lm_head": "lm_head.weight",
        "norm": "model.norm.weight",
    }

    write_prompts(tmp_path / "prompts/train.jsonl", corpus(32, 1))
    write_prompts(tmp_path / "prompts/eval.jsonl", corpus(6, 2), prefix="e")
    regen = run_stage(
        tmp_path,
        "regenerate",
        "models/target/card.json",
        "prompts/train.jsonl",
        "regenerated",
        "reports/regenerate.json",
    )
    assert regen["ok"] == 32 and regen["failed"] == 0 and regen["completion_tokens"] > 32 * 8
    tok = run_stage(
        tmp_path,
        "tokenize",
        "models/target/card.json",
        "prompts/train.jsonl",
        "regenerated/conversations.jsonl",
        "tokenized",
        "reports/tokenize.json",
    )
    assert tok["rows"] == 32 and tok["trainable_tokens"] > 0
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
    assert hs["extracted_now"] == 32
    run_stage(
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
    acc = run_stage(
        tmp_path,
        "evaluate",
        "models/target/card.json",
        "models/draft",
        "prompts/eval.jsonl",
        "reports/acceptance.json",
        "reports/evaluate",
    )
    # evaluate fails the stage on any divergence from greedy decoding (float32: none tolerated)
    assert acc["lossless_checked_prompts"] == 6 and acc["near_tie_divergences"] == 0
    assert acc["acceptance_length"] > 1.0, acc
    assert torch.load(tmp_path / "tokenized/token_freq.pt")  # frequencies over trainable tokens
