"""regenerate.backend: hf — greedy batched decoding behind the OpenAI-compatible API
(draftline/batch_server.py): batched answers equal batch-1 greedy decodes except at counted
near-ties, and the regenerate stage runs on it with the same records, report and resume."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from draftline.batch_server import decode_batch, own_answer
from draftline.chat import chat_prompt_ids
from draftline.config import ParamsError, parse_params
from draftline.evaluation import compare_to_greedy
from draftline.io import read_json, write_jsonl
from draftline.specdec import greedy_generate

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def conversations(n: int) -> list[dict]:
    from draftline.corpus import generate_conversations

    return [
        {"id": f"p{i}", "partition": "short", **c}
        for i, c in enumerate(generate_conversations(n, 5))
    ]


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
    """A batch runs to its longest request's max_tokens: a request's near-ties are counted in the
    answer it gets (its own max_tokens, its end token), never in the batch's tokens past them."""
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
    answers = decode_batch(model, prompts, 6, pad, set(), 1e9, max_tokens=[2, 6])
    assert [(len(tokens), ties) for tokens, ties in answers] == [(2, 2), (6, 6)]
    # an end token cuts the count where it cuts the answer
    ((alone, _),) = decode_batch(model, [prompts[1]], 6, pad, set(), 1e9)
    answers = decode_batch(model, prompts, 6, pad, {alone[2]}, 1e9, max_tokens=[2, 6])
    (first, first_ties), (second, second_ties) = answers
    assert second == alone[: alone.index(alone[2]) + 1] and second_ties == len(second) <= 3
    assert first_ties == len(first) <= 2


def test_own_answer_cuts_at_the_end_token_or_its_own_max_tokens():
    margins = [0.0, 5.0, 0.0, 0.0, 0.0]  # near-ties at 0, 2, 3, 4 (tolerance 1)
    assert own_answer([7, 8, 9, 2, 2], margins, 5, {2}, 1.0) == ([7, 8, 9, 2], 3)
    assert own_answer([7, 8, 9, 2, 2], margins, 2, {2}, 1.0) == ([7, 8], 1)
    assert own_answer([7, 8, 9, 4, 4], margins, 9, {2}, 1.0) == ([7, 8, 9, 4, 4], 4)


def test_stage_on_backend_hf_writes_the_same_records_and_resumes(tmp_path, random_target):
    rows = conversations(8)
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["regenerate"].update(
        backend="hf",
        port=free_port(),
        max_tokens=6,
        hf={"max_batch": 4, "gather_ms": 50},
        short={"concurrency": 4, "max_context": None},
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
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]

    done = [
        json.loads(line) for line in (tmp_path / "out/conversations.jsonl").read_text().splitlines()
    ]
    assert sorted(r["id"] for r in done) == sorted(r["id"] for r in rows)
    assert all(r["messages"][-1]["role"] == "assistant" and "regeneration" in r for r in done)
    report = read_json(tmp_path / "report.json")
    assert report["backend"] == "hf" and report["ok"] == 8 and report["failed"] == 0
    assert report["endpoints"][0]["probe_prompt_tokens"] > 10  # the preflight's token count held
    server = report["server"]
    assert server["requests"] == report["requests"] + 1  # + the preflight probe
    assert (
        server["largest_batch"] > 1 and server["completion_tokens"] >= report["completion_tokens"]
    )
    assert server["near_tie_tokens"] >= server["near_tie_requests"] >= 0
    assert server["near_tie_request_share"] == round(
        server["near_tie_requests"] / server["requests"], 4
    )

    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_json(tmp_path / "report.json")["sent"] == 0


def test_backend_hf_refuses_sampling_naming_the_key():
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["regenerate"].update(backend="hf", temperature=0.7)
    with pytest.raises(ParamsError, match="regenerate.temperature: backend hf decodes greedily"):
        parse_params(raw)
