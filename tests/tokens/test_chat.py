"""Loss mask: exactly the assistant's generated tokens, end-of-turn included, scaffolding excluded.

Three templates: the tiny target's, a Qwen3-style thinking template that drops the reasoning of
turns before the last user message, and a Llama-3.1-style tool-calling template
(tests/fixtures/templates). For each, the masked tokens decode to the assistant turns written out
by hand from the template's structure.
"""

import copy
import json
import random
from pathlib import Path

import pytest

from draftline.targets.corpus import arithmetic, multi_turn, tool_call
from draftline.tokens.chat import (
    ServerTurn,
    TemplateMismatch,
    conversation_rows,
    end_of_turn_tokens,
    normalize_messages,
    plan_conversation,
    render,
    tokenize_conversation,
    tokenize_rows,
    trained_runs,
)

TEMPLATES = Path(__file__).parents[1] / "fixtures" / "templates"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def call(call_id, city):
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
    }


@pytest.fixture(scope="module")
def qwen3_tokenizer(tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)  # same ChatML and markup tokens as Qwen3
    tok.chat_template = (TEMPLATES / "qwen3_thinking.jinja").read_text()
    return tok


@pytest.fixture(scope="module")
def llama31_tokenizer(tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.add_special_tokens(
        {
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|eot_id|>",
            "additional_special_tokens": [
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eom_id|>",
                "<|python_tag|>",
                "<|end_of_text|>",
            ],
        }
    )
    tok.chat_template = (TEMPLATES / "llama31_tools.jinja").read_text()
    return tok


def masked_runs(tok, rows) -> list[str]:
    """Decoded runs of consecutive masked tokens, over all rows in order: one per trained turn."""
    runs = []
    for row in rows:
        assert not row[
            "whole"
        ]  # byte-level BPE: segment-wise tokens equal the row tokenized at once
        current = []
        for t, m in zip(row["input_ids"] + [None], row["loss_mask"] + [0]):
            if m:
                current.append(t)
            elif current:
                runs.append(tok.decode(current))
                current = []
    return runs


def assert_rows_are_renders(tok, rows, messages, tools):
    """Nothing lost between the segments: each row decodes to the render it was cut from, up to
    the end of its last turn (the template's newline after it is no part of the row)."""
    messages = normalize_messages(
        messages
    )  # tool-call arguments as dicts, as the server renders them
    for row in rows:
        text = tok.decode(row["input_ids"])
        full = render(tok, messages[: row["messages"]], tools)
        assert (
            full.startswith(text) and full[len(text) :].strip() == "" and row["loss_mask"][-1] == 1
        )


def test_tiny_template(tiny_tokenizer):
    tok = tiny_tokenizer
    conv = arithmetic(random.Random(3))
    rows = tokenize_conversation(tok, conv["messages"], None, 512)
    answer = conv["messages"][-1]
    assert masked_runs(tok, rows) == [
        f"<think>{answer['reasoning_content']}</think>\n{answer['content']}<|im_end|>"
    ]
    first = rows[0]["loss_mask"].index(1)  # the role header and the user turn are context
    assert tok.decode(rows[0]["input_ids"][:first]) == render(
        tok, conv["messages"][:-1], None, add_generation_prompt=True
    )

    conv = tool_call(random.Random(5))
    rows = tokenize_conversation(tok, conv["messages"], conv["tools"], 2048)
    fn = conv["messages"][-3]["tool_calls"][0]["function"]
    assert masked_runs(tok, rows) == [
        f'<tool_call>{{"name": "{fn["name"]}", "arguments": {fn["arguments"]}}}</tool_call><|im_end|>',
        conv["messages"][-1]["content"] + "<|im_end|>",
    ]
    assert_rows_are_renders(tok, rows, conv["messages"], conv["tools"])

    conv = multi_turn(random.Random(5))
    rows = tokenize_conversation(tok, conv["messages"], None, 2048)
    assert len(rows) == 1
    assert masked_runs(tok, rows) == [
        m["content"] + "<|im_end|>" for m in conv["messages"] if m["role"] == "assistant"
    ]


def qwen3_conversation():
    return [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "reasoning_content": "Need the weather tool.",
            "content": "",
            "tool_calls": [call("c1", "Paris")],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"sky": "sunny"}'},
        {
            "role": "assistant",
            "reasoning_content": "The tool says sunny.",
            "content": "It is sunny in Paris.",
        },
        {"role": "user", "content": "And in Rome?"},
        {
            "role": "assistant",
            "reasoning_content": "Call again for Rome.",
            "content": "Let me check.",
            "tool_calls": [call("c2", "Rome")],
        },
        {"role": "tool", "tool_call_id": "c2", "content": '{"sky": "rainy"}'},
        {"role": "assistant", "reasoning_content": "Rainy.", "content": "It is rainy in Rome."},
    ]


