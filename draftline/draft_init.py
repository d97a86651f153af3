"""Fine-tuning an existing EAGLE-3 draft (train.init) instead of building a fresh one.

An EAGLE/SpecForge checkpoint is converted to speculators format first; a checkpoint made for
another target is refused unless the remap it needs (aux layer ids, draft vocabulary) is allowed,
and its frozen parts (embeddings, lm_head rows, verifier norm and head) are replaced by our
target's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from draftline.checkpoint import (
    ARCHITECTURES,
    InitMismatch,
    architecture_of,
    load_verifier_tensors,
    load_vocab,
    read_weights,
)
from draftline.draft_model import set_trainable, speculators_config

if TYPE_CHECKING:
    from draftline.card import TargetCard

CONVERTED_INIT_DIR = "converted_init"


CONVERT_KEYS = {
    "norm_before_residual",
    "norm_before_fc",
    "fc_norm",
    "norm_output",
    "eagle_aux_hidden_state_layer_ids",
}


def prepare_init(init: str | Path, card: TargetCard, convert_kwargs: dict, work_dir: Path) -> Path:
    """A speculators-format directory for train.init: itself, or its conversion into work_dir
    when it is an EAGLE/SpecForge checkpoint (config.json + midlayer.* weights)."""
    path = Path(init)
    config_path = path / "config.json"
    if not config_path.is_file():
        raise InitMismatch(
            f"train.init: {path} has no config.json (a local checkpoint directory is required)"
        )
    config = json.loads(config_path.read_text())
    kind = config.get("speculators_model_type")
    if kind is not None:
        if kind != "eagle3":
            raise InitMismatch(f"train.init: {path} is a {kind!r} speculator, not eagle3")
        return path
    unknown = sorted(set(convert_kwargs) - CONVERT_KEYS)
    if unknown:
        raise InitMismatch(
            f"train.init_convert: unknown keys {unknown}; allowed {sorted(CONVERT_KEYS)}"
        )
    from speculators.convert.eagle.eagle3_converter import Eagle3Converter

    out = Path(work_dir) / CONVERTED_INIT_DIR
    Eagle3Converter().convert(path, out, card.model, validate=False, **convert_kwargs)
    return out


def draft_target_ids(d2t: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """Target token id of every draft token (the identity when the draft keeps the full vocab)."""
    if d2t is None:
        return torch.arange(vocab_size)
    return torch.arange(d2t.shape[0]) + d2t.long()


def check_init(
    config,
    init_d2t: torch.Tensor | None,
    card: TargetCard,
    d2t: torch.Tensor,
    num_layers: int,
    remap_aux: bool,
    remap_vocab: bool,
) -> list[str]:
    """Refuse a checkpoint that cannot serve this target; return the remaps that were allowed."""
    from draftline.config import eagle3_default_aux_ids

    tl = config.transformer_layer_config
    if tl.hidden_size != card.hidden_size:
        raise InitMismatch(
            f"train.init: hidden size {tl.hidden_size} differs from the target's "
            f"{card.hidden_size} ({card.model}); no remap exists for this"
        )
    if tl.vocab_size != card.vocab_size:
        raise InitMismatch(
            f"train.init: target vocabulary of {tl.vocab_size} tokens differs from the "
            f"target's {card.vocab_size}: it was trained for another tokenizer"
        )
    if tl.num_hidden_layers != num_layers:
        raise InitMismatch(
            f"train.num_layers: {num_layers}, but train.init has {tl.num_hidden_layers} "
            "decoder layers; set train.num_layers to match"
        )
    notes = []
    # EAGLE checkpoints without ids were trained with the EAGLE-3 rule (as vLLM assumes).
    init_aux = list(
        config.eagle_aux_hidden_state_layer_ids or eagle3_default_aux_ids(card.num_layers)
    )
    if init_aux != card.aux_ids:
        if not remap_aux:
            raise InitMismatch(
                f"train.init: aux layer ids {init_aux} differ from the target card's "
                f"{card.aux_ids} (target.aux_layer_ids); set "
                "train.init_remap_aux_layers: true to reuse its fc slot by slot"
            )
        notes.append(f"aux layers {init_aux} -> {card.aux_ids}")
    ours = draft_target_ids(d2t, card.vocab_size)
    theirs = draft_target_ids(init_d2t, card.vocab_size)
    if not torch.equal(ours, theirs):
        shared = len(set(ours.tolist()) & set(theirs.tolist()))
        if not remap_vocab:
            raise InitMismatch(
                f"train.init: draft vocabulary differs ({len(theirs)} tokens, {shared} shared "
                f"with our {len(ours)} in models/vocab); set train.init_remap_vocab: true"
            )
        notes.append(f"vocab {len(theirs)} -> {len(ours)} tokens ({shared} shared)")
    return notes


def remap_lm_head(
    init_head: torch.Tensor,
    init_d2t: torch.Tensor | None,
    target_rows: torch.Tensor,
    d2t: torch.Tensor,
    vocab_size: int,
) -> torch.Tensor:
    """lm_head rows for our draft vocab: the init's row where it has the token, else the target's
    (target_rows: the target's lm_head rows of our draft vocab, in draft order)."""
    row_of = {t: i for i, t in enumerate(draft_target_ids(init_d2t, vocab_size).tolist())}
    ours = draft_target_ids(d2t, vocab_size).tolist()
    head = target_rows.clone()
    for i, t in enumerate(ours):
        if t in row_of:
            head[i] = init_head[row_of[t]]
    return head


# Parts the target provides (or that are recomputed); the checkpoint may carry them or not.
FROM_TARGET = {
    "embed_tokens.weight",
    "lm_head.weight",
    "verifier_lm_head.weight",
    "verifier_norm.weight",
    "d2t",
    "t2d",
}


def load_init_draft(
    init_dir: Path,
    card: TargetCard,
    vocab_dir: Path,
    num_layers: int,
    ttt_steps: int,
    attn_impl: str = "eager",
    *,
    speculative_tokens: int | None = None,
    train_embeddings: bool = False,
    train_lm_head: bool = False,
    remap_aux: bool = False,
    remap_vocab: bool = False,
    architecture: str | None = None,
):
    """(draft, notes): the checkpoint's architecture and trained weights, re-targeted to our card:
    our verifier, aux layer ids and draft vocabulary; frozen parts taken from our target.
    architecture: the train.architecture the checkpoint must have (None: any)."""
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    d2t, t2d = load_vocab(vocab_dir)
    config = Eagle3SpeculatorConfig.from_pretrained(str(init_dir))
    found = architecture_of(config)
    if architecture is not None and found != architecture:
        flags = {key: getattr(config, key, None) for key in (*ARCHITECTURES["eagle3"], "fc_norm")}
        raise InitMismatch(
            f"train.init: its norms {flags} are the {found or 'neither'!s} architecture, "
            f"train.architecture is {architecture!r}: set train.architecture to match"
            + ("" if found else " (or convert it with train.init_convert flags that match)")
        )
    weights = read_weights(init_dir)
    notes = check_init(config, weights.get("d2t"), card, d2t, num_layers, remap_aux, remap_vocab)
    config.eagle_aux_hidden_state_layer_ids = card.aux_ids
    config.draft_vocab_size = int(d2t.shape[0])
    config.embed_requires_grad = train_embeddings
    config.speculators_config = speculators_config(card, speculative_tokens or ttt_steps)
    config.transformer_layer_config._attn_implementation = attn_impl  # noqa: SLF001
    model = Eagle3DraftModel(config)
    model.load_vocab_mappings(t2d, d2t)
    load_verifier_tensors(
        model, card
    )  # embeddings, lm_head rows, verifier norm/head from our target

    trained = {k: v for k, v in weights.items() if k not in FROM_TARGET}
    if train_embeddings and "embed_tokens.weight" in weights:
        trained["embed_tokens.weight"] = weights["embed_tokens.weight"]
    if (
        train_lm_head and "lm_head.weight" in weights
    ):  # verifier_lm_head = the target's rows of our vocab
        trained["lm_head.weight"] = remap_lm_head(
            weights["lm_head.weight"],
            weights.get("d2t"),
            model.verifier_lm_head.weight.detach(),
            d2t,
            card.vocab_size,
        )
    expected = set(model.state_dict()) - FROM_TARGET
    if "input_norm.weight" in expected - set(trained):  # tolerated by speculators too
        notes.append("input_norm.weight missing: starts at ones")
        expected.discard("input_norm.weight")
    missing = sorted(expected - set(trained))
    unexpected = sorted(set(trained) - set(model.state_dict()))
    if missing or unexpected:
        raise InitMismatch(
            f"train.init: weights do not fit its config: missing {missing[:8]}, unexpected {unexpected[:8]}"
        )
    try:
        model.load_state_dict({k: v.float() for k, v in trained.items()}, strict=False)
    except RuntimeError as err:
        raise InitMismatch(f"train.init: {err}") from None
    set_trainable(model, train_embeddings, train_lm_head)
    return model, notes
