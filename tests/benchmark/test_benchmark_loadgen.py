"""The load generator against a real `transformers serve` (the baseline engine that runs on CPU)."""

import asyncio
import socket

from draftline.benchmark.loadgen import Load, LoadTarget, RequestResult, run_load, summarize_load
from draftline.engines.commands import ServeSettings, transformers_serve_command
from draftline.engines.servers import ManagedServer, server_env
from draftline.evaluate.acceptance import eos_ids
from draftline.evaluate.specdec import greedy_generate
from draftline.targets.model import load_target
from draftline.tokens.chat import first_turn_prompt


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_load_generator_streams_from_transformers_serve(tmp_path, random_target):
    from draftline.targets.corpus import generate_conversations

    model, tokenizer = load_target(random_target)
    rows = [{"messages": c["messages"], "tools": c["tools"]} for c in generate_conversations(3, 21)]
    prompts = [
        tokenizer.apply_chat_template(
            first_turn_prompt(r),
            tools=r["tools"] or None,
            add_generation_prompt=True,
            tokenize=False,
        )
        for r in rows
    ]
    port, max_tokens = free_port(), 8
    url = f"http://127.0.0.1:{port}"
    command = transformers_serve_command(
        ServeSettings(model=random_target.model, host="127.0.0.1", port=port), device="cpu"
    )
    with ManagedServer(
        command, server_env(tmp_path / "hf_cache"), url, tmp_path / "server.log", 180
    ):
        endpoint = LoadTarget(
            url, "openai-completions", model=random_target.model
        )  # it rejects stream_options
        done: list[RequestResult] = []
        results, wall = asyncio.run(
            run_load(endpoint, prompts, Load(5, 2, max_tokens, 120), on_done=done.append)
        )

    assert len(done) == 5 and [r.prompt_index for r in results] == [0, 1, 2, 0, 1]
    assert all(r.ok for r in results), [r.error for r in results]
    stop = eos_ids(tokenizer, model)
    for r in results:  # the streamed text is the target's greedy answer, token counts from usage
        expected = greedy_generate(
            model, tokenizer(prompts[r.prompt_index])["input_ids"], max_tokens, stop
        ).tokens
        assert r.output_tokens == len(expected)
        assert r.text == tokenizer.decode(expected, skip_special_tokens=True)
        assert r.ttft_s is not None and 0 < r.ttft_s <= r.latency_s
        assert r.finish_reason in ("length", "stop")
    summary = summarize_load(results, wall)
    assert summary["requests"] == 5 and summary["failed"] == 0
    assert summary["output_tokens"] == sum(r.output_tokens for r in results)
    assert (
        summary["output_tokens_per_s"] > 0
        and summary["ttft_ms_p50"] > 0
        and summary["e2e_ms_p99"] >= summary["e2e_ms_p50"]
    )


def test_failed_requests_are_counted_not_raised(tmp_path):
    """A server that is not there: every request fails with its reason, the level still summarizes."""
    endpoint = LoadTarget(f"http://127.0.0.1:{free_port()}", "openai-completions", model="m")
    results, wall = asyncio.run(run_load(endpoint, ["a"], Load(3, 2, 4, 5)))
    assert all(not r.ok and "ConnectError" in r.error for r in results)
    summary = summarize_load(results, wall)
    assert (
        summary["failed"] == 3 and summary["output_tokens"] == 0 and summary["ttft_ms_p50"] is None
    )


def test_a_timed_pass_keeps_starting_requests_until_its_time_is_up():
    """Load.min_seconds: past the request count, the workers start requests (cycling the prompts)
    until the time is up, then wait for those in flight; results come back in start order."""
    endpoint = LoadTarget(f"http://127.0.0.1:{free_port()}", "openai-completions", model="m")
    results, wall = asyncio.run(run_load(endpoint, ["a", "b", "c"], Load(2, 2, 4, 5, 0.3)))
    assert wall >= 0.3 and len(results) > 2
    assert [r.prompt_index for r in results] == [i % 3 for i in range(len(results))]
    # without min_seconds, exactly the requests asked for
    results, _ = asyncio.run(run_load(endpoint, ["a", "b", "c"], Load(2, 2, 4, 5)))
    assert len(results) == 2
