"""Every preset on bundled rows that follow its dataset's published schema (tests/fixtures/datasets/),
and the hub loading path (`datasets.load_dataset`, streaming or not) on a local dataset directory."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftline.data.config import DatasetSpec
from draftline.data.formats import PrepareStats
from draftline.data.presets import PRESETS
from draftline.data.sources import HUB_DEP, dvc_source_dep, spec_records

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests/fixtures/datasets"
FIXTURE_FILES = {
    "sharegpt_vicuna": "sharegpt_vicuna.jsonl",
    "ultrachat_200k": "ultrachat_200k.jsonl",
    "open_perfectblend": "open_perfectblend.jsonl",
    "gsm8k": "gsm8k.jsonl",
    "mixture_of_thoughts": "mixture_of_thoughts.jsonl",
    "hermes_function_calling": "hermes_function_calling.json",  # the hub file is a JSON array
    # benchmark sets (evaluate.sets): generated rows in each set's published schema
    "mt_bench": "mt_bench.jsonl",
    "humaneval": "humaneval.jsonl",
    "gsm8k_test": "gsm8k.jsonl",
    "math500": "math500.jsonl",
    "speculator_benchmarks": "speculator_benchmarks.jsonl",
}


def prepared(preset: str, **overrides) -> tuple[list[dict], dict]:
    spec = DatasetSpec(preset=preset, path=str(FIXTURES / FIXTURE_FILES[preset]), **overrides)
    stats = PrepareStats()
    records = list(spec_records(spec, preset, stats))
    return records, stats.as_dict()


def roles(record: dict) -> list[str]:
    return [m["role"] for m in record["messages"]]


def test_every_preset_has_a_fixture_and_resolves_to_its_hub_source():
    assert set(FIXTURE_FILES) == set(PRESETS)
    spec = DatasetSpec(preset="ultrachat_200k", revision="8049631c405ae6576f93f445c6b8166f76f5505a")
    assert (spec.path, spec.split, spec.format, spec.streaming) == (
        "HuggingFaceH4/ultrachat_200k",
        "train_sft",
        "openai",
        True,
    )
    assert spec.fields == {"id": "prompt_id"} and spec.revision.startswith("8049")
    assert (
        DatasetSpec(preset="gsm8k").name == "main"
        and DatasetSpec(preset="hermes_function_calling").name == "func_calling"
    )
    assert (
        DatasetSpec(preset="gsm8k", split="test").split == "test"
    )  # a given key wins over the preset
    assert dvc_source_dep(spec.path) == HUB_DEP  # a hub id is no file for DVC to hash
    assert dvc_source_dep(str(FIXTURES / "gsm8k.jsonl")).endswith("gsm8k.jsonl")


def test_sharegpt_vicuna():
    records, stats = prepared("sharegpt_vicuna")
    # "i6IyJda_1" continues a split chat and opens with the assistant; "kUk3r7L_0" has no turns
    assert stats["dropped"] == {"empty": 1, "invalid_role_order": 1} and stats["rows_kept"] == 3
    assert [r["id"] for r in records] == ["QWJhYvA_0", "i6IyJda_0", "A5AbcES_0"]  # the source's ids
    assert roles(records[0]) == ["user", "assistant", "user", "assistant"]
    assert roles(records[1]) == ["user", "assistant"]  # "bing" speaks as the assistant
    assert roles(records[2]) == ["system", "user", "assistant"]


def test_ultrachat_200k():
    records, stats = prepared("ultrachat_200k")
    assert stats["dropped"] == {"duplicate_id": 1}  # a prompt_id seen before with other content
    first = records[0]
    assert (
        first["id"].startswith("00e3d4e9") and len(first["id"]) == 64
    )  # prompt_id, not a content hash
    assert roles(first) == ["user", "assistant", "user", "assistant"]
    assert first["messages"][0]["content"].startswith("These instructions apply")


def test_open_perfectblend():
    records, stats = prepared("open_perfectblend")
    # The same conversation from two upstream sources: kept once. No id column: content hashes.
    assert stats["dropped"] == {"duplicate": 1} and stats["rows_kept"] == 3
    assert all(len(r["id"]) == 16 for r in records)
    assert roles(records[1]) == ["system", "user", "assistant"]


def test_hermes_function_calling_tools_schema():
    records, stats = prepared("hermes_function_calling")
    assert stats["dropped"] == {"invalid_tools_json": 1}  # the row whose <tools> block is cut off
    multi, extraction = records
    assert [t["function"]["name"] for t in multi["tools"]] == [
        "get_stock_price",
        "get_company_news",
    ]
    assert multi["tools"][0]["function"]["parameters"]["required"] == ["symbol"]
    system = multi["messages"][0]["content"]
    assert (
        "get_stock_price" not in system and "function calling AI" in system
    )  # the block went into `tools`
    assert roles(multi) == ["system", "user", "assistant", "tool", "tool", "assistant"]
    calls = multi["messages"][2]["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [
        {"symbol": "TSLA"},
        {"symbol": "TSLA", "limit": 3},
    ]
    assert [m["tool_call_id"] for m in multi["messages"][3:5]] == [c["id"] for c in calls]
    assert (
        json.loads(multi["messages"][3]["content"])["content"]["price"] == 191.97
    )  # <tool_response> unwrapped
    # Escaped "\\n" around the call and a Python list inside JSON-ish arguments still parse.
    args = json.loads(extraction["messages"][2]["tool_calls"][0]["function"]["arguments"])
    assert args == {"application_questions": ["How are weights used in route planning?"]}
    assert extraction["tools"][0]["function"]["name"] == "ExpertQAExtractor"


def test_mixture_of_thoughts_reasoning():
    records, stats = prepared("mixture_of_thoughts")
    assert stats["rows_kept"] == 2 and not stats["dropped"]
    answer = records[0]["messages"][1]
    assert (
        answer["reasoning_content"].startswith("The sum 1 + 2")
        and answer["content"] == "The sum is **55**."
    )
    assert records[1]["messages"][1]["content"].startswith("```python")
    # Inline thinking kept verbatim when markup parsing is off.
    records, _ = prepared("mixture_of_thoughts", parse_markup=False)
    assert records[0]["messages"][1]["content"].startswith("<think>\nThe sum")


def test_gsm8k_prompt_only():
    records, stats = prepared("gsm8k")
    assert stats["dropped"] == {"empty": 1}  # a blank question
    assert all(
        roles(r) == ["user", "assistant"] and r["messages"][1]["content"] == "" for r in records
    )
    assert records[0]["messages"][0]["content"].startswith("Natalia sold clips")
    assert "####" not in json.dumps(records)  # the reference answer is not a prompt


def test_mt_bench_asks_both_turns_with_the_replies_left_to_the_target():
    records, stats = prepared("mt_bench")
    assert stats["dropped"] == {"empty": 1}  # a blank first turn
    assert [roles(r) for r in records] == [["user", "assistant", "user", "assistant"]] * 2
    first = records[0]
    assert first["id"] == "9001" and first["source_detail"] == "writing"
    assert [m["content"] for m in first["messages"]][1::2] == ["", ""]  # the target answers
    assert first["messages"][2]["content"] == "Now rewrite the note as a limerick."
    assert "5:15 pm" not in json.dumps(records)  # references are not prompts


@pytest.mark.parametrize(
    ("preset", "hub", "split", "first_id", "detail"),
    [
        ("humaneval", "openai/openai_humaneval", "test", "Generated/0", None),
        ("gsm8k_test", "openai/gsm8k", "test", None, None),
        (
            "math500",
            "HuggingFaceH4/MATH-500",
            "test",
            "generated/number_theory/1.json",
            "Number Theory",
        ),
        ("speculator_benchmarks", "RedHatAI/speculator_benchmarks", "train", None, None),
    ],
)
def test_benchmark_sets_are_one_prompt_each(preset, hub, split, first_id, detail):
    """Each benchmark preset: its hub source, and one user turn per row (no reference answer,
    solution or test code in the prompt)."""
    spec = DatasetSpec(preset=preset)
    assert (spec.path, spec.split) == (hub, split) and PRESETS[preset].eval_only
    records, stats = prepared(preset)
    assert records and set(stats["dropped"]) <= {"empty"}  # gsm8k.jsonl has a blank question
    assert all(roles(r) == ["user", "assistant"] for r in records)
    assert (first_id is None or records[0]["id"] == first_id) and records[0].get(
        "source_detail"
    ) == detail
    text = json.dumps(records)
    assert "canonical_solution" not in text and "boxed" not in text and "####" not in text
    assert "assert candidate" not in text


def test_speculator_benchmarks_reads_one_category_file():
    assert DatasetSpec(preset="speculator_benchmarks").data_files == "math_reasoning.jsonl"
    spec = DatasetSpec(preset="speculator_benchmarks", data_files="writing.jsonl")
    assert spec.data_files == "writing.jsonl"  # a given key wins


def test_a_benchmark_set_must_be_an_eval_set():
    """A benchmark preset is never trained on: outside evaluate.sets params.yaml is refused; an
    eval set takes no mix weight."""
    import yaml

    from draftline.core.config import ParamsError
    from draftline.params import parse_params

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["datasets"]["bench"] = {"preset": "mt_bench"}
    raw["evaluate"]["sets"] = [s for s in raw["evaluate"].get("sets", []) if s != "bench"]
    with pytest.raises(
        ParamsError, match=r"\['bench'\] are benchmark sets .*name them in evaluate.sets"
    ):
        parse_params(raw)
    raw["evaluate"]["sets"].append("bench")
    assert "bench" in parse_params(raw).evaluate.sets
    raw["mix"]["weights"]["bench"] = 0.1
    with pytest.raises(ParamsError, match=r"eval sets .*take none.*unknown \['bench'\]"):
        parse_params(raw)
    raw["mix"]["weights"].pop("bench")
    raw["evaluate"]["sets"].append("nowhere")
    with pytest.raises(ParamsError, match=r"evaluate.sets: \['nowhere'\] are not datasets"):
        parse_params(raw)


@pytest.mark.parametrize("streaming", [True, False])
def test_local_dataset_directory_through_load_dataset(tmp_path, streaming):
    """A hub-style directory (parquet shards under data/) goes through datasets.load_dataset, as a hub id would."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in open(FIXTURES / "open_perfectblend.jsonl")]
    shards = tmp_path / "open-perfectblend/data"
    shards.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows[:2]), shards / "train-00000-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(rows[2:]), shards / "train-00001-of-00002.parquet")
    (tmp_path / "params.yaml").write_text(
        f"samples: 1\ndatasets:\n  blend: {{preset: open_perfectblend, path: open-perfectblend, streaming: {str(streaming).lower()}}}\n"
        "mix: {weights: {blend: 1}}\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(tmp_path / "cache"),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-P",
            str(ROOT / "stages/prepare.py"),
            "blend",
            "out.jsonl",
            "report.json",
            "--source-dep",
            "open-perfectblend",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert (
        report["streaming"] is streaming
        and report["split"] == "train"
        and report["preset"] == "open_perfectblend"
    )
    assert (
        report["dropped"] == {"duplicate": 1} and report["resolved_revision"] is None
    )  # a local dir has no commit
    got = [json.loads(line) for line in open(tmp_path / "out.jsonl")]
    expected, _ = prepared("open_perfectblend")
    assert [r["messages"] for r in got] == [r["messages"] for r in expected]


def test_readme_datasets_example_validates():
    import re

    import yaml

    from draftline.data.config import DatasetSpec, MixConfig

    section = (ROOT / "docs" / "datasets.md").read_text().split("# Datasets", 1)[1]
    example = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))
    specs = {name: DatasetSpec(**raw) for name, raw in example["datasets"].items()}
    assert specs["chat"].path == "HuggingFaceH4/ultrachat_200k" and specs["thinking"].scripts == [
        "latin"
    ]
    assert set(MixConfig(**example["mix"]).weights) == set(specs)
