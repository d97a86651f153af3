"""draftline.formats and stages/prepare.py on the bundled samples and small files written per test."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftline.formats import content_hash, detect_format, prepare_records, read_rows

ROOT = Path(__file__).resolve().parents[1]
SHAREGPT = ROOT / "datasets/samples/sharegpt.jsonl"
OPENAI = ROOT / "datasets/samples/openai_messages.jsonl"
ROLES = {"system", "user", "assistant", "tool"}


def write_lines(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def check_schema(record: dict, source: str) -> None:
    assert set(record) == {"id", "source", "messages", "tools", "prompt_tokens_est"}
    assert record["source"] == source and isinstance(record["id"], str) and record["id"]
    assert record["tools"] is None or isinstance(record["tools"], list)
    assert isinstance(record["prompt_tokens_est"], int) and record["prompt_tokens_est"] >= 0
    for m in record["messages"]:
        assert m["role"] in ROLES and isinstance(m["content"], str)
        assert set(m) <= {"role", "content", "reasoning_content", "tool_calls", "tool_call_id"}
    assert record["messages"][-1]["role"] == "assistant"


def test_sharegpt_sample_parses_and_counts_bad_rows():
    records, stats = prepare_records(read_rows(str(SHAREGPT)), "sg", "sharegpt")
    assert stats["rows_read"] == 600 and stats["rows_kept"] == 594
    assert stats["dropped"] == {"malformed_json": 1, "no_user_turn": 1, "empty": 1, "duplicate": 1,
                                "invalid_role_order": 1, "invalid_tools_json": 1}
    for r in records:
        check_schema(r, "sg")
    assert records[0]["id"] == "sharegpt-0000"  # the source's own id
    texts = [m["content"] for r in records for m in r["messages"] if m["role"] == "assistant"]
    assert any(t.startswith("<think>") and "</think>\n" in t for t in texts)  # reasoning stays inline
    assert any(t.startswith('<tool_call>{"name": ') for t in texts)
    with_tools = [r for r in records if r["tools"]]
    assert with_tools and all(isinstance(r["tools"], list) for r in with_tools)  # JSON string → list
    assert any(m["role"] == "tool" for r in with_tools for m in r["messages"])


def test_openai_sample_parses_and_counts_bad_rows():
    records, stats = prepare_records(read_rows(str(OPENAI)), "oa", "openai")
    assert stats["rows_read"] == 600 and stats["rows_kept"] == 594
    assert stats["dropped"] == {"malformed_json": 1, "no_user_turn": 1, "empty": 1, "duplicate": 1,
                                "invalid_role_order": 2}
    for r in records:
        check_schema(r, "oa")
        assert r["id"] == content_hash(r["messages"], r["tools"])  # no source ids: content hash
    assistant = [m for r in records for m in r["messages"] if m["role"] == "assistant"]
    assert any(m.get("reasoning_content") for m in assistant)
    call = next(m["tool_calls"][0] for m in assistant if m.get("tool_calls"))
    assert call["type"] == "function" and isinstance(call["function"]["arguments"], str)
    tool_ids = {m["tool_call_id"] for r in records for m in r["messages"] if m["role"] == "tool"}
    assert call["id"] in tool_ids


def test_auto_detection_matches_explicit_formats(tmp_path):
    for path, fmt in ((SHAREGPT, "sharegpt"), (OPENAI, "openai")):
        auto, stats = prepare_records(read_rows(str(path)), "x")
        assert stats["formats"] == {fmt: 594}
        assert auto == prepare_records(read_rows(str(path)), "x", fmt)[0]
    assert detect_format({"instruction": "a"}) == "alpaca"
    assert detect_format({"question": "a"}) == detect_format({"prompt": "a"}) == "prompt"
    # A mixed file in auto mode: each row detected on its own; an unknown shape is counted.
    rows = [{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
            {"messages": [{"role": "user", "content": "hey"}]},
            {"instruction": "Add 2 and 3.", "input": "", "output": "5"},
            {"question": "Why is the sky blue?"},
            {"text": "no known keys"}]
    records, stats = prepare_records(read_rows(str(write_lines(tmp_path / "mixed.jsonl", rows))), "m")
    assert stats["formats"] == {"sharegpt": 1, "openai": 1, "alpaca": 1, "prompt": 1}
    assert stats["dropped"] == {"unrecognized_format": 1}


def test_alpaca_and_prompt_from_json_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    alpaca = [{"instruction": "Translate to French.", "input": "cat", "output": "chat", "system": "Be exact."},
              {"instruction": "Say hi.", "input": "", "output": ""}]
    (tmp_path / "alpaca.json").write_text(json.dumps(alpaca))  # a JSON array file
    records, _ = prepare_records(read_rows(str(tmp_path / "alpaca.json")), "a", "alpaca")
    assert [m["role"] for m in records[0]["messages"]] == ["system", "user", "assistant"]
    assert records[0]["messages"][1]["content"] == "Translate to French.\n\ncat"
    assert records[1]["messages"][-1] == {"role": "assistant", "content": ""}

    pq.write_table(pa.Table.from_pylist([{"prompt": "x" * 40}, {"prompt": "Name three birds."}]), tmp_path / "p.parquet")
    records, stats = prepare_records(read_rows(str(tmp_path / "p.parquet")), "p", "prompt")
    assert stats["rows_kept"] == 2
    # prompt-only rows get one empty assistant turn: the reply to regenerate
    assert records[0]["messages"] == [{"role": "user", "content": "x" * 40}, {"role": "assistant", "content": ""}]
    assert records[0]["prompt_tokens_est"] == 10


def test_sharegpt_function_call_roles_and_tools_string_or_list():
    call = {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": "Rome"}})}
    base = [{"from": "human", "value": "Weather in Rome?"}, call,
            {"from": "observation", "value": '{"sky": "windy"}'}, {"from": "gpt", "value": "Windy."}]
    tool = {"name": "get_weather", "parameters": {"type": "object"}}  # a bare schema, no wrapper
    rows = [{"id": 1, "conversations": base, "tools": json.dumps([tool])},
            {"id": 2, "conversations": base[:1] + [{"from": "gpt", "value": "Let me check."}] + base[1:], "tools": [tool]},
            {"id": 3, "conversations": base, "tools": "{not json"},
            {"id": 4, "conversations": [{"from": "narrator", "value": "?"}]}]
    records, stats = prepare_records(rows, "s", "sharegpt")
    assert stats["dropped"] == {"invalid_tools_json": 1, "invalid_role": 1}
    first, second = records
    assert [m["role"] for m in first["messages"]] == ["user", "assistant", "tool", "assistant"]
    call_msg = first["messages"][1]
    assert call_msg["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Rome"}'}
    assert first["messages"][2]["tool_call_id"] == call_msg["tool_calls"][0]["id"]
    assert first["tools"] == second["tools"] == [{"type": "function", "function": tool}]
    # "gpt: Let me check." followed by a function_call is one assistant turn carrying the call.
    assert second["messages"][1]["content"] == "Let me check." and second["messages"][1]["tool_calls"]
    assert first["id"] == "1"


def test_role_order_rules():
    def reason(roles):
        msgs = [{"role": r, "content": f"turn {i}"} for i, r in enumerate(roles)]
        _, stats = prepare_records([{"messages": msgs}, {"messages": [{"role": "user", "content": "ok"}]}], "r", "openai")
        return next(iter(stats["dropped"]), None)

    assert reason(["user", "user", "assistant"]) is None  # consecutive users: allowed
    assert reason(["system", "system", "user"]) is None
    assert reason(["user", "assistant", "tool", "tool", "assistant"]) is None
    assert reason(["assistant", "user"]) == "invalid_role_order"
    assert reason(["user", "assistant", "assistant"]) == "invalid_role_order"
    assert reason(["user", "tool"]) == "invalid_role_order"
    assert reason(["user", "assistant", "system", "user"]) == "invalid_role_order"
    assert reason(["system", "assistant"]) == "no_user_turn"


def test_zero_valid_rows_names_dataset_and_reasons(tmp_path):
    path = write_lines(tmp_path / "bad.jsonl", ["{oops", {"messages": []}, {"messages": []},
                                                 {"messages": [{"role": "assistant", "content": "hi"}]}])
    with pytest.raises(ValueError, match=r"dataset 'broken': no valid rows out of 4 read; "
                                         r"top drop reasons: empty \(2\), malformed_json \(1\), no_user_turn \(1\)"):
        prepare_records(read_rows(str(path)), "broken", "auto")


def test_unknown_format_and_missing_file():
    with pytest.raises(ValueError, match="unknown format 'xml'; supported: auto, sharegpt, openai, alpaca, prompt"):
        prepare_records([], "x", "xml")
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
        read_rows("/nonexistent/nowhere.jsonl")


def run_prepare(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    # -P: do not put stages/ on sys.path (stage names like tokenize.py shadow the standard library)
    return subprocess.run([sys.executable, "-P", str(ROOT / "stages/prepare.py"), *args], cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)


def test_prepare_stage(tmp_path):
    (tmp_path / "params.yaml").write_text(
        f"samples: 10\ndatasets:\n  sg: {{path: {SHAREGPT}, max_rows: 100}}\n  bad: {{path: {tmp_path}/bad.jsonl}}\n"
        "mix: {weights: {sg: 1, bad: 1}}\n")
    write_lines(tmp_path / "bad.jsonl", [{"messages": []}])
    done = run_prepare(tmp_path, "sg", "prepared/sg.jsonl", "reports/sg.json")
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "reports/sg.json").read_text())
    assert report["rows_read"] == 100 and report["rows_kept"] == sum(1 for _ in open(tmp_path / "prepared/sg.jsonl"))
    done = run_prepare(tmp_path, "nope", "x.jsonl", "x.json")
    assert done.returncode == 1 and "unknown dataset 'nope'; params.yaml datasets: bad, sg" in done.stderr
    done = run_prepare(tmp_path, "bad", "b.jsonl", "b.json")
    assert done.returncode == 1 and "dataset 'bad': no valid rows" in done.stderr
    assert not (tmp_path / "b.jsonl").exists()
