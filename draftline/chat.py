"""Rendering conversations with the target's chat template and masking the assistant's tokens.

The loss mask marks exactly the tokens the assistant generated: its reasoning, content, tool
calls and its end-of-turn token. Everything else (system, user, tool results, the role header
the template writes before each turn, the newline after end-of-turn) is 0.

How: render the conversation once; for each assistant turn i, the characters it contributes are
those between render(messages[:i], add_generation_prompt=True) and render(messages[:i+1]), cut
after the end-of-turn token. Tokens whose character offsets start inside such a span get mask 1.
This needs render(messages[:k]) to be a prefix of the full render for each assistant turn k;
templates that rewrite earlier turns break that and the conversation is reported, not guessed.
"""

from __future__ import annotations


class TemplateMismatch(ValueError):
    """The template renders an earlier turn differently once later turns exist."""


def render(tokenizer, messages: list[dict], tools, add_generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def assistant_char_spans(tokenizer, messages: list[dict], tools) -> tuple[str, list[tuple[int, int]]]:
    """(full text, [(start, end) character span of each assistant turn's generated text])."""
    full = render(tokenizer, messages, tools)
    eos = tokenizer.eos_token
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prefix = render(tokenizer, messages[:i], tools, add_generation_prompt=True)
        upto = render(tokenizer, messages[: i + 1], tools)
        if not (upto.startswith(prefix) and full.startswith(upto)):
            raise TemplateMismatch(f"turn {i}: the template does not render this conversation prefix-stably")
        end = len(upto)
        if eos:
            cut = upto.rfind(eos, len(prefix))
            if cut != -1:
                end = cut + len(eos)
        spans.append((len(prefix), end))
    return full, spans


def tokenize_conversation(tokenizer, messages: list[dict], tools, max_length: int) -> dict:
    """{"input_ids", "loss_mask", "truncated"} for one conversation."""
    full, spans = assistant_char_spans(tokenizer, messages, tools)
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    input_ids, offsets = enc["input_ids"], enc["offset_mapping"]
    loss_mask = [0] * len(input_ids)
    si = 0
    for t, (start, _end) in enumerate(offsets):
        while si < len(spans) and start >= spans[si][1]:
            si += 1
        if si < len(spans) and spans[si][0] <= start < spans[si][1]:
            loss_mask[t] = 1
    truncated = len(input_ids) > max_length
    return {"input_ids": input_ids[:max_length], "loss_mask": loss_mask[:max_length], "truncated": truncated}
