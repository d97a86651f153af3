"""Multi-turn replay on structured replies (tool calls, reasoning) in vLLM's and SGLang's wire format."""

import asyncio
import json
import threading
import time
from collections import Counter

import pytest
import regenerate_support
from regenerate_support import (
    FAST_RETRY,
    prompts,
    run_rows,
)

from draftline.regenerate.client import close_pool, open_pool
from draftline.regenerate.replay import (
    ProgressHooks,
    ReplayJob,
    Sampling,
    called_tools,
    regenerate_all,
    relink_tool_results,
)
from draftline.regenerate.run import engine_request_fields
from draftline.tokens.chat import chat_prompt_ids

# shared fixtures (regenerate_support.py)
stub = regenerate_support.stub


WEATHER_CHAT = {
    "id": "w1",
    "partition": "short",
    "tools": [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "add_numbers", "parameters": {"type": "object"}}},
    ],
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the weather in Cairo?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_orig",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Cairo"}'},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_orig",
            "content": '{"sky": "hot", "temperature": 33}',
        },
        {"role": "assistant", "content": "It is hot in Cairo."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "You are welcome."},
    ],
}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_multi_turn_keeps_reasoning_and_splices_matching_tool_results(tmp_path, stub, engine):
    def answer(body):
        last = body["messages"][-1]
        if last["role"] == "user" and "weather" in last["content"]:
            return {
                "reasoning": "I need the weather tool.",
                "tool_calls": [("get_weather", {"city": "Cairo"})],
            }
        if last["role"] == "tool":
            return {"reasoning": "The tool says hot.", "content": "Hot, 33 degrees."}
        return {"content": "Bye."}

    url, handler = stub(engine=engine, answer=answer)
    sampling = Sampling(16, 0.0, 0.9, 7, ((0.0, 1.0), (1.0, 1.0)), {"enable_thinking": True})
    tally, (row,), _, _ = run_rows([url], [WEATHER_CHAT], tmp_path, sampling=sampling)
    msgs = row["messages"]
    assert [m["role"] for m in msgs] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
    ]
    call = msgs[2]["tool_calls"][0]
    assert (
        msgs[2]["reasoning_content"] == "I need the weather tool."
        and call["function"]["name"] == "get_weather"
    )
    assert (
        msgs[3]["tool_call_id"] == call["id"] != "call_orig"
    )  # the original result answers the new call
    assert msgs[3]["content"] == WEATHER_CHAT["messages"][3]["content"]
    assert msgs[4] == {
        "role": "assistant",
        "content": "Hot, 33 degrees.",
        "reasoning_content": "The tool says hot.",
    }
    assert msgs[6]["content"] == "Bye."
    assert row["regeneration"]["finish_reasons"] == ["tool_calls", "stop", "stop"]
    # each turn was asked on the model's own previous answers, with the sampling of the conversation
    temperature, seed = sampling.for_conversation("w1")
    second = handler.requests[1]
    assert second["messages"][2]["tool_calls"][0]["id"] == call["id"]
    for body in handler.requests:
        assert body["temperature"] == temperature and body["seed"] == seed and body["top_p"] == 0.9
        assert (
            body["chat_template_kwargs"] == {"enable_thinking": True} and body["max_tokens"] == 16
        )
        assert body["tools"] == WEATHER_CHAT["tools"]


# A /v1/chat/completions stream in the shape vLLM's chat_completion/serving.py writes it when
# asked for return_token_ids and include_usage (reasoning parser on): the prompt's ids on the role
# chunk, each chunk's own ids in its choice, chunks whose tokens the parser held back (empty delta,
# ids only), the end token on the finish chunk, then the usage chunk.
VLLM_TOKEN_ID_STREAM = [
    '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[1,5,9]}',
    '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":null,"token_ids":[515]}]}',
    '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"reasoning":"2+2"},"logprobs":null,"finish_reason":null,"token_ids":[40,7,40]}]}',
    '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":null,"token_ids":[516]}]}',
    '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"4"},"logprobs":null,"finish_reason":null,"token_ids":[42]}]}',
    '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":[2]}]}',
    '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3,"total_tokens":10,"completion_tokens":7}}',
]


