"""The built-in source pydoc_long: long-context eval prompts cut from the Python Language Reference
that ships with CPython. Rows are deterministic, reach their length buckets, keep whole
paragraphs in order, histories end on a user turn; the source is eval-only, needs no file, and
every way of asking for what it cannot give fails naming the key."""

import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from draftline.core.config import ParamsError, load_sections
from draftline.data.config import Datasets, DatasetSpec, check_eval_sets
from draftline.data.formats import DECODE_HISTORY, prepare_records
from draftline.data.pydoc_long import (
    FILL,
    PydocLongConfig,
    build_rows,
    prompt_chars,
    reference,
    reference_facts,
)
from draftline.data.sources import HUB_DEP, prepare_dataset, source_dep
from draftline.data.workspace import sources_problems, write_sources

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"lengths": [512, 2048], "per_length": 2}


def rows_of(**build) -> list[dict]:
    return list(build_rows(PydocLongConfig(**build)))


def spec(**build) -> DatasetSpec:
    return DatasetSpec(builtin="pydoc_long", build=build)


def test_the_reference_ships_with_this_python():
    ref = reference()
    facts = reference_facts()
    assert facts["module"] == "pydoc_data.topics" and facts["python"] == platform.python_version()
    # hundreds of KB of text in thousands of paragraphs, with a heading to start a row at
    assert facts["characters"] > 200_000 and len(ref.paragraphs) > 1000 and len(ref.headings) > 50
    assert len(facts["sha256"]) == 64


def test_rows_are_deterministic_and_the_seed_moves_them(tmp_path):
    first, again = rows_of(), rows_of()
    assert json.dumps(first) == json.dumps(again)
    other = rows_of(seed=1)
    assert [r["id"] for r in other] == [r["id"] for r in first]
    assert sum(a["messages"] != b["messages"] for a, b in zip(first, other)) > len(first) // 2
    # through prepare: the same settings give the same bytes
    for out in ("a.jsonl", "b.jsonl"):
        prepare_dataset("long", spec(**SMALL), str(tmp_path / out))
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_every_row_lies_in_its_length_bucket():
    cfg = PydocLongConfig()
    rows = list(build_rows(cfg))
    assert len(rows) == len(cfg.lengths) * len(cfg.kinds) * cfg.per_length == 40
    assert FILL >= 0.75  # so a row lies inside the bucket (length / 2, length], with room
    reached = {}
    for row in rows:
        kind, length, _ = row["id"].split("-")
        tokens = math.ceil(prompt_chars(row["messages"]) / 4)  # prepare's estimate
        assert FILL * int(length) <= tokens <= int(length), (row["id"], tokens)
        assert row["source"] == f"{kind}-{length}"
        reached.setdefault(int(length), []).append(tokens)
    assert sorted(reached) == [512, 1024, 2048, 4096, 8192]
    assert min(reached[8192]) > 4096 and max(reached[512]) <= 512
    # interleaved: the first rows (what evaluate.prompts takes) hold every length and kind
    assert {r["source"] for r in rows[:10]} == {r["source"] for r in rows}


def test_rows_are_runs_of_whole_paragraphs_of_the_reference():
    ref = reference()
    at = {text: i for i, text in reversed(list(enumerate(ref.paragraphs)))}
    for row in rows_of(**SMALL):
        text = "\n\n".join(m["content"] for m in row["messages"] if m["role"] == "user")
        paragraphs = [p for p in text.split("\n\n") if p in at]
        first = at[paragraphs[0]]
        assert paragraphs == ref.paragraphs[first : first + len(paragraphs)], row["id"]
        assert first in ref.headings  # a row starts at a section heading
        assert len(" ".join(paragraphs)) > 0.7 * prompt_chars(row["messages"])


def test_a_document_is_one_user_turn_ending_on_its_question():
    for row in rows_of(kinds=["document"], **SMALL):
        (message,) = row["messages"]
        ask = message["content"].rsplit("\n\n", 1)[1]
        assert message["role"] == "user" and "the section titled '" in ask
        assert ask.endswith((".", "?")) and len(ask) < 200


def test_a_history_alternates_and_ends_on_a_user_question(tmp_path):
    histories = rows_of(kinds=["history"], lengths=[512, 4096], per_length=2)
    for row in histories:
        roles = [m["role"] for m in row["messages"]]
        assert roles[-1] == "user" and roles[::2] == ["user"] * len(roles[::2])
        assert roles[1::2] == ["assistant"] * len(roles[1::2])
        carrying = [m for m in row["messages"][:-1] if m["role"] == "user"]
        assert len(carrying) >= 2  # the document comes in parts
        assert all(len(m["content"]) < 40 for m in row["messages"] if m["role"] == "assistant")
        assert "the section titled" in row["messages"][-1]["content"]
    assert max(len(r["messages"]) for r in histories) == 2 * 4 + 1  # 4096 / 1024 tokens a turn
    # prepared, the reply to write follows that last user turn
    prepare_dataset(
        "long", spec(kinds=["history"], lengths=[512], per_length=2), str(tmp_path / "h.jsonl")
    )
    for line in (tmp_path / "h.jsonl").read_text().splitlines():
        record = json.loads(line)
        assert record["messages"][-1] == {"role": "assistant", "content": ""}
        assert record["messages"][-2]["role"] == "user"
        assert record["source_detail"] == "history-512"
        assert record["decode"] == DECODE_HISTORY  # evaluate decodes it whole, not its first turn


