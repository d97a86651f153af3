"""The built-in batch server's decoding: prompts decoded greedily together in one batch (rows join
and leave between steps), near-ties of the target's top two logits counted."""

from __future__ import annotations

import contextlib
import copy
import inspect
from dataclasses import dataclass, field
from typing import Generic, TypeVar

R = TypeVar("R")


@dataclass
class Row(Generic[R]):
    """One prompt of a GreedyBatch and what it generated; `request` is the caller's own handle on
    it (the batch server's Request), carried along untouched."""

    prompt_ids: list[int]
    max_tokens: int
    request: R | None = None
    tokens: list[int] = field(default_factory=list)
    ties: int = 0
    processors: object = None  # the target's generation-config logits processors, if any


# ---- greedy decoding, step by step -----------------------------------------------------------


def near_tie_mask(scores, tie_tolerance: float):
    """(B,) bool: whether each row's pick from `scores` (B, V) had a runner-up within tie_tolerance."""
    top2 = scores.float().topk(2, dim=-1).values  # (B, 2)
    return (top2[:, 0] - top2[:, 1]) < tie_tolerance


def greedy_generation_config(model, pad_id: int, eos_ids: set[int]):
    """The generation config `generate(do_sample=False)` runs with, or None when it adds no logits
    processor (the usual case: then the scores are the logits)."""
    # torch loads on first use: batch_server (imported by regenerate.run) stays light
    import torch

    config, _ = model._prepare_generation_config(
        None,
        do_sample=False,
        temperature=None,
        top_p=None,
        top_k=None,
        pad_token_id=pad_id,
        eos_token_id=sorted(eos_ids),
    )
    model._prepare_special_tokens(config, True, device=model.device)
    probe = torch.tensor([[pad_id]], device=model.device)
    config.max_new_tokens, config.max_length = 1, 2
    if not model._get_logits_processor(
        config,
        input_ids_seq_length=1,
        encoder_input_ids=probe,
        device=model.device,
        model_kwargs={},
    ):
        return None
    return config