def test_streamed_token_ids_are_put_together_in_order():
    from draftline.regenerate.stream import BadAnswer, StreamedAnswer, add_chunk, answer_choice

    streamed = StreamedAnswer()
    carried = [add_chunk(streamed, line.encode()) for line in VLLM_TOKEN_ID_STREAM]
    assert carried == [0, 1, 1, 1, 1, 1, 0]  # a chunk of ids only is progress (token timeout)
    choice = answer_choice(streamed.answer())
    assert choice["token_ids"] == [515, 40, 7, 40, 516, 42, 2]
    assert choice["message"] == {"role": "assistant", "content": "4", "reasoning": "2+2"}
    assert len(choice["token_ids"]) == streamed.answer()["usage"]["completion_tokens"]

    without = StreamedAnswer()  # a server that returns no ids: none are made up
    for line in VLLM_TOKEN_ID_STREAM:
        chunk = json.loads(line)
        for c in chunk["choices"]:
            c.pop("token_ids", None)
        without.add(chunk)
    assert "token_ids" not in without.answer()["choices"][0]
    with pytest.raises(BadAnswer, match="token_ids"):
        StreamedAnswer().add(
            {"choices": [{"index": 0, "delta": {"content": "a"}, "token_ids": ["a"]}]}
        )
    with pytest.raises(BadAnswer, match="token_ids"):
        answer_choice({"choices": [{"message": {"content": "a"}, "token_ids": [1.5]}]})


def test_token_ids_are_asked_only_of_engines_that_know_the_field():
    assert engine_request_fields("transformers") == {}  # it answers 422 to unknown fields
    for engine in ("vllm", "sglang"):
        assert engine_request_fields(engine, "hermes") == {
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }
    # vLLM without a tool-call parser refuses tool_choice "auto" (400): requests with tools ask "none"
    assert engine_request_fields("vllm")["with_tools"] == {"tool_choice": "none"}
    assert "with_tools" not in engine_request_fields("sglang")
    # the hf server also puts the usage on every chunk: tokens held back as text still count
    assert engine_request_fields("hf") == {
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "return_token_ids": True,
    }


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_servers_token_ids_are_recorded_per_turn(tmp_path, stub, engine):
    generated = {"tool": [11, 12, 13, 14, 2], "result": [21, 22, 2], "thanks": [31, 2]}

    def answer(body):
        last = body["messages"][-1]
        if last["role"] == "tool":
            return {"content": "Hot.", "token_ids": generated["result"]}
        if "Thanks" in last["content"]:
            return {"content": "Bye.", "token_ids": generated["thanks"]}
        return {"tool_calls": [("get_weather", {"city": "Cairo"})], "token_ids": generated["tool"]}

    url, handler = stub(engine=engine, answer=answer)
    _, (row,), _, _ = run_rows(
        [url], [WEATHER_CHAT], tmp_path, extra_body=engine_request_fields(engine)
    )
    regen = row["regeneration"]
    assert all(body["return_token_ids"] is True for body in handler.requests)
    if engine == "vllm":  # streamed: the ids of every chunk, in order
        assert regen["completion_token_ids"] == [
            generated["tool"],
            generated["result"],
            generated["thanks"],
        ]
    else:  # SGLang returns them only in a whole answer, never in a stream
        assert regen["completion_token_ids"] == [None, None, None]
    assert regen["turn_completion_tokens"] == [3, 3, 3]  # usage.completion_tokens of each turn
    # the ids stay in the record: the messages sent back to the server carry none
    assert all("token_ids" not in json.dumps(body["messages"]) for body in handler.requests)
    assert not any("token_ids" in m for m in row["messages"])


def test_another_tool_call_ends_the_conversation_at_the_call(tmp_path, stub):
    url, _ = stub(answer=lambda body: {"tool_calls": [("add_numbers", {"a": 1, "b": 2})]})
    tally, (row,), _, _ = run_rows([url], [WEATHER_CHAT], tmp_path)
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant"]
    assert row["messages"][-1]["tool_calls"][0]["function"]["name"] == "add_numbers"
    assert row["regeneration"]["stopped"] == "tool_mismatch" and tally.stopped["tool_mismatch"] == 1