def test_decode_history_is_kept_and_nothing_else():
    """The record keeps what evaluate reads (draftline/evaluate/prompts.py) and no other value."""
    rows = [
        {"id": i, "messages": [{"role": "user", "content": f"hi {i}"}], **decode}
        for i, decode in enumerate([{"decode": "history"}, {"decode": "whole"}, {}])
    ]
    records, _ = prepare_records(rows, "src")
    assert [r.get("decode") for r in records] == ["history", None, None]


def test_prepare_records_what_the_rows_were_cut_from(tmp_path):
    report = prepare_dataset("long", spec(**SMALL), str(tmp_path / "long.jsonl"))
    assert report["rows_kept"] == report["rows_read"] == 8 and report["dropped"] == {}
    assert report["builtin_source"] == reference_facts()
    assert report["builtin"] == "pydoc_long" and report["build"]["lengths"] == [512, 2048]


def test_a_builtin_needs_no_file_and_depends_on_the_code(tmp_path):
    datasets = {"long": spec()}
    assert source_dep(datasets["long"]) == HUB_DEP
    write_sources(datasets, str(tmp_path / "sources.yaml"))
    assert sources_problems(datasets, tmp_path / "sources.yaml") == []
    assert f"source_dep: {HUB_DEP}" in (tmp_path / "sources.yaml").read_text()


def test_the_builtin_is_eval_only():
    datasets = {"chat": DatasetSpec(path="chat.jsonl"), "long": spec()}
    check_eval_sets(datasets, ["long"])
    with pytest.raises(
        ValueError,
        match=r"\['long'\] are benchmark sets \(an eval-only preset or builtin\): name them in evaluate.sets",
    ):
        check_eval_sets(datasets, [])


def load(tmp_path, entry: str):
    (tmp_path / "params.yaml").write_text(f"datasets:\n  long: {entry}\n")
    return load_sections(tmp_path / "params.yaml", datasets=Datasets)


@pytest.mark.parametrize(
    "entry, says",
    [
        (
            "{builtin: nope}",
            "datasets.long: Value error, unknown builtin 'nope'; builtins: pydoc_long",
        ),
        (
            "{builtin: pydoc_long, build: {per_length: 0}}",
            "datasets.long.build.per_length: Input should be greater than or equal to 1",
        ),
        (
            "{builtin: pydoc_long, build: {lengths: []}}",
            "datasets.long.build.lengths: List should have at least 1 item",
        ),
        ("{builtin: pydoc_long, build: {lengths: [64]}}", "lengths: [64] below 128 tokens"),
        (
            "{builtin: pydoc_long, build: {kinds: [essay]}}",
            "datasets.long.build.kinds.0: Input should be 'document' or 'history'",
        ),
        (
            "{builtin: pydoc_long, build: {size: 3}}",
            "datasets.long.build.size: Extra inputs are not permitted",
        ),
        (
            "{builtin: pydoc_long, path: x.jsonl}",
            "builtin pydoc_long generates its rows: path do not apply",
        ),
        ("{builtin: pydoc_long, format: sharegpt}", "format: builtin pydoc_long rows are openai"),
        ("{path: x.jsonl, build: {per_length: 2}}", "build: the settings of a builtin source"),
        (
            "{format: openai}",
            "path: required (a local file or dataset directory, or a hub dataset id), or builtin",
        ),
    ],
    ids=[
        "unknown",
        "zero_count",
        "no_length",
        "too_short",
        "unknown_kind",
        "unknown_key",
        "with_path",
        "other_format",
        "build_alone",
        "no_source",
    ],
)
def test_bad_settings_fail_naming_the_key(tmp_path, entry, says):
    with pytest.raises(ParamsError) as err:
        load(tmp_path, entry)
    assert says in str(err.value)


def test_the_defaults_load(tmp_path):
    long = load(tmp_path, "{builtin: pydoc_long}")["datasets"]["long"]
    assert long.build == PydocLongConfig() and long.format == "openai" and long.path is None


