"""params.yaml `tokenize` and `vocab`."""

from __future__ import annotations

from typing import Literal

from draftline.core.config import Section, operational, shaping


class TokenizeConfig(Section):
    max_length: int = shaping(
        512, ge=8
    )  # tokens per row; longer rows are cut (counted in the report)
    # the stage fails when more of the rows were cut by max_length: their tails are lost, and the
    # hidden-state disk estimate counts only what is left; a share of 1 turns the check off
    max_truncated_share: float = operational(0.05, ge=0, le=1)
    # the tokens of each assistant turn: retokenize = its text re-tokenized within the chat
    # template; server = the token ids the server generated (recorded by regenerate), where the
    # line has them (the report counts the turns where the two differ)
    assistant_ids: Literal["retokenize", "server"] = shaping("retokenize")


class VocabConfig(Section):
    draft_vocab_size: int = shaping(
        256, ge=2
    )  # most frequent trainable target tokens; at most the target vocab
    # the stage fails when the draft vocabulary covers less of the trainable tokens (the draft
    # cannot propose the rest: its ceiling on per-token acceptance); 0 turns the check off
    min_coverage: float = operational(0.9, ge=0, le=1)
