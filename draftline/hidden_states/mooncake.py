"""Publishing captured hidden states to a Mooncake store in hs-connectors' wire layout, so the
trainers read them with its MooncakeTransfer (speculators.train --hidden-states-backend mooncake)
exactly as they read what vLLM's MooncakeHiddenStatesConnector puts there.

The layout is hs-connectors' own: packed_layout() assigns 64-byte-aligned offsets to
`hidden_states` [L, 4, H] and `token_ids` [L]; the versioned transfer manifest (handle, tensor
specs, total bytes) travels beside the object, as vLLM returns it in kv_transfer_params.

Needs the Mooncake transfer engine (`pip install mooncake-transfer-engine`, or the CPU build
`mooncake-transfer-engine-non-cuda`, which links libibverbs: `apt-get install libibverbs1`) and a
running `mooncake_master`.
"""

from __future__ import annotations

from typing import Any

import torch


def manifest(handle: str, token_ids: torch.Tensor, hidden: torch.Tensor) -> dict[str, Any]:
    """The transfer manifest of one row, built as MooncakeHiddenStatesConnector builds it."""
    # hs-connectors loads on first use: only the mooncake transfer needs it
    from hs_connectors.mooncake_store import VERSION, packed_layout

    specs, total = packed_layout(
        {
            "hidden_states": (list(hidden.shape), hidden.dtype),
            "token_ids": (list(token_ids.shape), token_ids.dtype),
        }
    )
    return {
        "handle": handle,
        "version": VERSION,
        "tensors": specs,
        "metadata": {
            "num_tokens": int(token_ids.numel()),
            "total_aligned_bytes": total,
            "extract_mode": "prompt_only",
        },
    }


def publish(store, handle: str, token_ids: list[int], hidden: torch.Tensor) -> dict[str, Any]:
    """Put one row's states [L, 4, H] into `store` (a set-up MooncakeHiddenStatesStore); returns the
    manifest a consumer passes to MooncakeTransfer.get_generated."""
    from hs_connectors.mooncake_store import assert_finite

    ids = torch.tensor(token_ids, dtype=torch.long)
    assert_finite("hidden_states", hidden)
    spec = manifest(handle, ids, hidden)
    store.put_sample(spec, {"hidden_states": hidden.contiguous(), "token_ids": ids})
    return spec
