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

from draftline.batch_server import decode_batch
from draftline.chat import chat_prompt_ids
from draftline.config import ParamsError, parse_params
from draftline.io import read_json, write_jsonl

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
    batched = decode_batch(model, prompts, 12, tokenizer.pad_token_id, eos, tie_tolerance=1e-4)
    for prompt, (tokens, ties) in zip(prompts, batched):
        ((alone, _),) = decode_batch(
            model, [prompt], 12, tokenizer.pad_token_id, eos, tie_tolerance=1e-4
        )
        assert tokens == alone or ties > 0, (
            "a batched answer differs from the batch-1 decode without a near-tie"
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
    assert report["turns_with_token_ids"] == report["requests"]
    assert report["endpoints"][0]["probe_prompt_tokens"] > 10  # the preflight's token count held
    server = report["server"]
    assert server["requests"] == report["requests"] + 1  # + the preflight probe
    assert (
        server["largest_batch"] > 1 and server["completion_tokens"] >= report["completion_tokens"]
    )
    assert "near_tie_tokens" in server

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
    from draftline.chat import trained_runs
    from draftline.config import TokenizeConfig
    from draftline.tokenization import tokenize_dataset

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
