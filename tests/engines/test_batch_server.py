"""regenerate.backend: hf — greedy batched decoding behind the OpenAI-compatible API
(draftline/engines/batch_server.py): the step-by-step decode picks what `generate` picks, batched answers
(rows joining and leaving included) equal batch-1 greedy decodes except at counted near-ties,
answers stream and put together to the whole answer, a client that goes away leaves the batch,
and the regenerate stage runs on it with the same records, report and resume, and no timeout
however long a batch decodes."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from draftline.core.config import ParamsError
from draftline.core.io import read_json, write_jsonl
from draftline.engines.greedy_batch import decode_batch
from draftline.evaluate.acceptance import compare_to_greedy
from draftline.evaluate.specdec import greedy_generate
from draftline.params import parse_params
from draftline.tokens.chat import chat_prompt_ids

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def conversations(n: int) -> list[dict]:
    from draftline.targets.corpus import generate_conversations

    return [
        {"id": f"p{i}", "partition": "short", **c}
        for i, c in enumerate(generate_conversations(n, 5))
    ]


def run_facts(workdir: Path, report: str = "report.json") -> dict:
    """The figures of a stage run kept out of its hashed report, from its run record."""
    return read_json(workdir / "reports/machine/regenerate.json")["run_facts"][report]


def test_batched_greedy_equals_batch_one_except_counted_near_ties(random_target):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_target.model)
    model = AutoModelForCausalLM.from_pretrained(random_target.model, dtype=torch.float32).eval()
    eos = {tokenizer.eos_token_id}
    prompts = []
    for conv in conversations(6):  # prompts of different lengths: left padding differs per row
        first = next(i for i, m in enumerate(conv["messages"]) if m["role"] == "assistant")
        prompts.append(chat_prompt_ids(tokenizer, conv["messages"][:first], conv["tools"], {}))
    assert len({len(p) for p in prompts}) > 1
    tolerance = 1e-4
    batched = decode_batch(model, prompts, 12, tokenizer.pad_token_id, eos, tolerance)
    for prompt, (tokens, ties) in zip(prompts, batched):
        ((alone, _),) = decode_batch(model, [prompt], 12, tokenizer.pad_token_id, eos, tolerance)
        # batch 1 once more, with the logit gaps of every token within the tolerance of its choice
        plain = greedy_generate(model, prompt, 12, eos, margins=True, tie_tolerance=tolerance)
        assert plain.tokens == alone
        verdict = compare_to_greedy(tokens, plain, tolerance)
        # equal, or first different at a near-tie flip of batch 1's (a token within the tolerance
        # of its logit there), and then the request's answer has a counted near-tie
        assert verdict == "identical" or (verdict == "near_tie" and ties > 0), (
            f"a batched answer differs from the batch-1 decode ({verdict}, {ties} near-ties)"
        )


def test_near_ties_are_counted(random_target):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_target.model)
    model = AutoModelForCausalLM.from_pretrained(random_target.model, dtype=torch.float32).eval()
    prompt = chat_prompt_ids(tokenizer, [{"role": "user", "content": "hello"}], None, {})
    ((_, none),) = decode_batch(
        model, [prompt], 6, tokenizer.pad_token_id, set(), tie_tolerance=0.0
    )
    ((tokens, every),) = decode_batch(
        model, [prompt], 6, tokenizer.pad_token_id, set(), tie_tolerance=1e9
    )
    assert none == 0 and every == len(tokens) == 6


def test_near_ties_are_counted_within_each_requests_own_answer(random_target):
    """Rows decode together and each leaves at its own cut: a request's near-ties are counted in the
    answer it gets (its own max_tokens, its end token), never past them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_target.model)
    model = AutoModelForCausalLM.from_pretrained(random_target.model, dtype=torch.float32).eval()
    prompts = [
        chat_prompt_ids(tokenizer, [{"role": "user", "content": text}], None, {})
        for text in ("hello", "what is 2 + 3?")
    ]
    pad = tokenizer.pad_token_id
    # every position a near-tie: each count is the length of the answer it belongs to
    answers = decode_batch(model, prompts, [2, 6], pad, set(), 1e9)
    assert [(len(tokens), ties) for tokens, ties in answers] == [(2, 2), (6, 6)]
    # an end token cuts the count where it cuts the answer
    ((alone, _),) = decode_batch(model, [prompts[1]], 6, pad, set(), 1e9)
    answers = decode_batch(model, prompts, [2, 6], pad, {alone[2]}, 1e9)
    (first, first_ties), (second, second_ties) = answers
    assert second == alone[: alone.index(alone[2]) + 1] and second_ties == len(second) <= 3
    assert first_ties == len(first) <= 2


