"""hidden_states.mode: online for the builtin trainer: the target runs on each packed batch and its
states go straight into training, never to disk (online.engine hf; with engine vllm, and for
speculators' trainers, a vLLM extraction server makes them: draftline/hidden_states/online_server.py).

speculators' ArrowDataset is kept whole (splits, token check, slicing into aux / last states);
only where the states come from changes. The DataLoader fetches a packed batch through
`__getitems__`, so the rows of one packed batch go through the target in one right-padded forward
(draftline.hidden_states.capture, the extraction's own hooks: aux-layer inputs and the pre-norm last
state), and each row's states then take the round trip of the stored format (bf16 or fp8), so the
draft sees the values it would have read from files.
"""

from __future__ import annotations

from typing import Any

import torch
from hs_connectors import HiddenStatesTransfer
from speculators.train.data import ArrowDataset

from draftline.hidden_states.capture import capture
from draftline.hidden_states.formats import roundtrip


class BatchTransfer(HiddenStatesTransfer):
    """Hands ArrowDataset the states captured for the current packed batch, once each."""

    def __init__(self):
        self.samples: dict[int, dict[str, torch.Tensor]] = {}

    def get_cached(self, file_idx: int) -> dict[str, torch.Tensor] | None:
        return self.samples.pop(file_idx, None)

    def get_generated(self, hs_transfer_params: dict[str, Any]) -> dict[str, torch.Tensor] | None:
        return None


class OnlineArrowDataset(ArrowDataset):
    """ArrowDataset whose states come from `target` (a causal LM in eval mode) at fetch time.

    storage: the stored format's dtype (torch.bfloat16, or torch.float8_e4m3fn for fp8) whose round
    trip the states take; `forwards` and `tokens` count the target's work."""

    def __init__(self, target, aux_layer_ids: list[int], storage: torch.dtype, **kwargs):
        super().__init__(transfer=BatchTransfer(), on_missing="raise", **kwargs)
        self.target, self.aux_layer_ids, self.storage = target, list(aux_layer_ids), storage
        self.forwards = self.tokens = 0

    def __getitems__(self, indices: list[int]) -> list:
        rows = [self.data[i]["input_ids"].tolist() for i in indices]
        # capture runs under no_grad (inference tensors could not be saved for the draft's backward)
        states = capture(self.target, rows, self.aux_layer_ids)  # one forward: [L_b, 4, H] each
        for i, ids, hs in zip(indices, rows, states, strict=True):
            self.transfer.samples[self._map_to_file_idx(i)] = {
                "token_ids": torch.tensor(ids, dtype=torch.long),
                "hidden_states": roundtrip(hs.cpu(), self.storage, self.hidden_states_dtype),
            }
        self.forwards += 1
        self.tokens += sum(len(ids) for ids in rows)
        return [self[i] for i in indices]
