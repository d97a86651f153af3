"""Hidden-state file formats: their layout, what a token costs on disk, and what a reader gets back.

`hidden_states.format`:
  bf16  speculators' plain layout, one hs_{i}.safetensors per row:
          hidden_states  [L, 4, H]  in `hidden_states.dtype` (bfloat16 unless set otherwise)
          token_ids      [L]        int64
  fp8   hs-connectors' FP8 layout (what its FP8HiddenStatesConnector writes from vLLM, and what
        FP8Transfer dequantizes on read, so speculators' ArrowDataset never sees FP8):
          hidden_states         [L, 4, H]  float8_e4m3fn
          hidden_states_scales  [L, 1, 1]  float32, one per token over its 4 x H values
          token_ids             [L]        int64
        quantized and dequantized with hs_connectors.fp8_utils, nothing of our own.

Bytes per token, besides a safetensors header of a few hundred bytes per file:
  bf16: 4*H*2 + 8     fp8: 4*H*1 + 4 + 8
The format's minimum (the states alone, plus the fp8 scale) is 4*H*2 and 4*H*1 + 4.

This module imports torch only inside functions: the plan command (`draftline plan`) uses the byte
counts without it.
"""

from __future__ import annotations

FORMATS = ("bf16", "fp8")
TOKEN_ID_BYTES = 8  # int64, as speculators and vLLM's connectors write token_ids
SCALE_BYTES = 4  # float32 per-token scale of the fp8 format
STATES = 4  # 3 aux layers + the last layer


def value_bytes(fmt: str, dtype_name: str = "bfloat16") -> int:
    """Bytes of one stored value: fp8 = 1; bf16 = the itemsize of hidden_states.dtype."""
    if fmt == "fp8":
        return 1
    if fmt != "bf16":
        raise ValueError(f"hidden_states.format: unknown {fmt!r}; formats: {', '.join(FORMATS)}")
    return {"float32": 4, "bfloat16": 2, "float16": 2}[dtype_name]


def bytes_per_token(hidden_size: int, fmt: str, dtype_name: str = "bfloat16") -> int:
    """What one token's file content costs: states, fp8 scale, token id."""
    return (
        STATES * hidden_size * value_bytes(fmt, dtype_name)
        + (SCALE_BYTES if fmt == "fp8" else 0)
        + TOKEN_ID_BYTES
    )


def minimum_bytes_per_token(hidden_size: int, fmt: str, dtype_name: str = "bfloat16") -> int:
    """The format's floor: the states in its value type, plus the scale fp8 cannot do without."""
    return STATES * hidden_size * value_bytes(fmt, dtype_name) + (
        SCALE_BYTES if fmt == "fp8" else 0
    )


def storage_name(fmt: str, dtype_name: str) -> str:
    """The name of what is stored (part of the output fingerprint): the dtype, or float8_e4m3fn."""
    return "float8_e4m3fn" if fmt == "fp8" else dtype_name


def storage_dtype(fmt: str, dtype_name: str):
    import torch

    return torch.float8_e4m3fn if fmt == "fp8" else getattr(torch, dtype_name)


def encode(hidden, dtype) -> dict:
    """{name: tensor} to store for states `hidden` [L, 4, H] in storage dtype `dtype`."""
    import torch

    if dtype == torch.float8_e4m3fn:
        from hs_connectors.fp8_utils import SCALES_KEY, quantize_tensor_to_fp8

        fp8, scales = quantize_tensor_to_fp8(hidden)
        return {"hidden_states": fp8.contiguous().cpu(), SCALES_KEY: scales.contiguous().cpu()}
    return {"hidden_states": hidden.to(dtype).contiguous().cpu()}


def decode(tensors: dict, dtype):
    """The states a reader gets from stored `tensors`, in `dtype` (FP8Transfer's dequantization)."""
    from hs_connectors.fp8_utils import SCALES_KEY, dequantize_fp8_tensor

    if SCALES_KEY in tensors:
        return dequantize_fp8_tensor(tensors["hidden_states"], tensors[SCALES_KEY], dtype=dtype)
    return tensors["hidden_states"].to(dtype)


def roundtrip(hidden, storage, dtype=None):
    """`hidden` as stored in `storage` and read back in `dtype` (default: its own): what training
    on stored states sees, for the online mode and evaluate's tau_sim."""
    return decode(encode(hidden, storage), dtype or hidden.dtype).to(hidden.device)