def test_max_context_cuts_max_tokens_and_ends_conversations(tmp_path, stub, random_target):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_target.model)

    def answer(body):
        if body["messages"][-1]["role"] == "user":
            return {"tool_calls": [("get_weather", {"city": "Cairo"})]}
        return {"content": "Fine."}

    url, handler = stub(tokenizer=tokenizer, answer=answer)

    def count_ids(messages, tools):
        return chat_prompt_ids(tokenizer, messages, tools, {})

    first = len(count_ids(WEATHER_CHAT["messages"][:2], WEATHER_CHAT["tools"]))
    # room for 5 answer tokens after the first prompt; the second prompt (with the call and its
    # result) no longer fits
    tally, out, failures, _ = run_rows(
        [url],
        [WEATHER_CHAT],
        tmp_path,
        partitions={"short": (1, first + 5), "long": (1, None)},
        count_ids=count_ids,
    )
    assert handler.requests[0]["max_tokens"] == 5 and len(handler.requests) == 1
    assert [m["role"] for m in out[0]["messages"]] == ["system", "user", "assistant"]
    assert out[0]["regeneration"]["stopped"] == "context_full"
    (tmp_path / "b").mkdir()
    tally, out, failures, _ = run_rows(
        [url],
        [WEATHER_CHAT],
        tmp_path / "b",
        partitions={"short": (1, first), "long": (1, None)},
        count_ids=count_ids,
    )
    assert failures[0]["reason"] == "prompt_too_long" and not out and len(handler.requests) == 1


def test_prompt_tokens_are_counted_beside_the_event_loop(tmp_path, stub):
    """With max_context every turn's prompt is rendered and tokenized; that runs in a thread
    while the loop goes on (here: its progress ticks), not on the loop."""
    url, _ = stub()
    counted, ticks, windows = [], [], []

    def count_ids(messages, tools):
        counted.append(threading.current_thread() is threading.main_thread())
        began = time.monotonic()
        time.sleep(0.3)  # a long prompt's template and tokenizer
        windows.append((began, time.monotonic()))
        return [0] * 10

    async def go():
        pool = open_pool([url], None)
        try:
            job = ReplayJob(
                "m",
                Sampling(8, 0.0, 1.0, 0),
                FAST_RETRY,
                {"short": (2, 1000), "long": (1, None)},
                {"fingerprint": "f"},
                count_ids,
            )
            return await regenerate_all(
                pool,
                job,
                prompts(2),
                tmp_path / "c.jsonl",
                tmp_path / "f.jsonl",
                ProgressHooks(on_tick=lambda t: ticks.append(time.monotonic()), tick_s=0.02),
            )
        finally:
            await close_pool(pool)

    tally = asyncio.run(go())
    assert tally.ok == 2 and counted and not any(counted)  # never on the loop's thread
    # the loop ticked while a count ran (15 ticks in 0.3 s when idle; a blocked loop ticks none)
    assert max(len([t for t in ticks if a < t < b]) for a, b in windows) >= 3


def test_called_tools_and_relinking():
    assert called_tools({"content": '<tool_call>{"name": "a", "arguments": {}}</tool_call>'}) == [
        "a"
    ]
    assert called_tools(
        {"content": "", "tool_calls": [{"function": {"name": "b", "arguments": "{}"}}]}
    ) == ["b"]
    assert called_tools({"content": "<tool_call>not json</tool_call>"}) == ["<unparsable>"]
    assert called_tools({"content": "plain"}) == []
    results = [{"role": "tool", "tool_call_id": "old", "content": "1"}]
    assert relink_tool_results(results, {"tool_calls": [{"id": "new"}]})[0]["tool_call_id"] == "new"
    assert (
        relink_tool_results(results, {"content": '<tool_call>{"name": "a"}</tool_call>'}) == results
    )


def test_temperature_draw_is_seeded_per_conversation():
    sampling = Sampling(8, 0.0, 1.0, 3, ((0.0, 3.0), (0.7, 1.0)))
    draws = [sampling.for_conversation(f"p{i}") for i in range(2000)]
    assert draws == [
        sampling.for_conversation(f"p{i}") for i in range(2000)
    ]  # a rerun draws the same
    share = Counter(t for t, _ in draws)[0.0] / len(draws)
    assert 0.70 < share < 0.80  # weights 3:1
    assert len({s for _, s in draws}) > 1990  # distinct request seeds
    assert Sampling(8, 0.5, 1.0, None).for_conversation("p1") == (0.5, None)
