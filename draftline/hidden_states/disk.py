"""The disk an offline run needs, checked before anything is removed or written."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from draftline.hidden_states.formats import bytes_per_token


def estimate_bytes(seq_lens: list[int], hidden_size: int, dtype: torch.dtype) -> int:
    """tokens x the format's true bytes per token: 4 states x H x bytes per value, the int64 token
    id, and the fp8 scale (draftline/hidden_states/formats.py; safetensors headers are negligible)."""
    fmt, name = (
        ("fp8", "bfloat16")
        if dtype == torch.float8_e4m3fn
        else ("bf16", str(dtype).removeprefix("torch."))
    )
    return sum(seq_lens) * bytes_per_token(hidden_size, fmt, name)


def check_disk(directory: Path, needed: int, margin: float, reclaimable: int = 0) -> int:
    """Free bytes at `directory`; raises when they plus `reclaimable` (files the run would remove or
    overwrite) are below needed x margin. Called before anything is removed."""
    directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(directory).free
    if free + reclaimable < needed * margin:
        freed = f" (+ {reclaimable / 1e9:.2f} GB the run would free)" if reclaimable else ""
        raise RuntimeError(
            f"not enough disk for hidden states in {directory}: need {needed / 1e9:.2f} GB "
            f"x margin {margin} = {needed * margin / 1e9:.2f} GB but only {free / 1e9:.2f} GB free{freed} "
            f"(lower hidden_states.disk_margin only if you know the estimate is high); nothing was removed"
        )
    return free