def test_stage_on_backend_hf_writes_the_same_records_and_resumes(tmp_path, random_target):
    rows = conversations(8)
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["regenerate"].update(
        backend="hf",
        port=free_port(),
        max_tokens=6,
        hf={"max_batch": 4, "gather_ms": 50},
        short={"concurrency": 4, "max_context": None},
        max_length_share=1.0,  # random weights answer up to max_tokens
    )
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    random_target.write(tmp_path / "card.json")
    write_jsonl(tmp_path / "train.jsonl", rows)
    cmd = [
        sys.executable,
        "-m",
        "stages.regenerate",
        "card.json",
        "train.jsonl",
        "out",
        "report.json",
    ]
    # as DVC runs it: the run's timings and batching go to its record (draftline/core/machine.py)
    env = dict(os.environ, PYTHONPATH=str(ROOT), DVC_STAGE="regenerate")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]

    done = [
        json.loads(line) for line in (tmp_path / "out/conversations.jsonl").read_text().splitlines()
    ]
    assert sorted(r["id"] for r in done) == sorted(r["id"] for r in rows)
    assert all(r["messages"][-1]["role"] == "assistant" and "regeneration" in r for r in done)
    report = read_json(tmp_path / "report.json")
    assert report["backend"] == "hf" and report["ok"] == 8 and report["failed"] == 0
    assert report["turns_with_token_ids"] == report["requests"]
    assert report["endpoints"][0]["probe_prompt_tokens"] > 10  # the preflight's token count held
    assert "server" not in report  # how it batched is this run's: in its record
    server = run_facts(tmp_path)["server"]
    assert server["requests"] == report["requests"] + 1  # + the preflight probe
    assert (
        server["largest_batch"] > 1 and server["completion_tokens"] >= report["completion_tokens"]
    )
    assert server["near_tie_tokens"] >= server["near_tie_requests"] >= 0
    assert server["near_tie_request_share"] == round(
        server["near_tie_requests"] / server["requests"], 4
    )

    # the server's own ids, per turn: its usage count, and the greedy batch-1 decode of the turn's
    # prompt (a batched decode may differ only at a counted near-tie)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_target.model)
    model = AutoModelForCausalLM.from_pretrained(random_target.model, dtype=torch.float32).eval()
    for row in done:
        regen = row["regeneration"]
        ids, counts = regen["completion_token_ids"], regen["turn_completion_tokens"]
        assert len(ids) == len(counts) == len(regen["finish_reasons"])
        assert [len(t) for t in ids] == counts
        first = next(i for i, m in enumerate(row["messages"]) if m["role"] == "assistant")
        prompt = chat_prompt_ids(tokenizer, row["messages"][:first], row.get("tools"), {})
        ((alone, _),) = decode_batch(
            model, [prompt], 6, tokenizer.pad_token_id, {tokenizer.eos_token_id}, 1e-4
        )
        assert ids[0] == alone or server["near_tie_tokens"] > 0

    # tokenize compares each turn's re-tokenized span with them, and with assistant_ids: server
    # trains on exactly them
    from datasets import load_from_disk
    from draftline.tokens.chat import trained_runs
    from draftline.tokens.config import TokenizeConfig
    from draftline.tokens.tokenize import tokenize_dataset

    args = (random_target, str(tmp_path / "train.jsonl"), str(tmp_path / "out/conversations.jsonl"))
    report = tokenize_dataset(*args, str(tmp_path / "tok"), TokenizeConfig())["server_token_ids"]
    turns = sum(len(r["regeneration"]["finish_reasons"]) for r in done)
    assert report["assistant_turns"] == report["server_ids"] == report["with_usage"] == turns
    assert report["no_server_ids"] == report["server_ids_count_differs_from_usage"] == 0
    assert (
        report["retokenized_equal_server_ids"] + report["retokenized_differ_from_server_ids"]
        == turns
    )
    report = tokenize_dataset(*args, str(tmp_path / "tok"), TokenizeConfig(assistant_ids="server"))
    assert report["server_token_ids"]["spliced"] == turns
    by_id = {r["id"]: r["regeneration"]["completion_token_ids"] for r in done}
    data = load_from_disk(str(tmp_path / "tok")).with_format(None)
    assert sorted(data["id"]) == sorted(by_id)  # one row per conversation
    for pid, input_ids, loss_mask in zip(data["id"], data["input_ids"], data["loss_mask"]):
        assert trained_runs(input_ids, loss_mask) == by_id[pid]

    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_json(tmp_path / "report.json")["sent"] == 0


