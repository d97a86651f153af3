"""Reading a chat completion a server streams: the chunks (OpenAI's delta format) put together
into one answer, the errors a stream can carry, and the checks on the answer's fields.

A chunk that is not JSON, or not shaped as a chat completion chunk, is a `BadAnswer`; an error the
server sends inside the stream is a `StreamError`; `AnswerTimeout` is a stream that stops short of
its first or next token in time.

Token ids: asked with `return_token_ids`, vLLM puts the ids each streamed chunk generated in its
choice's `token_ids` (and all of them in the whole answer's choice); SGLang and the built-in hf
server put them in the whole answer's choice. The ids of the chunks are concatenated, in order,
into the answer's `token_ids`: everything the model generated, its reasoning and tool-call markup
and the end-of-turn token included.
"""

from __future__ import annotations

import json

import orjson


class BadAnswer(ValueError):
    """An answer that is not a chat completion."""


class StreamError(Exception):
    """An error the server reported inside its stream, after answering 200."""


class AnswerTimeout(Exception):
    """No first token within first_token_timeout_s, or a gap between tokens past token_timeout_s."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason  # first_token_timeout | token_timeout


REASONING_KEYS = ("reasoning_content", "reasoning")


class StreamedAnswer:
    """A chat completion put together from its streamed chunks (OpenAI's delta format): content and
    reasoning concatenated, tool calls merged by index, token ids concatenated (vLLM's per-chunk
    `token_ids`), the last finish_reason, the usage chunk.

    Reasoning comes as `reasoning_content` (SGLang, transformers serve, older vLLM) or `reasoning`
    (vLLM); a server may fill both with the same text (vLLM PR #34030 proposed it). Each delta's
    reasoning is read once: from the field this stream carried reasoning in first (before any,
    `reasoning_content`), else from the other one when that field is absent or empty in the delta.
    Where both are filled and differ, the stream's own field wins: its pieces are the ones that
    join up, and adding the other would repeat the text."""

    def __init__(self):
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.reasoning_key = None  # the field this stream carries reasoning in, once seen
        self.tool_calls: dict[int, dict] = {}
        self.token_ids: list[int] | None = None  # None: no chunk carried any
        self.finish_reason = None
        self.usage = None
        self.choices_seen = False
        self.chunks = 0  # chunks that carried output

    def add(self, chunk) -> bool:
        """Takes one chunk; True when it carries generated output (text, a tool call, the end, or a
        usage that counts more completion tokens)."""
        generated = self._add(chunk)
        self.chunks += generated
        return generated

    def _add(self, chunk) -> bool:
        if not isinstance(chunk, dict):
            raise BadAnswer(f"stream chunk is not a JSON object: {chunk!r:.200}")
        if chunk.get("error") is not None:
            raise StreamError(
                f"the server reported an error mid-stream: {json.dumps(chunk['error'])[:300]}"
            )
        generated = False
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            # usage on every chunk (`continuous_usage_stats`): more completion tokens than the last
            # chunk said are output, also while their text is held back (a tool call, say)
            before = (self.usage or {}).get("completion_tokens")
            now = usage.get("completion_tokens")
            generated = (
                self.finish_reason is None
                and isinstance(now, int)
                and now > (before if isinstance(before, int) else 0)
            )
            self.usage = usage
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise BadAnswer("stream chunk choices is not a list")
        for choice in choices[:1]:
            self.choices_seen = True
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                raise BadAnswer("stream choice without a delta")
            ids = choice.get("token_ids")
            if ids is not None:
                if self.token_ids is None:
                    self.token_ids = []
                self.token_ids.extend(checked_token_ids(ids))
                generated = generated or bool(ids)  # a chunk of markup tokens only is progress too
            for key in ("content", *REASONING_KEYS):
                if delta.get(key) is not None and not isinstance(delta[key], str):
                    raise BadAnswer(f"delta {key} is not a string")
            if delta.get("content"):
                self.content.append(delta["content"])
                generated = True
            first = self.reasoning_key or REASONING_KEYS[0]
            key = next((k for k in (first, *REASONING_KEYS) if delta.get(k)), None)
            if key is not None:
                self.reasoning.append(delta[key])
                self.reasoning_key = self.reasoning_key or key
                generated = True
            for call in delta.get("tool_calls") or []:
                if not isinstance(call, dict) or not isinstance(call.get("function", {}), dict):
                    raise BadAnswer("malformed tool_calls delta")
                merged = self.tool_calls.setdefault(
                    call.get("index", len(self.tool_calls)),
                    {"id": None, "type": "function", "function": {"name": None, "arguments": ""}},
                )
                merged["id"] = call.get("id") or merged["id"]
                function = call.get("function") or {}
                if function.get("name"):
                    merged["function"]["name"] = function["name"]
                if function.get("arguments"):
                    merged["function"]["arguments"] += function["arguments"]
                generated = True
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
                generated = True
        return generated

    def answer(self) -> dict:
        """The chat completion it amounts to, in the non-streamed shape `answer_choice` reads."""
        if not self.choices_seen:
            return {"choices": [], "usage": self.usage}
        if self.finish_reason is None:
            raise BadAnswer("the stream ended without a finish_reason (cut short)")
        message = {"role": "assistant", "content": "".join(self.content)}
        if self.reasoning:
            message[self.reasoning_key] = "".join(self.reasoning)
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        choice = {"index": 0, "message": message, "finish_reason": self.finish_reason}
        if self.token_ids is not None:
            choice["token_ids"] = self.token_ids
        return {"choices": [choice], "usage": self.usage}


def loads(payload: bytes):
    """JSON from a server: orjson (a fifth of json's time on a chunk; a client reads one per
    token), json where orjson refuses (NaN, say) so that both accept the same; ValueError when
    neither does."""
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return json.loads(payload)


def add_chunk(streamed: StreamedAnswer, payload: bytes) -> int:
    """1 when the chunk (the JSON of one `data:` line) carries output, else 0."""
    try:
        chunk = loads(payload)
    except ValueError as err:
        raise BadAnswer(f"stream chunk not JSON: {err}") from None
    return int(streamed.add(chunk))


def usage_of(answer: dict) -> dict:
    """Token counts of an answer; a server that sends none counts 0."""
    usage = answer.get("usage")
    if not isinstance(usage, dict):
        return {}
    return {
        k: v
        for k, v in usage.items()
        if k in ("prompt_tokens", "completion_tokens") and isinstance(v, int)
    }


def checked_token_ids(ids) -> list[int]:
    if not isinstance(ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids
    ):
        raise BadAnswer(f"token_ids is not a list of token ids: {ids!r:.200}")
    return ids


def answer_choice(answer) -> dict:
    """The first choice of a chat completion, with the fields read from it checked."""
    if not isinstance(answer, dict):
        raise BadAnswer(f"expected a JSON object, got {type(answer).__name__}")
    choices = answer.get("choices")
    if not isinstance(choices, list):
        raise BadAnswer("no choices list in the answer")
    if not choices:
        return {}
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise BadAnswer("choice without a message")
    for key in ("content", "reasoning_content", "reasoning"):
        if message.get(key) is not None and not isinstance(message[key], str):
            raise BadAnswer(f"message {key} is not a string")
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list) or not all(
        isinstance(tc, dict)
        and isinstance(tc.get("function"), dict)
        and isinstance(tc["function"].get("name"), str)
        for tc in calls
    ):
        raise BadAnswer("malformed tool_calls")
    if choice.get("token_ids") is not None:
        checked_token_ids(choice["token_ids"])
    return choice