def test_qwen3_template_that_drops_old_reasoning(qwen3_tokenizer):
    tok, messages = qwen3_tokenizer, qwen3_conversation()
    rows = tokenize_conversation(tok, messages, [WEATHER], 4096)
    assert masked_runs(tok, rows) == [
        '<think>\nNeed the weather tool.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
        "<think>\nThe tool says sunny.\n</think>\n\nIt is sunny in Paris.<|im_end|>",
        '<think>\nCall again for Rome.\n</think>\n\nLet me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>',
        "<think>\nRainy.\n</think>\n\nIt is rainy in Rome.<|im_end|>",
    ]
    # The full render has lost the first answers' reasoning, so they are trained in a row of their
    # own; each row's context is exactly the prompt the target answered.
    assert [r["turns"] for r in rows] == [2, 2] and [r["messages"] for r in rows] == [5, 9]
    assert "Need the weather tool." not in render(tok, messages, [WEATHER])
    for row, first_turn in zip(rows, [2, 6]):
        start = row["loss_mask"].index(1)
        assert tok.decode(row["input_ids"][:start]) == render(
            tok, messages[:first_turn], [WEATHER], add_generation_prompt=True
        )
    assert_rows_are_renders(tok, rows, messages, [WEATHER])
    masked = "".join(masked_runs(tok, rows))
    assert (
        "<tool_response>" not in masked and "# Tools" not in masked and "<|im_start|>" not in masked
    )


def test_qwen3_answer_without_reasoning_keeps_its_generated_empty_think(qwen3_tokenizer):
    """As the last turn the template renders an empty <think></think> (the model wrote it); later
    it drops it, so that turn gets its own row."""
    tok = qwen3_tokenizer
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [call("c1", "Oslo")]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"sky": "snow"}'},
        {"role": "assistant", "content": "It snows in Oslo."},
    ]
    rows = tokenize_conversation(tok, messages, [WEATHER], 4096)
    assert masked_runs(tok, rows) == [
        '<think>\n\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>',
        "<think>\n\n</think>\n\nIt snows in Oslo.<|im_end|>",
    ]
    assert [r["messages"] for r in rows] == [2, 4]


