"""params.yaml `train`: the draft's shape, its optimisation, and the backend that trains it."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from draftline.core.config import Section, operational, shaping
from draftline.draft.params import DFlashParams, PEagleParams, check_loss, method_named


class TrainConfig(Section):
    # the drafter, one registered in draftline/draft/params/: eagle3 (a chain of k draft steps,
    # each reading the last), peagle (P-EAGLE: all k draft tokens in one forward, served by vLLM as
    # eagle3 with parallel_drafting), dflash (a block of masked positions filled in one forward);
    # each through speculators' own model and loss
    method: str = shaping("eagle3")
    peagle: PEagleParams = shaping(PEagleParams())
    dflash: DFlashParams = shaping(DFlashParams())
    # peagle / dflash: the token id their masked draft positions read; null = the tokenizer's mask
    # token, else the first embedding row past the tokenizer, else pad / eos / unk (as speculators)
    mask_token_id: int | None = shaping(None, ge=0)
    # builtin: our loop on CPU (float32) or one GPU (bf16 autocast); speculators: hand off to
    # `torchrun -m speculators.train` (several GPUs, FSDP) with arguments built from these params.
    backend: Literal["builtin", "speculators"] = shaping("builtin")
    # null = from scratch; else an EAGLE-3 checkpoint directory to fine-tune: speculators format,
    # or an EAGLE/SpecForge-style one (converted with speculators' Eagle-3 converter first).
    init: str | None = shaping(None)
    # speculators convert --algorithm-kwargs for a non-speculators `init` (norm_before_residual, ...)
    init_convert: dict[str, bool | list[int]] = shaping({})
    # Explicit remaps when `init` was trained for other aux layers / another draft vocabulary:
    # aux: its fc is reused slot by slot for our aux layer ids; vocab: lm_head rows are matched
    # by target token id (tokens new to the draft take the target's lm_head row).
    init_remap_aux_layers: bool = shaping(False)
    init_remap_vocab: bool = shaping(False)
    num_layers: int = shaping(1, ge=1)  # draft decoder layers (must match `init` when given)
    # speculators: speculators' eagle3 norms (served by vLLM); eagle3: the original EAGLE-3 decoder,
    # which SGLang serves too (`draftline export-sglang`). null: speculators for a new
    # draft, the checkpoint's own with `init` (set, `init` must have it)
    architecture: Literal["speculators", "eagle3"] | None = shaping(None)
    train_embeddings: bool = shaping(False)  # embeddings come from the target; frozen unless true
    # lm_head = target lm_head rows of the draft vocab (with `init`: the drafter's own head on it);
    # frozen unless true
    train_lm_head: bool = shaping(False)
    # Start the draft's decoder layer from this target decoder layer (its attention on the hidden
    # half of the draft's input, MLP, norms; the fc passes through the aux state entering that layer
    # when it is an aux layer). null = random init. Builtin backend, a new draft only (not with `init`).
    # "last_aux": the last aux layer (N - 3 by the EAGLE-3 rule), what the SmolLM2 recipe found best
    init_layer_from_target: Annotated[int, Field(ge=0)] | Literal["last_aux"] | None = shaping(None)
    epochs: int = shaping(4, ge=1)
    lr: float = shaping(3e-3, gt=0)
    scheduler: Literal["cosine", "linear"] = shaping(
        "cosine"
    )  # after linear warmup (as speculators)
    warmup_steps: int = shaping(10, ge=0)  # optimizer steps
    max_grad_norm: float = shaping(1.0, gt=0)
    weight_decay: float = shaping(0.0, ge=0)
    ttt_steps: int = shaping(3, ge=1)
    # the objective, speculators' own loss in both backends (draftline/draft/params/objective.py):
    # kl_div (forward KL to the target's distribution, the default), ce (cross-entropy on the
    # target's argmax: what greedy verification accepts), nla (-log sum min(p, q)), lk_hybrid, tv,
    # jsd, rkl; or a weighted mix {name: weight, ...} (docs/training.md#the-objective)
    loss: str | dict[str, float] = shaping("kl_div")
    # eagle3: TTT step s's loss weighted ttt_step_loss_decay**s (1.0: every step alike); the
    # position weighting of train.method dflash is train.dflash.position_weight
    ttt_step_loss_decay: float = shaping(1.0, gt=0)
    # speculative_tokens written to the draft config (vLLM defaults num_speculative_tokens to it)
    speculative_tokens: int | None = shaping(None, ge=1)  # null = ttt_steps
    pack_len: int = shaping(2048, ge=16)  # tokens per packed micro-batch, per device
    grad_accum_steps: int = shaping(1, ge=1)  # micro-batches per optimizer step (builtin backend)
    val_fraction: float = shaping(0.1, gt=0, lt=1)
    checkpoint_every_steps: int = operational(
        20, ge=1
    )  # resume state every N optimizer steps (+ each epoch)
    device: Literal["auto", "cpu", "cuda"] = shaping("auto")
    seed: int = shaping(0)
    # builtin backend: threads reading the next packs of hidden states while a step computes (up to
    # 2 packs ahead each; page-locked on CUDA); 0 = each pack read between steps. Not with
    # hidden_states.mode online (there the target computes each pack: it is read in the loop)
    loader_workers: int = operational(2, ge=0)
    # speculators backend only
    gpus: int | None = operational(
        None, ge=1
    )  # torchrun --nproc-per-node; null = every visible GPU
    fsdp: bool = operational(
        False
    )  # --fsdp-shard: shard the draft across GPUs instead of replicating it
    num_workers: int = operational(4, ge=0)  # dataloader workers per GPU
    torchrun_args: list[str] = operational(
        []
    )  # extra torchrun arguments, e.g. multi-node rendezvous

    @field_validator("method")
    @classmethod
    def _registered_method(cls, method: str) -> str:
        method_named(method)  # UnknownDrafter names the registered ones
        return method

    @field_validator("loss")
    @classmethod
    def _speculators_loss(cls, loss: str | dict[str, float]) -> str | dict[str, float]:
        return check_loss(loss)  # a ValueError names speculators' losses

    @model_validator(mode="after")
    def _backend_options(self):
        if self.backend == "speculators" and self.grad_accum_steps != 1:
            raise ValueError(
                "grad_accum_steps: speculators train has no gradient accumulation; "
                "use more GPUs or a larger pack_len with backend speculators"
            )
        if self.backend == "speculators" and self.train_lm_head:
            raise ValueError(
                "train_lm_head: speculators train keeps lm_head frozen (a train.init's own head is "
                "kept, frozen); use backend builtin to train it"
            )
        method_named(self.method).check_train(self)
        if self.init_layer_from_target is not None and (
            self.backend != "builtin" or self.init is not None
        ):
            raise ValueError(
                "init_layer_from_target: builtin backend and a new draft only (no `init`)"
            )
        return self
