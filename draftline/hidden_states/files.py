"""One row's hidden-state file in speculators' layout: its name, its writing and its check.

One file per tokenized row i: hs_{i}.safetensors with
  token_ids      [L]        the row's input_ids
  hidden_states  [L, 4, H]  the inputs of the 3 aux decoder layers, then the last decoder layer's
                            output before the final norm (draftline/hidden_states/capture.py)
and, in format fp8, hs-connectors' per-token scales (draftline/hidden_states/formats.py).

Files are written to a temp name and renamed, so a killed run never leaves a file that looks
finished; a rerun checks each file (header, shape, dtype, token ids) and redoes only what is
missing or broken (draftline/hidden_states/resume.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from draftline.hidden_states.formats import decode, encode

_SAFETENSORS_DTYPE = {
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float8_e4m3fn: "F8_E4M3",
}
# the per-token scales of hs-connectors' fp8 layout (draftline/hidden_states/formats.py)
SCALES_KEY = "hidden_states_scales"


def hs_path(directory: Path, index: int) -> Path:
    return directory / f"hs_{index}.safetensors"


def file_problem(
    path: Path,
    token_ids: list[int],
    hidden_size: int,
    dtype: torch.dtype | None = None,
    full: bool = False,
) -> str | None:
    """Why a row's file is not a finished, uncorrupted file for exactly these tokens (a reason key,
    with what was found), or None when it is.

    Reads the header (a truncated file fails safetensors' own size check), the shape and dtype,
    and the small token_ids tensor; `full` also loads the states and checks they are finite.
    An fp8 file (dtype float8_e4m3fn) also carries its per-token scales [L, 1, 1].
    """
    if not path.exists():
        return "missing"
    fp8 = dtype == torch.float8_e4m3fn
    try:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            if keys != {"token_ids", "hidden_states"} | ({SCALES_KEY} if fp8 else set()):
                return f"other_tensors: {sorted(keys)}"
            hs = f.get_slice("hidden_states")
            if list(hs.get_shape()) != [len(token_ids), 4, hidden_size]:
                return (
                    f"other_shape: {list(hs.get_shape())}, not {[len(token_ids), 4, hidden_size]}"
                )
            if dtype is not None and hs.get_dtype() != _SAFETENSORS_DTYPE[dtype]:
                return f"other_dtype: {hs.get_dtype()}"
            if fp8 and list(f.get_slice(SCALES_KEY).get_shape()) != [len(token_ids), 1, 1]:
                return "other_shape: fp8 scales"
            if f.get_tensor("token_ids").tolist() != list(token_ids):
                return "other_tokens: the tokenized row changed"
            if full:
                values = decode(
                    {k: f.get_tensor(k) for k in f.keys() if k != "token_ids"}, torch.float32
                )
                if not bool(torch.isfinite(values).all()):
                    return "not_finite: NaN or inf in the states"
    except Exception as err:  # noqa: BLE001 - any unreadable file is redone, whatever the reader raised
        return f"unreadable: {type(err).__name__}: {str(err)[:160]}"
    return None


def is_valid_file(
    path: Path,
    token_ids: list[int],
    hidden_size: int,
    dtype: torch.dtype | None = None,
    full: bool = False,
) -> bool:
    """A finished, uncorrupted file for exactly these tokens (file_problem finds nothing)."""
    return file_problem(path, token_ids, hidden_size, dtype, full) is None


def save_hidden_states(
    path: Path, token_ids: list[int], hidden: torch.Tensor, dtype: torch.dtype
) -> None:
    """Write atomically: a killed run never leaves a file that looks finished."""
    tensors = encode(hidden, dtype)  # fp8: hs-connectors' quantization, with per-token scales
    stored = hidden if dtype == torch.float8_e4m3fn else tensors["hidden_states"]
    if not bool(torch.isfinite(stored).all()):
        raise ValueError(
            f"{path.name}: the target produced non-finite hidden states (overflow in {dtype}?)"
        )
    tmp = path.with_name(path.name + ".tmp")
    save_file({"token_ids": torch.tensor(token_ids, dtype=torch.long), **tensors}, str(tmp))
    os.replace(tmp, path)
