"""Preflight of a saved draft: its static checks against the target card as an engine will read
it (`check_draft`, `check_vocab`); the problems are listed, with a message that says why. The
draft's config.json and its d2t/t2d tensors are read (no weights are loaded), and a draft that
would run but silently be fed the wrong inputs is refused:
- aux layer ids or a hidden size that differ from the target card's;
- a draft vocabulary whose d2t/t2d do not fit the target vocabulary.
The benchmark's engine settings (algorithm, checkpoint layout) are checked beside it in
draftline/benchmark/preflight.py.

Aux layer id conventions differ between engines. vLLM's `eagle_aux_hidden_state_layer_ids` (and
the card's) name the hidden state that *enters* decoder layer i (`aux_hidden_states.append(...)`
before `layer(...)` in vllm/model_executor/models/llama.py). SGLang adds one to the ids it reads
from a draft's `eagle_config` ("for the ith layer, it takes the output of the (i-1)th layer",
`set_eagle3_layers_to_capture` in sglang/srt/models/llama.py), so card id = SGLang id + 1.
Without explicit ids both capture the inputs of layers [2, N//2, N-3].
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftline.draft.checkpoint import DraftFacts
from draftline.draft.methods import UnknownDrafter, drafter

if TYPE_CHECKING:
    from draftline.core.card import TargetCard


def engine_aux_ids_as_card(facts: DraftFacts, engine: str, num_layers: int) -> list[int]:
    """The aux layer ids the engine will capture, in the card's (decoder-layer input) convention."""
    if facts.aux_layer_ids is None:
        return [2, num_layers // 2, num_layers - 3]  # both engines' default
    if engine == "sglang" and facts.layout == "eagle":
        return [i + 1 for i in facts.aux_layer_ids]  # SGLang captures the output of layer id
    return list(facts.aux_layer_ids)


def check_draft(card: TargetCard, facts: DraftFacts, engine: str) -> list[str]:
    """Mismatches between a draft and its target that no engine reports; [] when it fits."""
    problems = []
    try:
        drafter(facts.algorithm)
    except UnknownDrafter as err:
        problems.append(f"{facts.path}: {err}")
    aux = engine_aux_ids_as_card(facts, engine, card.num_layers)
    if sorted(aux) != sorted(card.aux_ids):
        hint = (
            " (SGLang reads eagle_config ids as layer outputs: id = card id - 1)"
            if engine == "sglang"
            else ""
        )
        problems.append(
            f"aux layer ids: the {engine} engine would capture decoder-layer inputs {aux}, "
            f"the target card says {card.aux_ids}{hint}"
        )
    hidden = card.hidden_size
    if facts.target_hidden_size is not None and facts.target_hidden_size != hidden:
        problems.append(
            f"hidden size: the draft expects a target hidden size of {facts.target_hidden_size}, "
            f"the target card says {hidden}"
        )
    if facts.fc_in_features is not None and facts.fc_in_features != 3 * hidden:  # every method
        problems.append(
            f"hidden size: the draft's fc takes {facts.fc_in_features} features, EAGLE-3 on this "
            f"target needs 3 x {hidden} = {3 * hidden}"
        )
    problems.extend(check_vocab(card.vocab_size, facts))
    return problems


def check_vocab(target_vocab: int, facts: DraftFacts) -> list[str]:
    """d2t (offsets: target id = i + d2t[i]) and t2d (mask over the target vocab) must agree and fit."""
    problems = []
    if facts.vocab_size is not None and facts.vocab_size != target_vocab:
        problems.append(
            f"vocab: the draft embeds a vocabulary of {facts.vocab_size}, the target has {target_vocab}"
        )
    if facts.d2t is None:
        return problems
    n = len(facts.d2t)
    if facts.draft_vocab_size is not None and facts.draft_vocab_size != n:
        problems.append(f"vocab: draft_vocab_size {facts.draft_vocab_size} but d2t has {n} entries")
    if n > target_vocab:
        problems.append(
            f"vocab: draft vocabulary of {n} is larger than the target's {target_vocab}"
        )
    mapped = [i + off for i, off in enumerate(facts.d2t)]
    outside = [t for t in mapped if not 0 <= t < target_vocab]
    if outside:
        problems.append(
            f"vocab: d2t maps {len(outside)} draft ids outside the target vocabulary [0, {target_vocab}), "
            f"e.g. {outside[:5]}"
        )
    if facts.t2d_len is not None:
        if facts.t2d_len != target_vocab:
            problems.append(
                f"vocab: t2d covers {facts.t2d_len} target ids, the target has {target_vocab}"
            )
        if facts.t2d_count != n:
            problems.append(
                f"vocab: t2d marks {facts.t2d_count} target ids but the draft vocabulary has {n}"
            )
        elif facts.t2d_true is not None and set(mapped) != facts.t2d_true:
            problems.append("vocab: t2d and d2t name different target tokens")
    return problems
