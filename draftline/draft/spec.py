"""What the draft's code reads of the params sections above it, as protocols: `DraftSpec`, the
train params that shape a draft (train/config.py's TrainConfig gives them), and `ServingSpec`, the
benchmark's vLLM settings a drafter checks (benchmark/config.py's BenchmarkConfig). draft/ names
these and never the sections themselves, so it imports neither train/ nor benchmark/, both of
which build on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from draftline.draft.params.dflash import DFlashParams
    from draftline.draft.params.peagle import PEagleParams


class DraftSpec(Protocol):
    """The train params a draft is built, initialised and trained by."""

    method: str
    peagle: PEagleParams
    dflash: DFlashParams
    mask_token_id: int | None
    init_remap_aux_layers: bool
    init_remap_vocab: bool
    num_layers: int
    architecture: str | None
    train_embeddings: bool
    train_lm_head: bool
    ttt_steps: int
    loss: str | dict[str, float]
    ttt_step_loss_decay: float
    speculative_tokens: int | None


class VllmServing(Protocol):
    """benchmark.vllm as a drafter checks it."""

    speculative_config: dict[str, int | float | str | bool]


class ServingSpec(Protocol):
    """The benchmark settings a drafter checks against how its method is served."""

    vllm: VllmServing