def test_backend_hf_refuses_sampling_naming_the_key():
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["regenerate"].update(backend="hf", temperature=0.7)
    with pytest.raises(ParamsError, match="regenerate.temperature: backend hf decodes greedily"):
        parse_params(raw)


def first_turn_ids(tokenizer, n: int) -> list[list[int]]:
    prompts = []
    for conv in conversations(n):
        first = next(i for i, m in enumerate(conv["messages"]) if m["role"] == "assistant")
        prompts.append(chat_prompt_ids(tokenizer, conv["messages"][:first], conv["tools"], {}))
    return prompts


def first_turn_body(conv: dict, max_tokens: int) -> dict:
    first = next(i for i, m in enumerate(conv["messages"]) if m["role"] == "assistant")
    return {
        "model": "target",
        "messages": conv["messages"][:first],
        "tools": conv["tools"],
        "max_tokens": max_tokens,
        "temperature": 0,
    }


def load(card):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(card.model)
    return tokenizer, AutoModelForCausalLM.from_pretrained(card.model, dtype=torch.float32).eval()


def test_step_by_step_decode_picks_what_generate_picks(random_target):
    """The server decodes step by step (to hand out tokens as they come) where it ran one
    `model.generate` per batch: on a batch whose rows neither join nor leave it makes the same
    forward passes, so float32 greedy answers are the same tokens."""
    import torch

    tokenizer, model = load(random_target)
    prompts = first_turn_ids(tokenizer, 5)
    pad = tokenizer.pad_token_id
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=10,
        do_sample=False,
        temperature=None,
        top_p=None,
        top_k=None,
        pad_token_id=pad,
        eos_token_id=[],
    )
    stepped = [tokens for tokens, _ in decode_batch(model, prompts, 10, pad, set(), 1e-4)]
    assert stepped == out[:, width:].tolist()