def test_llama31_tool_calling_template(llama31_tokenizer):
    tok = llama31_tokenizer
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call("c1", "Paris")]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"sky": "sunny"}'},
        {"role": "assistant", "content": "It is sunny in Paris."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "You are welcome."},
    ]
    stops = end_of_turn_tokens(
        tok, [tok.convert_tokens_to_ids(t) for t in ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")]
    )
    rows = tokenize_conversation(tok, messages, [WEATHER], 4096, stops)
    assert len(rows) == 1
    assert masked_runs(tok, rows) == [
        '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',
        "It is sunny in Paris.<|eot_id|>",
        "You are welcome.<|eot_id|>",
    ]
    assert_rows_are_renders(tok, rows, messages, [WEATHER])
    context = tok.decode([t for t, m in zip(rows[0]["input_ids"], rows[0]["loss_mask"]) if not m])
    assert context.startswith(
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
    )
    assert '"{\\"sky\\": \\"sunny\\"}"' in context and "Given the following functions" in context


def test_truncation(tiny_tokenizer):
    conv = multi_turn(random.Random(1))
    rows = tokenize_conversation(tiny_tokenizer, conv["messages"], None, 10)
    assert rows[0]["truncated"] and len(rows[0]["input_ids"]) == len(rows[0]["loss_mask"]) == 10
    rows = tokenize_conversation(tiny_tokenizer, conv["messages"], None, 4096)
    assert not rows[0]["truncated"]


def test_turn_cut_by_max_tokens_does_not_learn_end_of_turn(tiny_tokenizer):
    messages = [
        {"role": "user", "content": "Count."},
        {"role": "assistant", "content": "One, two, thr", "finish_reason": "length"},
    ]
    rows = tokenize_conversation(tiny_tokenizer, messages, None, 512)
    assert masked_runs(tiny_tokenizer, rows) == ["One, two, thr"]


def split_a_token(tok, ids: list[int]) -> tuple[int, list[int]]:
    """(k, ids with ids[k] written as two tokens of the same text): what a model may generate and
    re-tokenizing never gives back."""
    vocab = tok.get_vocab()
    for k, t in enumerate(ids):
        piece = tok.convert_ids_to_tokens(t)
        if len(piece) > 1 and piece[:1] in vocab and piece[1:] in vocab:
            return k, ids[:k] + [vocab[piece[:1]], vocab[piece[1:]]] + ids[k + 1 :]
    raise AssertionError("no token to split")


def with_server(tok, messages, tools, max_length, server_turns, use_server_ids=False):
    """tokenize_conversation's rows, each turn checked against what the server said of it."""
    plan = plan_conversation(tok, messages, tools)
    tokenized = tokenize_rows(tok, plan.row_spans())
    return conversation_rows(tok, plan, tokenized, max_length, server_turns, use_server_ids)


def test_server_ids_are_compared_with_each_turn_and_spliced_verbatim(tiny_tokenizer):
    tok = tiny_tokenizer
    conv = tool_call(random.Random(5))  # two turns: a tool call (markup tokens), then an answer
    messages, tools = conv["messages"], conv["tools"]
    (row,) = tokenize_conversation(tok, messages, tools, 2048)
    runs = trained_runs(row["input_ids"], row["loss_mask"])
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    assert len(runs) == 2 and [r[-1] for r in runs] == [eot, eot]

    # the server generated exactly the re-tokenized spans: equal, and splicing changes nothing
    exact = [ServerTurn(r, len(r)) for r in runs]
    for use in (False, True):
        (same,) = with_server(tok, messages, tools, 2048, exact, use)
        assert (same["input_ids"], same["loss_mask"]) == (row["input_ids"], row["loss_mask"])
        assert [(c["equal"], c["spliced"]) for c in same["checks"]] == [(True, use), (True, use)]

    # drift: the first turn holds two tokens where re-tokenizing its text gives one; the second
    # comes back without its end-of-turn token (the template's is put after it)
    k, drifted = split_a_token(tok, runs[0])
    server = [ServerTurn(drifted, len(drifted)), ServerTurn(runs[1][:-1], len(runs[1]) - 1)]
    (kept,) = with_server(tok, messages, tools, 2048, server)
    assert (kept["input_ids"], kept["loss_mask"]) == (row["input_ids"], row["loss_mask"])
    first, second = kept["checks"]
    assert (first["equal"], first["first_difference"], first["end_of_turn_added"]) == (
        False,
        k,
        False,
    )
    assert (second["equal"], second["end_of_turn_added"]) == (True, True)
    assert (first["usage_completion_tokens"], first["retokenized_tokens"]) == (
        len(drifted),
        len(runs[0]),
    )

    (spliced,) = with_server(tok, messages, tools, 2048, server, use_server_ids=True)
    start = row["loss_mask"].index(1)
    gap = row["input_ids"][start + len(runs[0]) : len(row["input_ids"]) - len(runs[1])]
    assert spliced["input_ids"] == row["input_ids"][:start] + drifted + gap + runs[1]
    assert spliced["loss_mask"] == [0] * start + [1] * len(drifted) + [0] * len(gap) + [1] * len(
        runs[1]
    )
    assert tok.decode(spliced["input_ids"]) == tok.decode(row["input_ids"])  # same text, other ids
    assert [c["spliced"] for c in spliced["checks"]] == [True, True]


def test_server_ids_of_a_cut_turn_or_a_prefilled_prompt(tiny_tokenizer):
    tok = tiny_tokenizer
    cut = [
        {"role": "user", "content": "Count."},
        {"role": "assistant", "content": "One, two, thr", "finish_reason": "length"},
    ]
    (row,) = tokenize_conversation(tok, cut, None, 512)
    ids = trained_runs(row["input_ids"], row["loss_mask"])[0]
    (checked,) = with_server(tok, cut, None, 512, [ServerTurn(ids, None)])
    # no end-of-turn token added to a turn max_tokens cut; no usage: nothing to compare it with
    assert checked["checks"][0] == {
        "message": 1,
        "server_ids": True,
        "retokenized_tokens": len(ids),
        "usage_completion_tokens": None,
        "prefilled": False,
        "server_tokens": len(ids),
        "equal": True,
        "end_of_turn_added": False,
        "spliced": False,
    }
    (usage_only,) = with_server(tok, cut, None, 512, [ServerTurn(None, 9)])
    assert usage_only["checks"][0]["server_ids"] is False
    assert usage_only["checks"][0]["usage_completion_tokens"] == 9

    prefill = copy.deepcopy(tok)  # the generation prompt pre-fills an empty reasoning block
    prefill.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n<think></think>{% endif %}"
    )
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    (plain,) = tokenize_conversation(prefill, messages, None, 512)
    other = [ServerTurn([7, 8, prefill.eos_token_id], 3)]
    (row,) = with_server(prefill, messages, None, 512, other, use_server_ids=True)
    assert row["checks"][0]["prefilled"] and not row["checks"][0]["spliced"]
    assert row["input_ids"] == plain["input_ids"]  # the span is not all the model's: kept