class GreedyBatch:
    """Rows decoding together, one token per step, on one KV cache over their left-padded ids.

    The forward passes are those `generate(do_sample=False)` makes (the inputs built by the model's
    `prepare_inputs_for_generation`, logits of the last position only, the generation config's
    processors, argmax), so a batch whose rows neither join nor leave picks the tokens `generate`
    picks. Rows can join a running batch (prefilled apart, then the KV caches left-padded to one
    length) where every cache layer is a plain full-attention `DynamicLayer`, and leave at any step.
    Use: `join(rows)`, then repeat `pick()`, `keep(rows still wanted)`, `step()`."""

    def __init__(self, model, pad_id: int, eos_ids: set[int], tie_tolerance: float):
        self.model, self.pad_id, self.eos_ids = model, pad_id, eos_ids
        self.tie_tolerance = tie_tolerance
        self.keep_last_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.generation_config = greedy_generation_config(model, pad_id, eos_ids)
        # generate's decoding-time switches (MoE experts kernels on GPUs), around each decode step
        self.decoding = getattr(model, "_optimize_model_for_decode", contextlib.nullcontext)
        self.rows: list[Row] = []
        self.cache = self.mask = self.next_pos = self.logits = self.last = None

    def __len__(self) -> int:
        return len(self.rows)

    def done(self, row: Row) -> bool:
        return bool(row.tokens) and (
            row.tokens[-1] in self.eos_ids or len(row.tokens) >= row.max_tokens
        )

    def can_join(self) -> bool:
        """Whether rows may join now: nothing runs, or the cache can be padded and stacked."""
        from transformers.cache_utils import DynamicLayer

        return not self.rows or all(type(layer) is DynamicLayer for layer in self.cache.layers)

    def _forward(self, ids, mask, positions, cache, first: bool):
        """Logits (B, V) float32 of the last position after `ids` (B, T)."""
        import torch

        kwargs = {"past_key_values": cache, "position_ids": positions, "use_cache": True}
        if not bool(mask.all()):  # generate drops a mask of all ones
            kwargs["attention_mask"] = mask
        if self.keep_last_logits:
            kwargs["logits_to_keep"] = 1
        inputs = self.model.prepare_inputs_for_generation(ids, is_first_iteration=first, **kwargs)
        with torch.no_grad():
            out = self.model(**inputs, return_dict=True)
        return out.logits[:, -1].to(copy=True, dtype=torch.float32)

    def _processors(self, row: Row):
        if self.generation_config is None:
            return None
        import torch

        config = copy.deepcopy(self.generation_config)
        config.max_new_tokens = row.max_tokens
        config.max_length = len(row.prompt_ids) + row.max_tokens
        return self.model._get_logits_processor(
            config,
            input_ids_seq_length=len(row.prompt_ids),
            encoder_input_ids=torch.tensor([row.prompt_ids], device=self.model.device),
            device=self.model.device,
            model_kwargs={},
        )

    def join(self, rows: list[Row]) -> None:
        """Prefills `rows` (left-padded) and adds them to the batch."""
        import torch
        from transformers import DynamicCache

        device = self.model.device
        width = max(len(r.prompt_ids) for r in rows)
        ids = torch.tensor(
            [[self.pad_id] * (width - len(r.prompt_ids)) + r.prompt_ids for r in rows],
            device=device,
        )
        mask = torch.tensor(
            [[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in rows],
            device=device,
        )
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)  # (B, T)
        cache = DynamicCache(config=self.model.config.get_text_config(decoder=True))
        logits = self._forward(ids, mask, positions, cache, first=True)
        for row in rows:
            row.processors = self._processors(row)
        if not self.rows:
            self.rows, self.cache, self.mask = list(rows), cache, mask
            self.next_pos, self.logits = positions[:, -1] + 1, logits
            return
        if not self.can_join():
            raise RuntimeError("rows cannot join a batch whose cache is not plain full attention")
        longer = self.mask.shape[1] - mask.shape[1]
        mask = _pad_left(cache, mask, longer)
        self.mask = _pad_left(self.cache, self.mask, -longer)
        for mine, theirs in zip(self.cache.layers, cache.layers):
            mine.keys = torch.cat([mine.keys, theirs.keys])
            mine.values = torch.cat([mine.values, theirs.values])
        self.mask = torch.cat([self.mask, mask])
        self.next_pos = torch.cat([self.next_pos, positions[:, -1] + 1])
        self.logits = torch.cat([self.logits, logits])
        self.rows += rows

    def pick(self) -> None:
        """Each row's next token (argmax of its processed scores) appended to it, near-ties counted."""
        import torch

        scores = self.logits
        if any(r.processors for r in self.rows):  # each on its own ids, as a batch-1 generate
            scores = torch.cat(
                [
                    r.processors(
                        torch.tensor([r.prompt_ids + r.tokens], device=scores.device),
                        scores[i : i + 1],
                    )
                    if r.processors
                    else scores[i : i + 1]
                    for i, r in enumerate(self.rows)
                ]
            )
        self.last = scores.argmax(dim=-1)  # (B,)
        near = near_tie_mask(scores, self.tie_tolerance).tolist()
        for row, token, tie in zip(self.rows, self.last.tolist(), near):
            row.tokens.append(token)
            row.ties += tie
        self.logits = None

    def keep(self, indices: list[int]) -> None:
        """Only the rows at `indices` go on (the others ended, or nobody waits for them)."""
        import torch

        if len(indices) == len(self.rows):
            return
        if not indices:
            self.rows = []
            self.cache = self.mask = self.next_pos = self.last = None
            return
        index = torch.tensor(indices, device=self.mask.device)
        self.cache.reorder_cache(index)
        self.mask, self.next_pos, self.last = (
            self.mask[index],
            self.next_pos[index],
            self.last[index],
        )
        self.rows = [self.rows[i] for i in indices]
        if self.can_join():  # columns that are padding in every row left: not attended any more
            start = int(self.mask.any(dim=0).nonzero()[0])
            if start:
                self.mask = self.mask[:, start:]
                for layer in self.cache.layers:
                    layer.keys = layer.keys[..., start:, :]
                    layer.values = layer.values[..., start:, :]

    def step(self) -> None:
        """One forward pass over each row's last token: the logits of its next pick."""
        import torch

        self.mask = torch.cat([self.mask, self.mask.new_ones(len(self.rows), 1)], dim=1)
        with self.decoding():
            self.logits = self._forward(
                self.last[:, None], self.mask, self.next_pos[:, None], self.cache, first=False
            )
        self.next_pos = self.next_pos + 1


def _pad_left(cache, mask, columns: int):
    """`mask` (B, T) and the cache's keys and values, `columns` more masked positions on the left."""
    import torch

    if columns <= 0:
        return mask
    for layer in cache.layers:
        for name in ("keys", "values"):
            states = getattr(layer, name)  # (B, heads, T, head_dim)
            shape = (*states.shape[:-2], columns, states.shape[-1])
            setattr(layer, name, torch.cat([states.new_zeros(shape), states], dim=-2))
    return torch.cat([mask.new_zeros(mask.shape[0], columns), mask], dim=1)


def decode_batch(
    model,
    prompts: list[list[int]],
    max_tokens: int | list[int],
    pad_id: int,
    eos_ids: set[int],
    tie_tolerance: float,
) -> list[tuple[list[int], int]]:
    """Greedy answers of the prompts decoded together: per prompt (generated ids up to and including
    the first end token and at most max_tokens, the same for all or one per prompt; near-tie count
    among them: each row leaves the batch at its own cut)."""
    batch = GreedyBatch(model, pad_id, eos_ids, tie_tolerance)
    cuts = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else max_tokens
    rows = [Row(p, cut) for p, cut in zip(prompts, cuts, strict=True)]
    batch.join(rows)
    while len(batch):
        batch.pick()
        batch.keep([i for i, r in enumerate(batch.rows) if not batch.done(r)])
        if len(batch):
            batch.step()
    return [(r.tokens, r.ties) for r in rows]