def test_rows_joining_and_leaving_a_running_batch_decode_as_alone(random_target):
    """Requests join the rows already decoding at the next step (their KV cache left-padded to
    the batch's) and leave when they end: each answer equals its batch-1 decode but at a counted
    near-tie."""
    from draftline.engines.greedy_batch import GreedyBatch, Row

    tokenizer, model = load(random_target)
    prompts = first_turn_ids(tokenizer, 5)
    pad, eos = tokenizer.pad_token_id, {tokenizer.eos_token_id}
    arrivals = {  # step -> rows arriving; the 4-token row has left before the last two join
        0: [Row(prompts[0], 12), Row(prompts[1], 4)],
        3: [Row(prompts[2], 12)],
        6: [Row(prompts[3], 12), Row(prompts[4], 7)],
    }
    rows = [row for group in arrivals.values() for row in group]
    batch = GreedyBatch(model, pad, eos, 1e-4)
    sizes = []
    for step in range(40):
        if step in arrivals:
            batch.join(arrivals[step])
        if len(batch):
            sizes.append(len(batch))
            batch.pick()
            batch.keep([i for i, r in enumerate(batch.rows) if not batch.done(r)])
        if len(batch):
            batch.step()
    assert not len(batch) and 3 in sizes and max(sizes) == 4
    for row in rows:
        ((alone, _),) = decode_batch(model, [row.prompt_ids], row.max_tokens, pad, eos, 1e-4)
        assert row.tokens == alone or row.ties > 0, (
            "an answer decoded among joining and leaving rows differs from its batch-1 decode without a near-tie"
        )


def test_streamed_chunks_put_together_the_whole_answer_with_reasoning_and_tool_calls(
    tiny_tokenizer,
):
    """The client assembles a message from the deltas. With a parser that takes reasoning and tool
    calls out of the text (transformers serve's Qwen template), what it assembles from the chunks
    sent token by token is the whole answer: content, reasoning, tool calls, finish reason, usage."""
    import copy

    from transformers.cli.serving.utils import _RESPONSE_TEMPLATE_FALLBACKS

    from draftline.engines.batch_server import (
        AnswerReader,
        ChunkStream,
        StreamOptions,
        assistant_message,
        text_fields,
    )
    from draftline.regenerate.stream import StreamedAnswer, answer_choice

    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.response_template = next(
        v for types, v in _RESPONSE_TEMPLATE_FALLBACKS.items() if "qwen3" in types
    )
    model = SimpleNamespace(config=SimpleNamespace(model_type="llama"))
    prompt = chat_prompt_ids(tokenizer, [{"role": "user", "content": "What is 2+3?"}], None, {})
    answer = (
        "<think>2 plus 3 is 5, the tool adds.</think>\nThe sum is 5, checking it now."
        '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call><|im_end|>'
    )
    tokens = tokenizer(answer, add_special_tokens=False)["input_ids"]
    eos = {tokenizer.convert_tokens_to_ids("<|im_end|>")}
    reader = AnswerReader(tokenizer, model, eos)
    whole, finish = assistant_message(reader, "chatcmpl-1", prompt, tokens, 200)
    assert whole["reasoning_content"] and whole["content"] and whole["tool_calls"]
    chunks = ChunkStream(
        "chatcmpl-1",
        "target",
        len(prompt),
        lambda t: text_fields(tokenizer, model, prompt, t),
        StreamOptions(include_usage=True, continuous_usage=True),
    )
    sent = chunks.opening()
    for n in range(1, len(tokens) + 1):
        sent += chunks.update(tokens[:n])
    before_end = list(sent)
    sent += chunks.end(tokens, whole, finish)
    streamed = StreamedAnswer()
    for chunk in sent:
        streamed.add(json.loads(json.dumps(chunk)))
    assembled = streamed.answer()
    choice = answer_choice(assembled)
    assert choice["message"] == whole and choice["finish_reason"] == finish == "tool_calls"
    assert assembled["usage"] == {
        "prompt_tokens": len(prompt),
        "completion_tokens": len(tokens),
        "total_tokens": len(prompt) + len(tokens),
    }
    for key in ("reasoning_content", "content"):  # streamed as generated, not all at the end
        assert sum(bool(c["choices"] and c["choices"][0]["delta"].get(key)) for c in before_end) > 2