def test_template_whose_prompt_rewrites_history_is_reported(tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    # the system line depends on add_generation_prompt: no boundary can be read off the renders
    tok.chat_template = (
        "<|im_start|>system\n{{ 'answer now' if add_generation_prompt else 'history' }}<|im_end|>\n"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    with pytest.raises(TemplateMismatch, match="message 1"):
        tokenize_conversation(tok, msgs, None, 512)


def test_template_kwargs_reach_the_template(qwen3_tokenizer):
    """With enable_thinking=false the server pre-fills an empty <think></think>: the model wrote
    only what follows it."""
    tok = qwen3_tokenizer
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    rows = tokenize_conversation(
        tok, messages, None, 512, template_kwargs={"enable_thinking": False}
    )
    assert masked_runs(tok, rows) == ["Hello.<|im_end|>"]
    rows = tokenize_conversation(tok, messages, None, 512)
    assert masked_runs(tok, rows) == ["<think>\n\n</think>\n\nHello.<|im_end|>"]


def test_tokenizer_with_a_prefix_per_call_falls_back_to_the_whole_row():
    """A SentencePiece-style tokenizer puts "▁" before every call's text: tokenized by segments,
    the row would grow spurious spaces, so it is tokenized at once and masked by offsets."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.train_from_iterator(
        ["user says hello there", "assistant answers hello back"] * 20,
        trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<s>", "</s>"]),
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>")
    fast.chat_template = "{% for m in messages %}<s>{{ m.role }}: {{ m.content }}{% if m.role == 'assistant' %}</s>{% endif %}{% endfor %}{% if add_generation_prompt %}<s>assistant: {% endif %}"
    messages = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hello back"},
    ]
    rows = tokenize_conversation(fast, messages, None, 64)
    assert rows[0]["whole"]
    assert (
        rows[0]["input_ids"]
        == fast("<s>user: hello<s>assistant: hello back</s>", add_special_tokens=False)["input_ids"]
    )
    assert (
        fast.decode([t for t, m in zip(rows[0]["input_ids"], rows[0]["loss_mask"]) if m]).strip()
        == "hello back</s>"
    )
    # the byte-level tokenizers of the other tests never need it


def tricky_rows(tok, rng: random.Random, n: int) -> list[tuple[str, list[tuple[int, int]]]]:
    """Row texts in the tiny template's shape whose turn boundaries fall next to what byte-level
    splitting is sensitive to: whitespace runs, newlines, digits, apostrophes, non-ASCII letters,
    markup and special tokens written inside a turn, turns cut short of their end-of-turn."""
    bits = [
        " ", "  ", "\n", "\n\n", " \n", "\t", "x", "'s", "'ll", "12", "3.5", "é", "日本",
        "<think>", "</think>", "<|im_end|>", "<|im_start|>", "{", '"a": 1', "!", "?", "-",
        "hello", "world", " the", "you're",
    ]  # fmt: skip
    rows = []
    for _ in range(n):
        text, spans = "", []
        for _ in range(rng.randint(1, 4)):
            text += "<|im_start|>user\n" + "".join(rng.choices(bits, k=rng.randint(1, 6)))
            text += "<|im_end|>\n<|im_start|>assistant" + rng.choice(["\n", "", " ", "\n\n"])
            start = len(text)
            text += "".join(rng.choices(bits, k=rng.randint(1, 8)))
            if rng.random() < 0.8:
                text += "<|im_end|>"
            spans.append((start, len(text)))
            text += rng.choice(["\n", "", "\n\n "])
        rows.append((text, spans))
    return rows


def test_rows_tokenized_at_once_equal_each_row_alone(tiny_tokenizer):
    """tokenize_rows (one batched call for every segment of every row) gives tokenize_row's ids,
    mask and `whole` for each row, and its trained runs; wherever segments_join_exactly says the
    segments join exactly, the row tokenized at once has exactly their ids."""
    from draftline.tokens.chat import (
        join_rule,
        plan_conversation,
        segments,
        segments_join_exactly,
        tokenize_row,
        tokenize_rows,
    )

    tok = tiny_tokenizer
    rule = join_rule(tok)
    assert rule is not None  # byte-level BPE with the GPT-2 split: the rule applies
    rows = tricky_rows(tok, random.Random(11), 400)
    batched = tokenize_rows(tok, rows)
    joined = 0
    for (text, spans), (ids, mask, whole, runs) in zip(rows, batched):
        assert (ids, mask, whole) == tokenize_row(tok, text, spans)
        assert runs == trained_runs(ids, mask)
        row_text = text[: max(e for _, e in spans)]
        pieces = segments(text, spans)
        bounds = [sum(len(p) for p, _ in pieces[:k]) for k in range(1, len(pieces))]
        if segments_join_exactly(rule, row_text, bounds):
            joined += 1
            at_once = tok(row_text, add_special_tokens=False)["input_ids"]
            assert at_once == ids and not whole
    assert joined > 50 and any(whole for *_, whole, _ in batched)  # some differ: found
    # rows as the template renders them: every one joins, no second tokenization
    from draftline.targets.corpus import generate_conversations

    for c in generate_conversations(100, 3):
        plan = plan_conversation(tok, c["messages"], c["tools"])
        for text, spans in plan.row_spans():
            pieces = segments(text, spans)
            bounds = [sum(len(p) for p, _ in pieces[:k]) for k in range(1, len(pieces))]
            assert segments_join_exactly(rule, text[: max(e for _, e in spans)], bounds)
