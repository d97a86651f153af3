"""Loss mask: exactly the assistant's generated tokens, end-of-turn included, scaffolding excluded."""

import pytest

from draftline.chat import TemplateMismatch, tokenize_conversation
from draftline.corpus import arithmetic, multi_turn, tool_call
import random


def masked_text(tok, enc):
    return tok.decode([t for t, m in zip(enc["input_ids"], enc["loss_mask"]) if m])


def test_mask_covers_reasoning_content_and_eos_only(tiny_tokenizer):
    conv = arithmetic(random.Random(3))
    enc = tokenize_conversation(tiny_tokenizer, conv["messages"], None, 512)
    answer = conv["messages"][-1]
    expected = f"<think>{answer['reasoning_content']}</think>\n{answer['content']}<|im_end|>"
    assert masked_text(tiny_tokenizer, enc) == expected
    assert not enc["truncated"]
    # the role header and the user turn are not trained
    first_masked = enc["loss_mask"].index(1)
    assert tiny_tokenizer.decode(enc["input_ids"][:first_masked]).endswith("<|im_start|>assistant\n")


def test_mask_multi_turn_and_tool_calls(tiny_tokenizer):
    rng = random.Random(5)
    conv = tool_call(rng)
    enc = tokenize_conversation(tiny_tokenizer, conv["messages"], conv["tools"], 2048)
    text = masked_text(tiny_tokenizer, enc)
    call = conv["messages"][-3]["tool_calls"][0]["function"]
    assert f'<tool_call>{{"name": "{call["name"]}", "arguments": {call["arguments"]}}}</tool_call><|im_end|>' in text
    assert conv["messages"][-1]["content"] + "<|im_end|>" in text
    assert "<tool_response>" not in text and "# Tools" not in text  # tool result and schema excluded
    conv = multi_turn(rng)
    enc = tokenize_conversation(tiny_tokenizer, conv["messages"], None, 2048)
    text = masked_text(tiny_tokenizer, enc)
    assert text == "".join(m["content"] + "<|im_end|>" for m in conv["messages"] if m["role"] == "assistant")


def test_truncation(tiny_tokenizer):
    conv = multi_turn(random.Random(1))
    enc = tokenize_conversation(tiny_tokenizer, conv["messages"], None, 10)
    assert enc["truncated"] and len(enc["input_ids"]) == len(enc["loss_mask"]) == 10


def test_template_that_rewrites_history_is_reported(tiny_tokenizer):
    tok = tiny_tokenizer
    original = tok.chat_template
    # drops reasoning of every assistant turn but the last, as Qwen3-style templates do
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.role == 'assistant' and m.reasoning_content and loop.last %}<think>{{ m.reasoning_content }}</think>{% endif %}"
        "{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    try:
        msgs = [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b", "reasoning_content": "r"},
            {"role": "user", "content": "c"},
            {"role": "assistant", "content": "d"},
        ]
        with pytest.raises(TemplateMismatch):
            tokenize_conversation(tok, msgs, None, 512)
    finally:
        tok.chat_template = original
