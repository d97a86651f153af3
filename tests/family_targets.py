"""Tokenizers with the chat templates of the DeepSeek-V3 / Kimi-K2 family (tests/fixtures/templates,
written from the published structure) on the tiny BPE, and a tiny DeepSeek-V3-architecture target
(transformers' DeepseekV3Config: MLA attention, routed + shared experts, a dense first layer)."""

from __future__ import annotations

import copy
from pathlib import Path

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"

DEEPSEEK_TOKENS = [
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
]
KIMI_TOKENS = [
    "<|im_system|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_middle|>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
]


def deepseek_tokenizer(base):
    tok = copy.deepcopy(base)
    tok.add_special_tokens(
        {
            "bos_token": "<｜begin▁of▁sentence｜>",
            "eos_token": "<｜end▁of▁sentence｜>",
            "pad_token": "<｜end▁of▁sentence｜>",
            "additional_special_tokens": DEEPSEEK_TOKENS,
        }
    )
    tok.chat_template = (TEMPLATES / "deepseek_v3.jinja").read_text()
    return tok


def kimi_tokenizer(base):
    tok = copy.deepcopy(base)  # <|im_end|> is already its end of turn, <think> one token
    tok.add_special_tokens({"additional_special_tokens": KIMI_TOKENS})
    tok.chat_template = (TEMPLATES / "kimi_k2_thinking.jinja").read_text()
    return tok


def tiny_deepseek_v3_config(
    vocab_size: int, eos_token_id: int, bos_token_id: int | None, layers: int = 5, **overrides
):
    """MLA (q/kv LoRA ranks, rope and no-rope head parts), 4 routed experts (2 per token) + 1 shared,
    first layer dense: the DeepSeek-V3 / Kimi-K2 text model at toy size."""
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        **{
            "vocab_size": vocab_size,
            "hidden_size": 64,
            "intermediate_size": 128,
            "moe_intermediate_size": 32,
            "num_hidden_layers": layers,
            "first_k_dense_replace": 1,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "n_group": 1,
            "topk_group": 1,
            "routed_scaling_factor": 1.0,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "q_lora_rank": 32,
            "kv_lora_rank": 16,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8,
            "v_head_dim": 16,
            "max_position_embeddings": 1024,
            "tie_word_embeddings": False,
            "eos_token_id": eos_token_id,
            "bos_token_id": bos_token_id,
            "pad_token_id": eos_token_id,
            **overrides,
        }
    )


def build_tiny_deepseek_v3(tokenizer, out: Path, seed: int = 0, logit_scale: float = 8.0) -> Path:
    """Random weights, lm_head scaled so that greedy decoding follows sharp, learnable preferences."""
    import torch
    from transformers import DeepseekV3ForCausalLM, GenerationConfig

    torch.manual_seed(seed)
    config = tiny_deepseek_v3_config(len(tokenizer), tokenizer.eos_token_id, tokenizer.bos_token_id)
    model = DeepseekV3ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        do_sample=False,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


# What published INT4 MoE checkpoints (Kimi-K2-Thinking, ...) declare: W4A16, symmetric int4 in
# groups of 32 along the input dimension, packed into int32 (`weight_packed`, `weight_scale`,
# `weight_shape` per expert projection); attention, shared experts, dense MLPs, router, embeddings,
# lm_head and norms stay bf16.
INT4_IGNORE = [
    "lm_head",
    "re:.*self_attn.*",
    "re:.*shared_experts.*",
    "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
    "re:.*mlp\\.gate$",
]


def int4_quantization_config(group_size: int = 32) -> dict:
    from compressed_tensors.config import CompressionFormat
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        QuantizationStatus,
    )

    weights = QuantizationArgs(
        num_bits=4, type="int", symmetric=True, strategy="group", group_size=group_size
    )
    config = QuantizationConfig(
        config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=weights)},
        format=CompressionFormat.pack_quantized.value,
        ignore=INT4_IGNORE,
        quantization_status=QuantizationStatus.COMPRESSED,
    )
    return config.model_dump(exclude_none=False) | {"quant_method": "compressed-tensors"}


def quantize_experts_int4(src: Path, out: Path, group_size: int = 32) -> Path:
    """A copy of the bf16/fp32 checkpoint at src with every routed expert's gate/up/down projection
    pack-quantized to W4A16 by compressed-tensors (everything else bf16), and its quantization_config."""
    import json
    import re
    import shutil

    import torch
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams
    from safetensors.torch import load_file, save_file

    weights_args = QuantizationArgs(
        num_bits=4, type="int", symmetric=True, strategy="group", group_size=group_size
    )
    scheme = QuantizationScheme(targets=["Linear"], weights=weights_args)
    expert = re.compile(r".*\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, value in load_file(str(src / "model.safetensors")).items():
        value = value.to(torch.bfloat16)
        if not expert.match(name):
            tensors[name] = value
            continue
        rows, cols = value.shape
        groups = value.float().reshape(rows, cols // group_size, group_size)
        scale, zero_point = calculate_qparams(
            groups.amin(-1), groups.amax(-1), weights_args
        )  # (rows, cols / group)
        packed = PackedQuantizationCompressor.compress(
            {
                "weight": value,
                "weight_scale": scale.to(torch.bfloat16),
                "weight_zero_point": zero_point,
            },
            scheme,
        )
        prefix = name[: -len("weight")]
        tensors.update({prefix + key: t.contiguous() for key, t in packed.items()})
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = int4_quantization_config(group_size)
    config["dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for f in src.iterdir():
        if f.name not in {"model.safetensors", "config.json"} and f.is_file():
            shutil.copy(f, out / f.name)
    return out
