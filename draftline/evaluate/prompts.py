"""The prompt an eval row is decoded from, the same for every engine that measures it (the built-in
one, vLLM, the eval sets' comparison): its own ids where it carries them (a later turn of a
multi-turn row, draftline/evaluate/compare.py), its whole history up to the last user turn where
its `decode` says so (the long-context set: draftline/data/pydoc_long.py), else its first turn as
a server builds it (draftline/tokens/chat.py).

It lives here, not beside the chat template's rendering in draftline/tokens/chat.py: that module
shapes the tokenized training rows (draftline/core/shaping.py), and what evaluate decodes is no
part of them.
"""

from __future__ import annotations

from draftline.data.pydoc_long import DECODE_HISTORY
from draftline.tokens.chat import chat_prompt_ids, first_turn_prompt


def history_prompt(row: dict) -> list[dict]:
    """The messages up to and including the last user turn: a multi-turn conversation asked for
    its next answer (a long agentic or document history)."""
    messages = row["messages"]
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        raise ValueError(f"row {row.get('id')}: no user turn to answer")
    return messages[: last_user + 1]


def eval_prompt_ids(tokenizer, row: dict, chat_template_kwargs: dict | None = None) -> list[int]:
    """Token ids of the prompt an eval row is decoded from (the module docstring's rule), with the
    template's kwargs (a thinking switch) where given."""
    if row.get("prompt_ids"):
        return list(row["prompt_ids"])
    messages = (
        history_prompt(row) if row.get("decode") == DECODE_HISTORY else first_turn_prompt(row)
    )
    return chat_prompt_ids(tokenizer, messages, row.get("tools"), chat_template_kwargs or {})
