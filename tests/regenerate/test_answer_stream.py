"""Streamed answers put together (draftline/regenerate/stream.py): reasoning read once whichever field
carries it, and the whole-message path reading the same way."""

import pytest

from draftline.regenerate.replay import reply_message
from draftline.regenerate.stream import StreamedAnswer


def chunk(delta: dict | None = None, finish: str | None = None, usage: dict | None = None) -> dict:
    out = {"choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}
    if usage is not None:
        out["usage"] = usage
    return out


def assembled(chunks: list[dict]) -> dict:
    streamed = StreamedAnswer()
    for c in chunks:
        streamed.add(c)
    return streamed.answer()["choices"][0]["message"]


@pytest.mark.parametrize("first", ["reasoning_content", "reasoning"])
def test_reasoning_in_both_fields_of_a_delta_is_read_once(first):
    """vLLM PR #34030 proposed filling `reasoning` and `reasoning_content` alike; the text was doubled."""
    pieces = ["Let me ", "add 2 and 3", "."]
    both = [chunk({"role": "assistant", "content": ""})]
    both += [chunk({"reasoning_content": p, "reasoning": p}) for p in pieces]
    both += [chunk({"content": "5"}), chunk(finish="stop")]
    one = [chunk({first: p}) for p in pieces] + [chunk({"content": "5"}), chunk(finish="stop")]
    for message in (assembled(both), assembled(one)):
        assert reply_message({"message": message}) == {
            "role": "assistant",
            "content": "5",
            "reasoning_content": "Let me add 2 and 3.",
        }


def test_differing_reasoning_fields_keep_the_one_the_stream_used_first():
    """Where both are filled and differ, the stream's own field wins; a delta that fills only the
    other one (or leaves its own empty) still counts."""
    chunks = [
        chunk({"reasoning": "Think "}),
        chunk({"reasoning": "hard", "reasoning_content": "HARD"}),
        chunk({"reasoning": "", "reasoning_content": " then"}),
        chunk({"reasoning_content": " answer."}),
        chunk({"content": "ok"}, finish="stop"),
    ]
    message = assembled(chunks)
    assert message["reasoning"] == "Think hard then answer."
    assert "reasoning_content" not in message
    chunks = [
        chunk({"reasoning_content": "A", "reasoning": "B"}),
        chunk({"reasoning": "C"}),
        chunk(finish="stop"),
    ]
    assert assembled(chunks)["reasoning_content"] == "AC"


def test_whole_message_with_both_reasoning_fields_keeps_one():
    """A server that answers whole (no stream) with both fields: one of them, reasoning_content first."""
    same = {"role": "assistant", "content": "5", "reasoning_content": "2+3", "reasoning": "2+3"}
    assert reply_message({"message": same})["reasoning_content"] == "2+3"
    differ = {**same, "reasoning": "other"}
    assert reply_message({"message": differ})["reasoning_content"] == "2+3"
    only = {"role": "assistant", "content": "5", "reasoning": "2+3"}
    assert reply_message({"message": only})["reasoning_content"] == "2+3"


def test_usage_on_every_chunk_counts_tokens_whose_text_is_held_back():
    """With `continuous_usage_stats` (backend hf asks for it) a chunk without text whose usage
    counts more completion tokens is output: its tokens reset the client's token timeout."""
    streamed = StreamedAnswer()

    def usage(n):
        return {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}

    assert not streamed.add(chunk({"role": "assistant", "content": ""}, usage=usage(0)))
    assert streamed.add(chunk({"content": "Hi"}, usage=usage(1)))
    assert streamed.add(chunk({}, usage=usage(2)))  # a token held back (a tool call, say)
    assert not streamed.add(chunk({}, usage=usage(2)))
    assert streamed.add(chunk({}, finish="stop", usage=usage(3)))
    assert not streamed.add({"choices": [], "usage": usage(3)})  # the usage chunk after the end
    assert streamed.answer()["usage"]["completion_tokens"] == 3
