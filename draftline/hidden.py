"""Target hidden states in speculators' file layout, extracted with a plain HF forward pass.

One file per tokenized row i: hs_{i}.safetensors with
  token_ids      [L]        the row's input_ids
  hidden_states  [L, 4, H]  inputs of the 3 aux decoder layers, then the last layer's output
                            *before* the final norm (speculators applies the target's norm itself)

HF's `output_hidden_states[i]` is the input of decoder layer i (0 = embeddings), matching vLLM's
aux layer ids; its last element is taken *after* the final norm, so the pre-norm last state is
captured with a hook on the norm's input instead.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def hs_path(directory: Path, index: int) -> Path:
    return directory / f"hs_{index}.safetensors"


def is_valid_file(path: Path, token_ids: list[int], hidden_size: int) -> bool:
    """A finished, uncorrupted file for exactly these tokens."""
    if not path.exists():
        return False
    try:
        data = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError):
        return False
    hs, ids = data.get("hidden_states"), data.get("token_ids")
    return (
        hs is not None
        and ids is not None
        and ids.tolist() == token_ids
        and tuple(hs.shape) == (len(token_ids), 4, hidden_size)
        and bool(torch.isfinite(hs.float()).all())
    )


def estimate_bytes(seq_lens: list[int], hidden_size: int, dtype: torch.dtype) -> int:
    itemsize = torch.empty((), dtype=dtype).element_size()
    return sum(seq_lens) * 4 * hidden_size * itemsize


def check_disk(directory: Path, needed: int, margin: float) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(directory).free
    if free < needed * margin:
        raise RuntimeError(
            f"not enough disk for hidden states in {directory}: need {needed / 1e9:.2f} GB "
            f"x margin {margin} but only {free / 1e9:.2f} GB free"
        )


def token_budget_batches(lengths: dict[int, int], budget: int) -> list[list[int]]:
    """Group row indices of similar length so that rows x padded length stays within budget."""
    order = sorted(lengths, key=lambda i: (lengths[i], i))
    batches, current, longest = [], [], 0
    for i in order:
        longest_if = max(longest, lengths[i])
        if current and longest_if * (len(current) + 1) > budget:
            batches.append(current)
            current, longest_if = [], lengths[i]
        current.append(i)
        longest = longest_if
    if current:
        batches.append(current)
    return batches


@torch.no_grad()
def capture(model, input_ids: list[list[int]], aux_layer_ids: list[int]) -> list[torch.Tensor]:
    """[L_b, 4, H] hidden states for each sequence of a right-padded batch."""
    device = next(model.parameters()).device
    longest = max(len(s) for s in input_ids)
    ids = torch.zeros(len(input_ids), longest, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for b, seq in enumerate(input_ids):
        ids[b, : len(seq)] = torch.tensor(seq, device=device)
        mask[b, : len(seq)] = 1
    captured = {}
    norm = model.get_decoder().norm
    handle = norm.register_forward_pre_hook(lambda _m, args: captured.__setitem__("last", args[0]))
    try:
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, logits_to_keep=1)
    finally:
        handle.remove()
    layers = [out.hidden_states[i] for i in aux_layer_ids] + [captured["last"]]
    stacked = torch.stack(layers, dim=2)  # (B, T, 4, H)
    return [stacked[b, : len(seq)] for b, seq in enumerate(input_ids)]


def save_hidden_states(path: Path, token_ids: list[int], hidden: torch.Tensor, dtype: torch.dtype) -> None:
    """Write atomically: a killed run never leaves a file that looks finished."""
    tmp = path.with_suffix(".tmp")
    save_file(
        {"token_ids": torch.tensor(token_ids, dtype=torch.long), "hidden_states": hidden.to(dtype).contiguous().cpu()},
        str(tmp),
    )
    tmp.replace(path)