def test_a_parse_that_changes_streamed_text_ends_the_stream_instead_of_a_wrong_answer():
    from draftline.engines.batch_server import ChunkStream, StreamMismatch

    chunks = ChunkStream("r", "m", 3, lambda t: {"content": "draft " * len(t)})
    assert chunks.update([5, 6, 7])[0]["choices"][0]["delta"] == {"content": "draft draft"}
    with pytest.raises(StreamMismatch):
        chunks.end([5, 6, 7, 8], {"role": "assistant", "content": "final"}, "stop")


# ---- the server in this process, on a local port ----------------------------------------------


@pytest.fixture(scope="module")
def served(random_target, tmp_path_factory):
    from draftline.engines.batch_server import BatchServer
    from draftline.engines.commands import BatchSettings

    stats = tmp_path_factory.mktemp("served") / "server_stats.json"
    return BatchServer(random_target.model, "target", BatchSettings(4, 50, 1e-4), stats)


def serve(server, scenario):
    """`scenario(base_url)` run against `server` listening on a free local port."""
    from aiohttp.test_utils import TestServer

    from draftline.engines.batch_server import make_app

    async def run():
        site = TestServer(make_app(server), host="127.0.0.1")
        await site.start_server()
        try:
            return await scenario(str(site.make_url("")).rstrip("/"))
        finally:
            await site.close()

    return asyncio.run(run())


async def streamed(session, url: str, body: dict) -> tuple[str, list[dict]]:
    """(content type, chunks) of a streamed chat completion."""
    async with session.post(f"{url}/v1/chat/completions", json={**body, "stream": True}) as resp:
        chunks = []
        async for line in resp.content:
            payload = line.strip()[5:].strip() if line.startswith(b"data:") else b""
            if payload and payload != b"[DONE]":
                chunks.append(json.loads(payload))
        return resp.headers.get("Content-Type", ""), chunks


def put_together(chunks: list[dict]) -> dict:
    from draftline.regenerate.stream import StreamedAnswer

    answer = StreamedAnswer()
    for chunk in chunks:
        answer.add(chunk)
    return answer.answer()


