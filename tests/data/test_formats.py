"""draftline.data.formats and stages/prepare.py on the bundled samples and small files written per test
(the preset schemas are in test_presets.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftline.data.formats import (
    SCRIPT_SAMPLE_LETTERS,
    content_hash,
    detect_format,
    dominant_script,
    prepare_records,
)
from draftline.data.sources import _json_array_rows, read_rows

ROOT = Path(__file__).resolve().parents[2]
SHAREGPT = ROOT / "datasets/samples/sharegpt.jsonl"
OPENAI = ROOT / "datasets/samples/openai_messages.jsonl"
ROLES = {"system", "user", "assistant", "tool"}


def write_lines(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def check_schema(record: dict, source: str) -> None:
    assert set(record) - {"source_detail"} == {
        "id",
        "source",
        "messages",
        "tools",
        "prompt_tokens_est",
    }
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
    assert stats["dropped"] == {
        "malformed_json": 1,
        "no_user_turn": 1,
        "empty": 1,
        "duplicate": 1,
        "invalid_role_order": 1,
        "invalid_tools_json": 1,
    }
    for r in records:
        check_schema(r, "sg")
    assert records[0]["id"] == "sharegpt-0000"  # the source's own id
    texts = [m["content"] for r in records for m in r["messages"] if m["role"] == "assistant"]
    assert any(
        t.startswith("<think>") and "</think>\n" in t for t in texts
    )  # reasoning stays inline
    assert any(t.startswith('<tool_call>{"name": ') for t in texts)
    with_tools = [r for r in records if r["tools"]]
    assert with_tools and all(
        isinstance(r["tools"], list) for r in with_tools
    )  # JSON string → list
    assert any(m["role"] == "tool" for r in with_tools for m in r["messages"])


def test_openai_sample_parses_and_counts_bad_rows():
    records, stats = prepare_records(read_rows(str(OPENAI)), "oa", "openai")
    assert stats["rows_read"] == 600 and stats["rows_kept"] == 594
    assert stats["dropped"] == {
        "malformed_json": 1,
        "no_user_turn": 1,
        "empty": 1,
        "duplicate": 1,
        "invalid_role_order": 2,
    }
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
    rows = [
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
        {"messages": [{"role": "user", "content": "hey"}]},
        {"instruction": "Add 2 and 3.", "input": "", "output": "5"},
        {"question": "Why is the sky blue?"},
        {"text": "no known keys"},
    ]
    records, stats = prepare_records(
        read_rows(str(write_lines(tmp_path / "mixed.jsonl", rows))), "m"
    )
    assert stats["formats"] == {"sharegpt": 1, "openai": 1, "alpaca": 1, "prompt": 1}
    assert stats["dropped"] == {"unrecognized_format": 1}


def test_alpaca_and_prompt_from_json_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    alpaca = [
        {
            "instruction": "Translate to French.",
            "input": "cat",
            "output": "chat",
            "system": "Be exact.",
        },
        {"instruction": "Say hi.", "input": "", "output": ""},
    ]
    (tmp_path / "alpaca.json").write_text(json.dumps(alpaca))  # a JSON array file
    records, _ = prepare_records(read_rows(str(tmp_path / "alpaca.json")), "a", "alpaca")
    assert [m["role"] for m in records[0]["messages"]] == ["system", "user", "assistant"]
    assert records[0]["messages"][1]["content"] == "Translate to French.\n\ncat"
    assert records[1]["messages"][-1] == {"role": "assistant", "content": ""}

    pq.write_table(
        pa.Table.from_pylist([{"prompt": "x" * 40}, {"prompt": "Name three birds."}]),
        tmp_path / "p.parquet",
    )
    records, stats = prepare_records(read_rows(str(tmp_path / "p.parquet")), "p", "prompt")
    assert stats["rows_kept"] == 2
    # prompt-only rows get one empty assistant turn: the reply to regenerate
    assert records[0]["messages"] == [
        {"role": "user", "content": "x" * 40},
        {"role": "assistant", "content": ""},
    ]
    assert records[0]["prompt_tokens_est"] == 10


def test_sharegpt_function_call_roles_and_tools_string_or_list():
    call = {
        "from": "function_call",
        "value": json.dumps({"name": "get_weather", "arguments": {"city": "Rome"}}),
    }
    base = [
        {"from": "human", "value": "Weather in Rome?"},
        call,
        {"from": "observation", "value": '{"sky": "windy"}'},
        {"from": "gpt", "value": "Windy."},
    ]
    tool = {"name": "get_weather", "parameters": {"type": "object"}}  # a bare schema, no wrapper
    rows = [
        {"id": 1, "conversations": base, "tools": json.dumps([tool])},
        {
            "id": 2,
            "conversations": base[:1] + [{"from": "gpt", "value": "Let me check."}] + base[1:],
            "tools": [tool],
        },
        {"id": 3, "conversations": base, "tools": "{not json"},
        {"id": 4, "conversations": [{"from": "narrator", "value": "?"}]},
    ]
    records, stats = prepare_records(rows, "s", "sharegpt")
    assert stats["dropped"] == {"invalid_tools_json": 1, "invalid_role": 1}
    first, second = records
    assert [m["role"] for m in first["messages"]] == ["user", "assistant", "tool", "assistant"]
    call_msg = first["messages"][1]
    assert call_msg["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city": "Rome"}',
    }
    assert first["messages"][2]["tool_call_id"] == call_msg["tool_calls"][0]["id"]
    assert first["tools"] == second["tools"] == [{"type": "function", "function": tool}]
    # "gpt: Let me check." followed by a function_call is one assistant turn carrying the call.
    assert (
        second["messages"][1]["content"] == "Let me check." and second["messages"][1]["tool_calls"]
    )
    assert first["id"] == "1"


def test_role_order_rules():
    def reason(roles):
        msgs = [{"role": r, "content": f"turn {i}"} for i, r in enumerate(roles)]
        _, stats = prepare_records(
            [{"messages": msgs}, {"messages": [{"role": "user", "content": "ok"}]}], "r", "openai"
        )
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
    path = write_lines(
        tmp_path / "bad.jsonl",
        [
            "{oops",
            {"messages": []},
            {"messages": []},
            {"messages": [{"role": "assistant", "content": "hi"}]},
        ],
    )
    with pytest.raises(
        ValueError,
        match=r"dataset 'broken': no valid rows out of 4 read; "
        r"top drop reasons: empty \(2\), malformed_json \(1\), no_user_turn \(1\)",
    ):
        prepare_records(read_rows(str(path)), "broken", "auto")


def test_unknown_format_and_missing_file():
    with pytest.raises(
        ValueError, match="unknown format 'xml'; supported: auto, sharegpt, openai, alpaca, prompt"
    ):
        prepare_records([], "x", "xml")
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
        read_rows("/nonexistent/nowhere.jsonl")


def run_prepare(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    # -P: do not put stages/ on sys.path (stage names like tokenize.py shadow the standard library)
    return subprocess.run(
        [sys.executable, "-P", str(ROOT / "stages/prepare.py"), *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )


def test_prepare_stage(tmp_path):
    (tmp_path / "params.yaml").write_text(
        f"samples: 10\ndatasets:\n  sg: {{path: {SHAREGPT}, max_rows: 100}}\n  bad: {{path: {tmp_path}/bad.jsonl}}\n"
        "mix: {weights: {sg: 1, bad: 1}}\n"
    )
    write_lines(tmp_path / "bad.jsonl", [{"messages": []}])
    done = run_prepare(tmp_path, "sg", "prepared/sg.jsonl", "reports/sg.json")
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "reports/sg.json").read_text())
    assert report["rows_read"] == 100 and report["rows_kept"] == sum(
        1 for _ in open(tmp_path / "prepared/sg.jsonl")
    )
    done = run_prepare(tmp_path, "nope", "x.jsonl", "x.json")
    assert (
        done.returncode == 1
        and "unknown dataset 'nope'; params.yaml datasets: bad, sg" in done.stderr
    )
    done = run_prepare(tmp_path, "bad", "b.jsonl", "b.json")
    assert done.returncode == 1 and "dataset 'bad': no valid rows" in done.stderr
    assert not (tmp_path / "b.jsonl").exists()


def test_json_array_streams_across_read_boundaries(tmp_path):
    rows = [
        {
            "id": i,
            "conversations": [
                {"from": "human", "value": f'q{i}, [with] {{braces}} \\u00e9 "quotes"'}
            ],
        }
        for i in range(40)
    ]
    text = json.dumps(rows[:20] + [7, "not a row"] + rows[20:], indent=1)
    path = tmp_path / "rows.json"
    path.write_text(text)
    with open(path) as f:
        got = list(_json_array_rows(f, path, chunk=64))  # rows span many 64-byte reads
    assert got[:20] == rows[:20] and got[20:22] == [None, None] and got[22:] == rows[20:]
    assert list(read_rows(str(path))) == got
    for broken, message in (
        (text[: len(text) // 2], "invalid JSON in array|not closed"),
        ('{"a": 1}', "not a JSON array"),
    ):
        path.write_text(broken)
        with open(path) as f, pytest.raises(ValueError, match=message):
            list(_json_array_rows(f, path, chunk=64))


def test_field_mapping_too_long_and_script_filters():
    rows = [
        {"q": "Where is Lima?", "uid": "a"},
        {"q": "Где находится Лима?", "uid": "b"},  # Cyrillic
        {"q": "利马在哪里？", "uid": "c"},  # Han
        {"q": "リマはどこですか？", "uid": "d"},  # kana
        {"q": "12 * 7 = ?", "uid": "e"},  # no letters: always passes
        {"q": "Where is Lima? " * 50, "uid": "f"},  # 188 estimated tokens
        {"question": "no q column", "uid": "g"},
    ]
    records, stats = prepare_records(
        rows,
        "s",
        "prompt",
        fields={"prompt": "q", "id": "uid"},
        max_prompt_tokens=100,
        scripts=["latin", "kana"],
    )
    assert [r["id"] for r in records] == ["a", "d", "e"]
    assert stats["dropped"] == {"unwanted_script": 2, "missing_field": 1, "too_long": 1}
    assert (
        dominant_script("Hello, Привет, мир и ещё") == "cyrillic"
        and dominant_script("1 + 1") is None
    )
    assert (
        dominant_script("a" * SCRIPT_SAMPLE_LETTERS + "ж" * 5000) == "latin"
    )  # only the first letters count
    with pytest.raises(ValueError, match="unknown scripts \\['elvish'\\]"):
        prepare_records(rows, "s", "prompt", fields={"prompt": "q"}, scripts=["elvish"])


def test_parse_markup_turns_inline_markup_into_structure():
    conv = [
        {
            "from": "system",
            "value": 'Use tools. <tools>[{"name": "add", "parameters": {}}]</tools>',
        },
        {"from": "human", "value": "2+3?"},
        {
            "from": "gpt",
            "value": "<think>Add them.</think>\n<tool_call>{'name': 'add', 'arguments': {'a': 2, 'b': 3}}</tool_call>",
        },
        {"from": "tool", "value": "<tool_response>5</tool_response>"},
        {"from": "gpt", "value": "<think></think>It is 5."},
    ]
    (record,), _ = prepare_records([{"conversations": conv}], "m", "sharegpt", parse_markup=True)
    system, _, call, result, answer = record["messages"]
    assert system == {"role": "system", "content": "Use tools."}
    assert record["tools"] == [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    assert call["reasoning_content"] == "Add them." and call["content"] == ""
    assert call["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'}
    assert result == {"role": "tool", "content": "5", "tool_call_id": call["tool_calls"][0]["id"]}
    assert answer == {"role": "assistant", "content": "It is 5."}  # an empty think block just goes
    # Without parse_markup the same row keeps its markup inline.
    (inline,), _ = prepare_records([{"conversations": conv}], "m", "sharegpt")
    assert inline["tools"] is None and inline["messages"][2]["content"].startswith(
        "<think>Add them.</think>"
    )
    bad = [dict(t) for t in conv]
    bad[2]["value"] = "<tool_call>{'name': 'add', 'arguments': </tool_call>"
    _, stats = prepare_records(
        [{"conversations": bad}, {"conversations": conv}], "m", "sharegpt", parse_markup=True
    )
    assert stats["dropped"] == {"invalid_tool_calls": 1}


def malformed_tenth(path: Path) -> dict:
    """1000 lines, 900 good and 100 bad with known reasons, shuffled by a fixed rule; returns the counts."""
    good = [
        {
            "id": f"row-{i}",
            "messages": [
                {"role": "user", "content": f"What is {i} + {i}?"},
                {"role": "assistant", "content": f"{2 * i}"},
            ],
        }
        for i in range(900)
    ]
    bad = (
        [f'{{"id": "cut-{k}", "messages": [{{"role": "user"' for k in range(30)]  # malformed_json
        + ["[1, 2, 3]"] * 5  # JSON, but not an object: malformed_json too
        + [{"id": f"empty-{k}", "messages": []} for k in range(15)]
        + [
            {
                "id": f"nouser-{k}",
                "messages": [
                    {"role": "system", "content": "Hi"},
                    {"role": "assistant", "content": "?"},
                ],
            }
            for k in range(10)
        ]
        + [
            {
                "id": f"order-{k}",
                "messages": [
                    {"role": "user", "content": f"q{k}"},
                    {"role": "tool", "content": "x"},
                ],
            }
            for k in range(10)
        ]
        + [
            {
                "id": f"tools-{k}",
                "tools": "[{oops",
                "messages": [{"role": "user", "content": f"t{k}"}],
            }
            for k in range(10)
        ]
        + [
            {"id": f"long-{k}", "messages": [{"role": "user", "content": f"{k} " + "word " * 200}]}
            for k in range(10)
        ]
        + [
            {
                "id": f"cyr-{k}",
                "messages": [{"role": "user", "content": f"Сколько будет {k} плюс {k}?"}],
            }
            for k in range(5)
        ]
        + [{**good[k], "id": f"copy-{k}"} for k in range(3)]  # duplicate content under a new id
        + [{**good[k], "messages": [{"role": "user", "content": f"other {k}"}]} for k in range(2)]
    )  # duplicate_id
    lines = [json.dumps(r) for r in good]
    for k, row in enumerate(bad):  # bad lines after their good originals, spread over the file
        lines.insert(9 * k + 9, row if isinstance(row, str) else json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return {
        "malformed_json": 35,
        "empty": 15,
        "no_user_turn": 10,
        "invalid_role_order": 10,
        "invalid_tools_json": 10,
        "too_long": 10,
        "unwanted_script": 5,
        "duplicate": 3,
        "duplicate_id": 2,
    }


def test_ten_percent_malformed_file_gets_exact_reason_counts(tmp_path):
    expected = malformed_tenth(tmp_path / "noisy.jsonl")
    (tmp_path / "params.yaml").write_text(
        "samples: 10\ndatasets:\n  noisy: {path: noisy.jsonl, max_prompt_tokens: 100, scripts: [latin],"
        " max_drop_share: 0.05}\nmix: {weights: {noisy: 1}}\n"
    )
    done = run_prepare(
        tmp_path,
        "noisy",
        "prepared/noisy.jsonl",
        "reports/noisy.json",
        "--source-dep",
        "noisy.jsonl",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "reports/noisy.json").read_text())
    assert report["rows_read"] == 1000 and report["rows_kept"] == 900
    assert report["dropped"] == expected and sum(expected.values()) == 100
    kept = [json.loads(line) for line in open(tmp_path / "prepared/noisy.jsonl")]
    assert [r["id"] for r in kept] == [f"row-{i}" for i in range(900)]  # source order, nothing lost
    assert report["resolved_revision"] is None and report["format"] == "auto"
    # the malformed rows (35 of 1000): their share, and the first few by line number
    assert report["malformed_share"] == 0.035 and len(report["malformed_first"]) == 5
    lines = (tmp_path / "noisy.jsonl").read_text().splitlines()
    for named in report["malformed_first"]:
        where, _, why = named.partition(": ")
        n = int(where.removeprefix("line "))
        assert why.startswith("not JSON (") or why == "not a JSON object"
        with pytest.raises((json.JSONDecodeError, AssertionError)):
            assert isinstance(json.loads(lines[n - 1]), dict)


def test_a_half_corrupt_file_fails_prepare_naming_the_share_and_first_bad_line(tmp_path):
    """Above datasets.<name>.max_drop_share (default 0.01) of rows that are not JSON objects, the
    stage fails after writing its report, naming the share and the first bad line."""
    rows = [json.dumps({"id": f"r{i}", "prompt": f"hello {i}"}) for i in range(10)]
    rows[3:8] = ['{"id": "cut", "prompt": "hel'] * 5  # lines 4-8 cut short
    (tmp_path / "half.jsonl").write_text("\n".join(rows) + "\n")
    (tmp_path / "params.yaml").write_text(
        "samples: 2\ndatasets:\n  half: {path: half.jsonl}\nmix: {weights: {half: 1}}\n"
    )
    done = run_prepare(tmp_path, "half", "half.out.jsonl", "half.report.json")
    assert done.returncode == 1, done.stdout
    assert "Traceback" not in done.stderr
    assert "datasets.half: 5 of 10 rows (50.0%) of half.jsonl are not JSON objects" in done.stderr
    assert "max_drop_share 0.01; first: line 4: not JSON (" in done.stderr
    report = json.loads((tmp_path / "half.report.json").read_text())
    assert report["malformed_share"] == 0.5 and report["malformed_first"][0].startswith("line 4:")


def test_a_missing_dataset_file_is_named_by_its_param(tmp_path):
    (tmp_path / "params.yaml").write_text(
        "samples: 2\ndatasets:\n  gone: {path: gone.jsonl}\nmix: {weights: {gone: 1}}\n"
    )
    done = run_prepare(tmp_path, "gone", "gone.out.jsonl", "gone.report.json")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "error: datasets.gone.path: gone.jsonl does not exist" in done.stderr


@pytest.mark.parametrize(
    "name, content, what",
    [
        ("cut.json", b'[{"id": "a", "prompt": "hi"}, {"id": "b", "pro', "ValueError: invalid JSON"),
        ("bad.parquet", b"PAR1 not a parquet file", "ArrowInvalid: "),
        ("latin1.json", b'[{"id": "a", "prompt": "caf\xe9"}]', "UnicodeDecodeError: "),
    ],
    ids=["cut_array", "corrupt_parquet", "array_not_utf8"],
)
def test_a_dataset_file_that_cannot_be_read_is_named_by_its_param(tmp_path, name, content, what):
    """A source that cannot be read at all (a JSON array cut short, a corrupt parquet file, an
    array that is not UTF-8) fails prepare naming datasets.<name>.path, the path and what is
    wrong; no traceback."""
    (tmp_path / name).write_bytes(content)
    (tmp_path / "params.yaml").write_text(
        f"samples: 2\ndatasets:\n  src: {{path: {name}}}\nmix: {{weights: {{src: 1}}}}\n"
    )
    done = run_prepare(tmp_path, "src", "src.out.jsonl", "src.report.json")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"error: datasets.src.path: {name} cannot be read ({what}" in done.stderr


def test_a_line_that_is_not_utf8_is_a_malformed_row_named_by_its_line(tmp_path):
    """One corrupt byte costs its row, named by line number, not the whole file (it used to end
    in a UnicodeDecodeError naming neither the param nor the path)."""
    rows = [json.dumps({"id": f"r{i}", "prompt": f"hello {i}"}).encode() for i in range(300)]
    rows[41] = rows[41].replace(b"hello", b"h\xffllo")
    (tmp_path / "noisy.jsonl").write_bytes(b"\n".join(rows) + b"\n")
    got = list(read_rows(str(tmp_path / "noisy.jsonl")))
    assert got[41] == ("line 42", "not UTF-8 text (column 27)") and len(got) == 300
    (tmp_path / "params.yaml").write_text(
        "samples: 2\ndatasets:\n  noisy: {path: noisy.jsonl}\nmix: {weights: {noisy: 1}}\n"
    )
    done = run_prepare(tmp_path, "noisy", "noisy.out.jsonl", "noisy.report.json")
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "noisy.report.json").read_text())
    assert report["dropped"] == {"malformed_json": 1} and report["rows_kept"] == 299
    assert report["malformed_first"] == ["line 42: not UTF-8 text (column 27)"]


def test_stage_refuses_a_stale_source_dep(tmp_path):
    write_lines(tmp_path / "a.jsonl", [{"prompt": "hi"}])
    (tmp_path / "params.yaml").write_text(
        "samples: 1\ndatasets:\n  a: {path: a.jsonl}\nmix: {weights: {a: 1}}\n"
    )
    done = run_prepare(tmp_path, "a", "a.out.jsonl", "a.report.json", "--source-dep", "old.jsonl")
    assert done.returncode == 1 and "datasets/sources.yaml is stale" in done.stderr
    assert not (tmp_path / "a.out.jsonl").exists()


def test_sharegpt_top_level_system_and_the_rows_own_source_are_kept():
    """Issue #16.6: OpenThoughts-style ShareGPT rows carry the system prompt in a top-level `system`
    column (Alpaca and prompt-only already read it); blended sets carry their upstream in `source`,
    which the dataset name used to replace."""
    rows = [
        {
            "system": "Think step by step.",
            "source": "open-thoughts/math",
            "conversations": [
                {"from": "user", "value": "1 + 1?"},
                {"from": "assistant", "value": "2"},
            ],
        },
        {
            "system": "Be brief.",
            "conversations": [
                {"from": "system", "value": "Be brief."},
                {"from": "human", "value": "Hi"},
                {"from": "gpt", "value": "Hello"},
            ],
        },
        {
            "messages": [
                {"role": "user", "content": "Name a colour."},
                {"role": "assistant", "content": "Red"},
            ],
            "system": "Answer in one word.",
            "source": 7,
        },
    ]
    records, stats = prepare_records(rows, "blend")
    assert stats["rows_kept"] == 3
    first, second, third = records
    assert first["messages"][0] == {"role": "system", "content": "Think step by step."}
    assert [m["role"] for m in first["messages"]] == ["system", "user", "assistant"]
    assert first["source"] == "blend" and first["source_detail"] == "open-thoughts/math"
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant"]  # not doubled
    assert "source_detail" not in second
    assert (
        third["messages"][0]["content"] == "Answer in one word." and third["source_detail"] == "7"
    )
    for record in records:
        check_schema(record, "blend")