def test_a_length_longer_than_the_whole_source_fails_naming_it(tmp_path):
    too_long = reference_facts()["characters"] // 4 + 1000
    with pytest.raises(ValueError) as err:
        prepare_dataset("long", spec(lengths=[512, too_long]), str(tmp_path / "long.jsonl"))
    assert (
        f"datasets.long.build.lengths: {too_long} tokens is longer than the whole source: "
        f"pydoc_data.topics of Python {platform.python_version()} holds"
    ) in str(err.value)


def test_more_rows_than_sections_fail_naming_per_length():
    with pytest.raises(
        ValueError,
        match=r"build.per_length: 5000 document rows of 512 tokens asked, but only \d+ sections",
    ):
        rows_of(lengths=[512], kinds=["document"], per_length=5000)


def test_prepare_stage_builds_the_set_and_names_a_bad_length(tmp_path):
    """The real entry point: rows written from params alone, no file; a length the source cannot
    fill fails with the dotted key and no traceback."""

    def prepare(build: str) -> subprocess.CompletedProcess:
        (tmp_path / "params.yaml").write_text(
            f"datasets:\n  long: {{builtin: pydoc_long, build: {build}}}\n"
        )
        return subprocess.run(
            [
                sys.executable,
                "-P",
                str(ROOT / "stages/prepare.py"),
                "long",
                "long.jsonl",
                "long.report.json",
                "--source-dep",
                HUB_DEP,
            ],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
        )

    done = prepare("{lengths: [1024], per_length: 3}")
    assert done.returncode == 0, done.stderr
    assert "prepare long: kept 6/6 rows" in done.stdout
    ids = [json.loads(line)["id"] for line in (tmp_path / "long.jsonl").read_text().splitlines()]
    assert ids == [f"{kind}-1024-{i}" for i in range(3) for kind in ("document", "history")]
    done = prepare("{lengths: [10000000]}")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert (
        "error: datasets.long.build.lengths: 10000000 tokens is longer than the whole source"
        in done.stderr
    )


# ---- part: train, long rows to train on, clear of an eval build -------------------------------

EVAL_BUILD = {"lengths": [512, 1024, 2048, 4096], "per_length": 2}
TRAIN_BUILD = {"part": "train", "lengths": [1024, 4096], "per_length": 3, "held_out": EVAL_BUILD}


def test_without_part_the_rows_are_the_eval_rows():
    assert json.dumps(rows_of(**SMALL)) == json.dumps(rows_of(**SMALL, part="eval"))


def test_a_train_part_shares_no_piece_with_the_eval_build_it_holds_out():
    """What the mix's piece holdout would skip (PieceIndex.found, any paragraph of 8+ words of an
    eval row): none of the train rows, against the eval build held out and any it covers (fewer
    rows per length, fewer lengths); the same settings as an eval part share most rows' pieces."""
    from draftline.data.holdout import PieceIndex

    train = rows_of(**TRAIN_BUILD)
    assert len(train) == 2 * 2 * 3
    assert all(r["id"].startswith("train-") and "decode" not in r for r in train)
    for held in (EVAL_BUILD, {**EVAL_BUILD, "per_length": 1}, {"lengths": [2048], "per_length": 2}):
        pieces = PieceIndex({"long_docs": rows_of(**held)})
        assert [r["id"] for r in train if pieces.found(r["messages"])] == [], held
    # the check has teeth: the same lengths cut for eval carry the eval rows' pieces
    pieces = PieceIndex({"long_docs": rows_of(**EVAL_BUILD)})
    same = rows_of(lengths=[1024, 4096], per_length=3)
    assert sum(bool(pieces.found(r["messages"])) for r in same) >= len(same) // 2


def test_a_train_part_keeps_its_lengths_and_is_deterministic():
    train = rows_of(**TRAIN_BUILD)
    assert json.dumps(train) == json.dumps(rows_of(**TRAIN_BUILD))
    for row in train:
        _, kind, length, _ = row["id"].split("-")
        assert FILL * int(length) <= math.ceil(prompt_chars(row["messages"]) / 4) <= int(length)
        assert row["messages"][-1]["role"] == "user"


def test_a_train_part_is_trained_on_not_evaluated():
    datasets = {"chat": DatasetSpec(path="chat.jsonl"), "long": spec(**EVAL_BUILD)}
    datasets["long_train"] = spec(**TRAIN_BUILD)
    check_eval_sets(datasets, ["long"])  # not a benchmark set: it need not be named there
    with pytest.raises(ValueError, match=r"\['long_train'\] are built to train on"):
        check_eval_sets(datasets, ["long", "long_train"])


@pytest.mark.parametrize(
    "build, says",
    [
        ({"part": "train"}, "held_out: part train needs"),
        ({"held_out": {}}, "held_out: only with part: train"),
        ({"part": "test"}, "part"),
    ],
)
def test_a_train_part_names_what_it_holds_out(build, says):
    with pytest.raises(ValueError, match=says):
        PydocLongConfig(**build)
