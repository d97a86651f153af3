"""An INT4 MoE target the way published ones are made (tests/family_targets.py): the tiny
DeepSeek-V3 with every routed expert pack-quantized to W4A16 by compressed-tensors, the rest bf16.
On CPU: the card, verifier tensors equal to the dequantized model's, and `hf` extraction whose last
state reproduces the model's logits. The vLLM / SGLang command lines load it as those engines do:
from config.json's quantization_config, with no --quantization flag (their INT4 MoE kernels need
CUDA GPUs, so the servers themselves do not run here)."""

import json

import pytest
import torch
from family_targets import build_tiny_deepseek_v3, deepseek_tokenizer, quantize_experts_int4
from safetensors.torch import load_file
from stage_runner import corpus, run_stage, write_params, write_prompts, write_regenerated

from draftline.core.card import TargetCard
from draftline.engines.config import VllmEngineConfig
from draftline.hidden_states.capture import decoder_parts
from draftline.hidden_states.files import hs_path
from draftline.targets.model import build_card, load_target, read_verifier_tensors

AUX = [1, 2, 3]


@pytest.fixture(scope="module")
def int4_dir(tmp_path_factory, tiny_tokenizer):
    root = tmp_path_factory.mktemp("int4")
    src = build_tiny_deepseek_v3(deepseek_tokenizer(tiny_tokenizer), root / "bf16")
    return quantize_experts_int4(src, root / "int4")


@pytest.fixture(scope="module")
def int4_card(int4_dir):
    return build_card(str(int4_dir), "test", None, AUX, {})


def test_checkpoint_is_packed_like_published_int4_moe(int4_dir):
    tensors = load_file(str(int4_dir / "model.safetensors"))
    quant = json.loads((int4_dir / "config.json").read_text())["quantization_config"]
    assert quant["quant_method"] == "compressed-tensors" and quant["format"] == "pack-quantized"
    weights = quant["config_groups"]["group_0"]["weights"]
    assert {k: weights[k] for k in ("num_bits", "type", "symmetric", "strategy", "group_size")} == {
        "num_bits": 4,
        "type": "int",
        "symmetric": True,
        "strategy": "group",
        "group_size": 32,
    }
    gate = "model.layers.1.mlp.experts.0.gate_proj."
    assert tensors[gate + "weight_packed"].dtype == torch.int32 and gate + "weight" not in tensors
    assert tensors[gate + "weight_shape"].tolist() == [32, 64] and list(
        tensors[gate + "weight_scale"].shape
    ) == [32, 2]
    for plain in (
        "model.embed_tokens.weight",
        "lm_head.weight",
        "model.norm.weight",
        "model.layers.1.self_attn.q_a_proj.weight",
        "model.layers.1.mlp.shared_experts.up_proj.weight",
    ):
        assert tensors[plain].dtype == torch.bfloat16, plain


def test_card_and_verifier_tensors_equal_the_dequantized_model(int4_card):
    card = int4_card
    assert card.quantization == {"quant_method": "compressed-tensors", "format": "pack-quantized"}
    assert (card.model_type, card.num_layers, card.hidden_size) == ("deepseek_v3", 5, 64)
    tensors = read_verifier_tensors(card)
    model, _ = load_target(card)
    _, norm = decoder_parts(model)
    assert torch.equal(tensors["embed_tokens"].float(), model.get_input_embeddings().weight.float())
    assert torch.equal(tensors["lm_head"].float(), model.get_output_embeddings().weight.float())
    assert torch.equal(tensors["norm"].float(), norm.weight.float())
    experts = model.model.layers[1].mlp.experts.gate_up_proj
    assert experts.abs().sum() > 0  # dequantized at load, not left empty


def test_hf_extraction_last_state_reproduces_the_logits(int4_dir, tmp_path):
    write_params(
        tmp_path,
        {"model": str(int4_dir), "aux_layer_ids": AUX},
        tokenize={"max_length": 256},
        hidden_states={"device": "cpu", "dtype": "float32"},
    )
    run_stage(tmp_path, "target", "models/target")
    conversations = corpus(6, 3)
    prompts = write_prompts(tmp_path / "prompts/train.jsonl", conversations)
    write_regenerated(tmp_path / "regenerated/conversations.jsonl", prompts, conversations)
    run_stage(
        tmp_path,
        "tokenize",
        "models/target/card.json",
        "prompts/train.jsonl",
        "regenerated/conversations.jsonl",
        "tokenized",
        "reports/tokenize.json",
    )
    report = run_stage(
        tmp_path,
        "hidden_states",
        "models/target/card.json",
        "tokenized",
        "hidden_states",
        "reports/hidden_states.json",
    )
    assert report["extracted_now"] == 6
    model, _ = load_target(TargetCard.load(tmp_path / "models/target/card.json"))
    _, norm = decoder_parts(model)
    for i in (0, 5):
        stored = load_file(str(hs_path(tmp_path / "hidden_states", i)))
        ids = stored["token_ids"][None]
        with torch.no_grad():
            out = model(input_ids=ids, output_hidden_states=True)
            logits = model.lm_head(norm(stored["hidden_states"][:, 3].float()))
        assert torch.allclose(logits, out.logits[0], atol=1e-4) and torch.equal(
            logits.argmax(-1), out.logits[0].argmax(-1)
        )
        for slot, layer in enumerate(AUX):
            assert torch.allclose(
                stored["hidden_states"][:, slot], out.hidden_states[layer][0], atol=1e-5
            )


def test_engine_command_lines_take_the_quantization_from_the_checkpoint(int4_card, tmp_path):
    from draftline.benchmark.commands import benchmark_serve_command
    from draftline.benchmark.config import BenchmarkConfig
    from draftline.engines.commands import ExtractServe, vllm_extract_command
    from draftline.regenerate.config import RegenerateConfig
    from draftline.regenerate.launch import regenerate_command

    card = int4_card
    commands = [
        regenerate_command(RegenerateConfig(backend=b, tensor_parallel_size=8), card, "kimi")
        for b in ("vllm", "sglang")
    ]
    commands.append(
        vllm_extract_command(
            VllmEngineConfig(python="python"),
            ExtractServe(card.model, None, AUX, 5, tmp_path, "h", 1, "bfloat16", 8, 4096, 0.9, []),
        )
    )
    commands += [
        benchmark_serve_command(
            e,
            card,
            BenchmarkConfig(
                engine=e,
                vllm={"args": ["--tensor-parallel-size", "8"]},
                sglang={"args": ["--tp-size", "8"]},
            ),
            "/draft",
        )
        for e in ("vllm", "sglang")
    ]
    for cmd in commands:
        assert card.model in cmd or str(card.model) in " ".join(cmd)
        assert "--quantization" not in cmd and "--trust-remote-code" not in cmd
        assert "8" in cmd