def test_answers_stream_as_generated_and_put_together_to_the_whole_answer(served):
    """`stream: true` gets SSE chunks as tokens come (the server used to answer whole whatever the
    request asked), with the usage chunk asked for; put together, they are the whole answer that
    `stream: false` still gets, and the stage's own client reads the same."""
    import aiohttp

    from draftline.regenerate.client import RetryPolicy, chat_completion, close_pool, open_pool

    bodies = [first_turn_body(conv, 24) for conv in conversations(3)]

    async def scenario(url):
        out = []
        async with aiohttp.ClientSession() as session:
            for body in bodies:
                async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                    whole = await resp.json()
                kind, chunks = await streamed(
                    session, url, {**body, "stream_options": {"include_usage": True}}
                )
                out.append((whole, kind, chunks))
        pool = open_pool([url], None)
        try:
            policy = RetryPolicy(0, 1, 1, 30)
            extra = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
            client = await chat_completion(pool.endpoints[0].client, {**bodies[0], **extra}, policy)
        finally:
            await close_pool(pool)
        return out, client

    out, client = serve(served, scenario)
    for whole, kind, chunks in out:
        assert kind.startswith("text/event-stream")
        assembled = put_together(chunks)
        assert assembled["choices"][0]["message"] == whole["choices"][0]["message"]
        assert assembled["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
        assert assembled["usage"] == whole["usage"]
        text = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
        assert len(text) > 2
    assert client["choices"][0]["message"] == out[0][0]["choices"][0]["message"]
    assert client["usage"]["completion_tokens"] == out[0][0]["usage"]["completion_tokens"]


def test_a_request_joins_the_running_batch_instead_of_waiting_for_it(served):
    """A request that arrives while a long answer decodes is prefilled and decoded with it from
    the next step: it is answered while the long one still runs."""
    import aiohttp

    convs = conversations(2)

    async def scenario(url):
        async with aiohttp.ClientSession() as session:
            steps = served.stats.steps
            long = asyncio.create_task(streamed(session, url, first_turn_body(convs[0], 200)))
            deadline = time.monotonic() + 60
            while served.stats.steps < steps + 5 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            async with session.post(
                f"{url}/v1/chat/completions", json=first_turn_body(convs[1], 3)
            ) as resp:
                short = await resp.json()
            still_running = not long.done()
            _, chunks = await long
        return short, still_running, chunks

    short, still_running, chunks = serve(served, scenario)
    assert short["usage"]["completion_tokens"] == 3
    assert still_running, "the short request waited for the long answer's batch to end"
    assert put_together(chunks)["choices"][0]["finish_reason"] == "length"


def test_a_client_that_goes_away_leaves_the_batch(served):
    """A request given up (a client timeout closes its stream) stops costing compute at the next
    step: its row leaves the batch, so its retry is not a wait behind its own abandoned work."""
    import aiohttp

    body = first_turn_body(conversations(1)[0], 900)

    async def scenario(url):
        cancelled, steps = served.stats.cancelled, served.stats.steps
        async with aiohttp.ClientSession() as session:
            resp = await session.post(f"{url}/v1/chat/completions", json={**body, "stream": True})
            lines = 0
            async for line in resp.content:
                lines += line.startswith(b"data:")
                if lines > 4:
                    break
            resp.close()  # as the client does at a timeout: the connection goes
        deadline = time.monotonic() + 60
        while served.stats.cancelled == cancelled and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return cancelled, steps

    cancelled, steps = serve(served, scenario)
    assert served.stats.cancelled == cancelled + 1
    ran = served.stats.steps - steps
    time.sleep(0.3)
    assert served.stats.steps - steps == ran < 900  # nothing decodes any more
    assert read_json(served.stats_file)["cancelled"] == served.stats.cancelled


def test_an_answer_whose_stream_went_wrong_is_kept_for_the_retry(served, monkeypatch):
    """Should a parse change text already streamed, the stream ends with an error (the client
    retries) rather than a wrong answer; the retry gets the kept answer, not a new decode."""
    import aiohttp

    from draftline.engines import batch_server

    body = first_turn_body(conversations(1)[0], 8)

    async def scenario(url):
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                whole = await resp.json()
            monkeypatch.setattr(
                batch_server, "text_fields", lambda tok, model, prompt, t: {"content": "⊥" * len(t)}
            )
            _, first = await streamed(session, url, body)
            prefills = served.stats.prefills
            _, retry = await streamed(session, url, body)
            return whole, first, retry, served.stats.prefills - prefills

    whole, first, retry, prefills = serve(served, scenario)
    assert first[-1]["error"]["message"].startswith("the answer's content does not extend")
    assert prefills == 0
    assert put_together(retry)["choices"][0]["message"] == whole["choices"][0]["message"]


# ---- the stage on a target slow enough that one batch outlasts first_token_timeout_s ---------


@pytest.fixture(scope="module")
def slow_target(tmp_path_factory, tiny_tokenizer):
    """A random Llama deep enough that a batch of 120-token answers decodes for seconds (each
    decode step passes 64 layers: with 24, a fast day's batch took 1.7 s, under the test's 2 s)
    while a prefill stays short, whose end token is never picked (its lm_head row is zero: logit 0
    against the maximum of the others)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftline.targets.model import build_card

    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("slow_target")
    config = LlamaConfig(
        vocab_size=len(tiny_tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=tiny_tokenizer.eos_token_id,
        pad_token_id=tiny_tokenizer.pad_token_id,
        bos_token_id=None,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight[tiny_tokenizer.eos_token_id].zero_()
    model.save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return build_card(str(path), "test", None, [1, 2, 3], {})


def test_a_batch_decoding_past_first_token_timeout_has_no_timeouts(tmp_path, slow_target):
    """With the shipped defaults (32 slots, first_token_timeout_s 120) and 128-token answers on
    SmolLM2, 42 requests of 500 conversations timed out: the server answered whole, so a request's
    first token came when its batch ended, and its retry queued behind that batch. Streamed, the
    first token comes after the prefill: a batch decoding for longer than first_token_timeout_s
    finishes without a retry."""
    timeout_s = 2  # a prefill's first token well inside it, even beside another test's load
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["regenerate"].update(
        backend="hf",
        port=free_port(),
        max_tokens=120,  # each turn's batch decodes for several times timeout_s
        first_token_timeout_s=timeout_s,
        token_timeout_s=30,
        hf={"max_batch": 4, "gather_ms": 50},
        short={"concurrency": 4, "max_context": None},
        max_length_share=1.0,  # its end token is never picked: every answer runs to max_tokens
    )
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    slow_target.write(tmp_path / "card.json")
    write_jsonl(tmp_path / "train.jsonl", conversations(4))
    cmd = [sys.executable, "-m", "stages.regenerate", "card.json", "train.jsonl", "out", "r.json"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), DVC_STAGE="regenerate")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = read_json(tmp_path / "r.json")
    assert report["ok"] == 4 and report["retries"] == {} and report["failure_reasons"] == {}
    assert report["finish_reasons"] == {"length": 4}
    server = run_facts(tmp_path, "r.json")["server"]
    assert server["largest_batch"] == 4 and server["cancelled"] == 0
    assert server["generate_seconds"] > timeout_s, (
        f"the batch ({server['generate_seconds']} s) ended first"
    )


def test_a_batch_server_you_run_yourself_behind_external_is_recorded_as_hf(tmp_path, random_target):
    """`draftline batch-server` started by hand, the stage on `backend: external` with
    `external_engine: hf`: the requests ask for its token ids, usage and streamed usage, every
    line records engine hf with the server's ids, and the summary's tokens/s counts the same
    streamed tokens as the progress lines (it printed 0.0 tok/s when the server had to be
    declared `transformers`)."""
    from draftline.engines.servers import ManagedServer

    port = free_port()
    cmd = [sys.executable, "-m", "draftline.cli", "batch-server", random_target.model]
    cmd += ["--port", str(port), "--max-batch", "4", "--served-model-name", random_target.model]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with ManagedServer(cmd, env, f"http://127.0.0.1:{port}", tmp_path / "server.log", 120) as url:
        rows = conversations(6)
        raw = yaml.safe_load((ROOT / "params.yaml").read_text())
        raw["regenerate"].update(
            backend="external",
            endpoints=[url],
            external_engine="hf",
            max_tokens=6,
            short={"concurrency": 4, "max_context": None},
            max_length_share=1.0,  # random weights answer up to max_tokens
        )
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
        random_target.write(tmp_path / "card.json")
        write_jsonl(tmp_path / "train.jsonl", rows)
        stage = [sys.executable, "-m", "stages.regenerate", "card.json", "train.jsonl", "out"]
        proc = subprocess.run(
            [*stage, "report.json"],
            cwd=tmp_path,
            env=dict(env, DVC_STAGE="regenerate"),  # the stage, as DVC runs it
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = [json.loads(x) for x in (tmp_path / "out/conversations.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in done) == sorted(r["id"] for r in rows)
    for row in done:
        regen = row["regeneration"]
        assert regen["engine"]["engine"] == "hf"
        ids, counts = regen["completion_token_ids"], regen["turn_completion_tokens"]
        assert all(isinstance(t, list) and t for t in ids) and [len(t) for t in ids] == counts
    report = read_json(tmp_path / "report.json")
    assert report["turns_with_token_ids"] == report["requests"] > 0
    assert report["completion_tokens"] == report["streamed_tokens"] > 0
    summary = next(line for line in proc.stdout.splitlines() if " tok/s; " in line)
    rate = run_facts(tmp_path)["streamed_tokens_per_s"]
    assert f"{rate} tok/s" in summary and " 0.0 tok/s" not in summary
