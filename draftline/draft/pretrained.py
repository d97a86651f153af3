"""Fine-tuning an existing EAGLE-3 draft (train.init) instead of building a fresh one.

train.init is a local directory or a hub id (fetched into the hub cache: config and weights). An
EAGLE/SpecForge checkpoint is converted to speculators format first; a checkpoint made for
another target is refused unless the remap it needs (aux layer ids, draft vocabulary) is allowed.
Its decoder, fc and norms are kept, and so is its lm_head, which was trained with them: on our
draft vocabulary its row for a token both vocabularies have (matched by target id through each
d2t), the target's lm_head row for a token new to it. The verifier's parts (verifier norm and
head, and the embeddings unless train.train_embeddings) come from our target.

The probe stage runs the same checks against the card before regeneration starts
(`check_init_target`, `init_config`: the config as training will see it, no weights loaded).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from draftline.core.aux_layers import eagle3_default_aux_ids
from draftline.draft.checkpoint import (
    ARCHITECTURES,
    ORIGINAL_NORMS,
    architecture_of,
    load_verifier_tensors,
    load_vocab,
    read_draft_facts,
    read_weights,
)
from draftline.draft.init_checks import InitMismatch, read_init_config
from draftline.draft.methods import drafter, fine_tuning, of_config
from draftline.draft.model import set_trainable, speculators_config

if TYPE_CHECKING:
    from draftline.core.card import TargetCard
    from draftline.draft.spec import DraftSpec

CONVERTED_INIT_DIR = "converted_init"


CONVERT_KEYS = {
    "norm_before_residual",
    "norm_before_fc",
    "fc_norm",
    "norm_output",
    "eagle_aux_hidden_state_layer_ids",
}


def resolve_init(init: str | Path) -> Path:
    """train.init as a local directory: itself, or a hub id's snapshot in the hub cache (config and
    weight files, fetched once, as speculators' converter fetches one)."""
    path = Path(init)
    if path.is_dir():
        return path
    # speculators loads on first use: only a train.init draft needs it
    from speculators.convert.utils import ensure_checkpoint_is_local

    try:
        return ensure_checkpoint_is_local(str(init))
    except Exception as err:  # noqa: BLE001 - any hub failure: the message names the param
        cause = err.__cause__ or err
        raise InitMismatch(
            f"train.init: {init} is neither a local checkpoint directory nor a hub model id that "
            f"could be fetched ({type(cause).__name__}: {str(cause)[:200]})"
        ) from None


def fetch_init_config(init: str) -> Path:
    """The directory holding a hub train.init's config.json, fetched alone into the hub cache (its
    snapshot directory, where resolve_init later puts the weights)."""
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(init, "config.json")).parent
    except Exception as err:  # noqa: BLE001 - any hub failure: the message names the param
        raise InitMismatch(
            f"train.init: {init} is neither a local checkpoint directory nor a hub model id whose "
            f"config.json could be fetched ({type(err).__name__}: {str(err)[:200]})"
        ) from None


def _init_layout(path: Path, convert_kwargs: dict) -> dict:
    """The config.json of a train.init directory; refuses another speculator type and unknown
    train.init_convert keys for an EAGLE/SpecForge checkpoint."""
    config = read_init_config(path)
    kind = config.get("speculators_model_type")
    tunable = [d.name for d in fine_tuning()]
    if kind is not None and kind not in tunable:
        raise InitMismatch(
            f"train.init: {path} is a {kind!r} speculator, not {' / '.join(tunable)}"
        )
    unknown = sorted(set(convert_kwargs) - CONVERT_KEYS)
    if kind is None and unknown:
        raise InitMismatch(
            f"train.init_convert: unknown keys {unknown}; allowed {sorted(CONVERT_KEYS)}"
        )
    return config


def prepare_init(init: str | Path, card: TargetCard, convert_kwargs: dict, work_dir: Path) -> Path:
    """A speculators-format directory for train.init: itself, or its conversion into work_dir
    when it is an EAGLE/SpecForge checkpoint (config.json + midlayer.* weights)."""
    path = resolve_init(init)
    if _init_layout(path, convert_kwargs).get("speculators_model_type") is not None:
        return path
    from speculators.convert.eagle.eagle3_converter import Eagle3Converter

    out = Path(work_dir) / CONVERTED_INIT_DIR
    Eagle3Converter().convert(path, out, card.model, validate=False, **convert_kwargs)
    return out


def init_config(path: Path, card: TargetCard, convert_kwargs: dict):
    """(config, d2t) of a train.init directory as training will see them, without reading its
    weights: a speculators config as it is; for an EAGLE/SpecForge checkpoint the config speculators'
    Eagle-3 converter builds in prepare_init (target vocabulary from the t2d shape, else the
    target's). d2t: the draft's offsets (a tensor), None for a draft over the whole vocabulary."""
    raw = _init_layout(path, convert_kwargs)
    facts = read_draft_facts(path)  # d2t / t2d from the safetensors, nothing else loaded
    if raw.get("speculators_model_type") is not None:
        _, config_class = of_config(raw).classes()
        config = config_class.from_pretrained(str(path))
    else:
        from speculators.convert.eagle.eagle3_converter import Eagle3Converter

        eagle = {**raw, "target_vocab_size": facts.t2d_len or card.vocab_size}
        config = Eagle3Converter()._build_eagle3_speculator_config(  # noqa: SLF001
            eagle, card.model, **convert_kwargs
        )
    return config, (None if facts.d2t is None else torch.tensor(facts.d2t))


def draft_target_ids(d2t: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """Target token id of every draft token (the identity when the draft keeps the full vocab)."""
    if d2t is None:
        return torch.arange(vocab_size)
    return torch.arange(d2t.shape[0]) + d2t.long()


def check_init_target(config, card: TargetCard, num_layers: int, remap_aux: bool) -> list[str]:
    """Refuse a checkpoint whose shapes cannot serve the card's target (hidden size, target
    vocabulary, decoder layers vs train.num_layers, aux layer ids unless remapped); return the
    remaps that were allowed."""
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
    return notes


def check_architecture(config, architecture: str | None) -> None:
    """train.architecture (None: any) must be the checkpoint's own norms."""
    found = architecture_of(config)
    if architecture is not None and found != architecture:
        flags = {
            key: getattr(config, key, None) for key in (*ARCHITECTURES[ORIGINAL_NORMS], "fc_norm")
        }
        raise InitMismatch(
            f"train.init: its norms {flags} are the {found or 'neither'!s} architecture, "
            f"train.architecture is {architecture!r}: set train.architecture to match"
            + ("" if found else " (or convert it with train.init_convert flags that match)")
        )


def check_init(
    config, init_d2t: torch.Tensor | None, card: TargetCard, d2t: torch.Tensor, cfg: DraftSpec
) -> list[str]:
    """Refuse a checkpoint that cannot serve this target and draft vocabulary (train.num_layers,
    and the remaps cfg allows); return the remaps that were allowed."""
    notes = check_init_target(config, card, cfg.num_layers, cfg.init_remap_aux_layers)
    ours = draft_target_ids(d2t, card.vocab_size)
    theirs = draft_target_ids(init_d2t, card.vocab_size)
    if not torch.equal(ours, theirs):
        shared = len(set(ours.tolist()) & set(theirs.tolist()))
        if not cfg.init_remap_vocab:
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
    theirs = draft_target_ids(init_d2t, vocab_size)
    if init_head.shape[0] != len(theirs):
        raise InitMismatch(
            f"train.init: lm_head has {init_head.shape[0]} rows but its draft vocabulary "
            f"{len(theirs)} tokens (d2t)"
        )
    row_of = {t: i for i, t in enumerate(theirs.tolist())}
    ours = draft_target_ids(d2t, vocab_size).tolist()
    head = target_rows.clone()
    for i, t in enumerate(ours):
        if t in row_of:
            head[i] = init_head[row_of[t]]
    return head


# Parts the target provides or that are recomputed (the checkpoint may carry them or not); its
# lm_head is kept on our draft vocabulary (remap_lm_head), its embeddings with train_embeddings.
FROM_TARGET = {
    "embed_tokens.weight",
    "lm_head.weight",
    "verifier_lm_head.weight",
    "verifier_norm.weight",
    "d2t",
    "t2d",
}


def load_init_draft(
    init_dir: Path, card: TargetCard, vocab_dir: Path, cfg: DraftSpec, attn_impl: str = "eager"
):
    """(draft, notes): the checkpoint's architecture and trained weights, its lm_head included,
    re-targeted to our card: our verifier, aux layer ids and draft vocabulary (lm_head rows matched
    by target token id, the target's row for a token new to the draft), as the train params
    allow (train.init_remap_*, train.num_layers, train.architecture: the norms the checkpoint must
    have, null: any). lm_head stays frozen unless train.train_lm_head; the embeddings are the
    target's unless train.train_embeddings."""
    method = drafter(cfg.method)  # one that fine-tunes (TrainConfig checks)
    model_class, config_class = method.classes()
    train_embeddings = cfg.train_embeddings
    d2t, t2d = load_vocab(vocab_dir)
    config = config_class.from_pretrained(str(init_dir))
    check_architecture(config, cfg.architecture)
    weights = read_weights(init_dir)
    notes = check_init(config, weights.get("d2t"), card, d2t, cfg)
    config.eagle_aux_hidden_state_layer_ids = card.aux_ids
    config.draft_vocab_size = int(d2t.shape[0])
    config.embed_requires_grad = train_embeddings
    config.speculators_config = speculators_config(
        card, method.speculative_tokens(cfg), method.name
    )
    config.transformer_layer_config._attn_implementation = attn_impl  # noqa: SLF001
    model = model_class(config)
    model.load_vocab_mappings(t2d, d2t)
    load_verifier_tensors(model, card)  # embeddings, lm_head rows, verifier norm/head of our target

    trained = {k: v for k, v in weights.items() if k not in FROM_TARGET}
    if train_embeddings and "embed_tokens.weight" in weights:
        trained["embed_tokens.weight"] = weights["embed_tokens.weight"]
    if "lm_head.weight" in weights:  # trained with the decoder: kept, on our draft vocabulary
        target_rows = model.verifier_lm_head.weight.detach()  # the target's rows of our vocab
        trained["lm_head.weight"] = remap_lm_head(
            weights["lm_head.weight"], weights.get("d2t"), target_rows, d2t, card.vocab_size
        )
        theirs = set(draft_target_ids(weights.get("d2t"), card.vocab_size).tolist())
        new = sum(t not in theirs for t in draft_target_ids(d2t, card.vocab_size).tolist())
        if new:
            notes.append(f"lm_head: {new} tokens new to the draft take the target's rows")
    else:
        notes.append("lm_head: train.init has none; the target's rows of the draft vocabulary")
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
    set_trainable(model, train_embeddings, cfg.train_lm_head)
    return model, notes
