"""An eval set assembled from paragraphs (the builtin pydoc_long) is held out of train piece by
piece: a train row that carries any paragraph of it, word for word in any non-assistant turn, is
skipped and counted, so no piece of the set is in train; the mix stage does it for a builtin
named in evaluate.sets and for nothing else."""

import json
from pathlib import Path

import pytest

from draftline.data.config import DatasetSpec, MixConfig
from draftline.data.holdout import PIECE_MIN_WORDS, PieceIndex, piece_words, pieces_of
from draftline.data.mixing import mix_splits
from draftline.data.pydoc_long import PydocLongConfig, build_rows
from draftline.data.sources import prepare_dataset
from tests.stage_runner import mix_in

ROOT = Path(__file__).resolve().parents[2]
BUILD = {"lengths": [512, 1024], "per_length": 2}


@pytest.fixture(scope="module")
def long_rows() -> list[dict]:
    """The set as prepare writes it (each row ends on the reply to write)."""
    return [
        {**row, "tools": None, "messages": [*row["messages"], {"role": "assistant", "content": ""}]}
        for row in build_rows(PydocLongConfig(**BUILD))
    ]


def a_piece(rows: list[dict], turn: int = 0) -> str:
    """A paragraph of a row's user turn `turn` long enough to be a piece, as the set has it."""
    users = [m for m in rows[0]["messages"] if m["role"] == "user"]
    return next(
        p
        for p in users[turn]["content"].split("\n\n")
        if len(piece_words(p)) >= PIECE_MIN_WORDS + 4
    )


def chat(i: int, text: str) -> dict:
    return {
        "id": f"chat-{i}",
        "source": "chat",
        "tools": None,
        "prompt_tokens_est": len(text) // 4 + 1,
        "messages": [{"role": "user", "content": text}, {"role": "assistant", "content": ""}],
    }


def words(i: int) -> str:
    """A chat prompt of its own words, no digits (no two are twins, templates or near-twins)."""
    return " ".join(chr(97 + i % 26) + chr(97 + i // 26) + chr(97 + k) * 3 for k in range(12))


def planted(piece: str) -> str:
    """A train prompt quoting the piece re-wrapped and in capitals, inside other text."""
    return "Can you help me with this?\n\n" + piece.upper().replace("\n", " ") + "\n\nThanks!"


def test_pieces_are_long_paragraphs_of_every_user_turn(long_rows):
    history = next(r for r in long_rows if r["id"].startswith("history"))
    found = pieces_of(history["messages"])
    assert all(len(p) >= PIECE_MIN_WORDS for p in found)
    later = [m for m in history["messages"] if m["role"] == "user"][1]["content"]
    assert any(piece_words(p) in found for p in later.split("\n\n"))  # a later turn's too
    assert piece_words("Changed in version 3.8.") not in found  # a common phrase is no piece


def test_the_index_finds_a_piece_whatever_its_wrapping_but_not_in_answers(long_rows):
    index = PieceIndex({"long": long_rows})
    piece = a_piece(long_rows)
    assert index.found(chat(0, planted(piece))["messages"]) == f"long/{long_rows[0]['id']}"
    for role in ("system", "tool"):
        quoted = [{"role": "user", "content": "hi"}, {"role": role, "content": piece}]
        assert index.found(quoted) is not None
    answered = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": piece}]
    assert index.found(answered) is None  # regeneration writes answers anew
    half = " ".join(piece.split()[: len(piece.split()) // 2])
    assert index.found(chat(0, half)["messages"]) is None  # part of a piece is not a piece
    assert index.counts["long"] >= len(long_rows)


def test_a_train_row_carrying_one_paragraph_of_a_long_row_is_held_out(long_rows):
    first, later = a_piece(long_rows), a_piece(long_rows[1:], turn=1)  # a history's 2nd turn
    pool = [chat(i, words(i)) for i in range(40)]
    pool += [chat(100, planted(first)), chat(101, "Look:\n\n" + later)]
    cfg = MixConfig(weights={"chat": 1}, eval_samples=2, dev_samples=0, allow_shortfall=True)
    # without the pieces both planted rows are drawn (every row is: samples > rows)
    splits, _ = mix_splits({"chat": pool}, cfg, 100, 0, {"long": long_rows})
    assert {"chat-100", "chat-101"} <= {r["id"] for r in splits["train"] + splits["eval"]}
    index = PieceIndex({"long": long_rows})
    splits, report = mix_splits({"chat": pool}, cfg, 100, 0, {"long": long_rows}, index)
    drawn = {r["id"] for r in splits["train"] + splits["eval"]}
    assert not drawn & {"chat-100", "chat-101"} and len(splits["train"]) == 40 - 2
    assert report["holdout"]["pieces"] == {
        "min_words": PIECE_MIN_WORDS,
        "sets": {"long": index.counts["long"]},
        "train_rows_skipped": 2,
        "train_rows_with_piece": 0,
    }
    assert report["per_dataset"]["chat"]["twins"] == 2  # counted like the twins
    # no piece of the set in any train prompt, checked on the text itself
    train_text = [piece_words(m["content"]) for r in splits["train"] for m in r["messages"]]
    for piece in {p for row in long_rows for p in pieces_of(row["messages"])}:
        assert not any(
            text[i : i + len(piece)] == piece for text in train_text for i in range(len(text))
        )


def test_the_mix_stage_holds_a_builtin_set_out_piece_by_piece(tmp_path, long_rows):
    """prepare -> mix with the set named in evaluate.sets: the row carrying a paragraph never
    reaches train, the report counts it and records the text the set was cut from."""
    prepared, reports = tmp_path / "prepared", tmp_path / "reports/prepare"
    prepared.mkdir()
    reports.mkdir(parents=True)
    build = json.dumps(BUILD)
    report = prepare_dataset(
        "long_docs",
        DatasetSpec(builtin="pydoc_long", build=BUILD),
        str(prepared / "long_docs.jsonl"),
    )
    (reports / "long_docs.json").write_text(json.dumps(report))
    pool = [chat(i, words(i)) for i in range(40)] + [chat(100, planted(a_piece(long_rows)))]
    (prepared / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pool))
    (reports / "chat.json").write_text(
        json.dumps({"rows_read": 41, "rows_kept": 41, "dropped": {}})
    )
    (tmp_path / "params.yaml").write_text(
        f"samples: 30\nseed: 0\ndatasets:\n  chat: {{path: chat.jsonl}}\n"
        f"  long_docs: {{builtin: pydoc_long, build: {build}}}\n"
        "mix: {weights: {chat: 1}, eval_samples: 4, dev_samples: 0}\n"
        "evaluate: {sets: [long_docs]}\n"
    )
    done = mix_in(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "rows carrying a piece of long_docs kept out of train 1" in done.stdout
    read = lambda path: [json.loads(line) for line in (tmp_path / path).read_text().splitlines()]  # noqa: E731
    train, long_set = read("mixed/train.jsonl"), read("mixed/sets/long_docs.jsonl")
    assert "chat-100" not in {r["id"] for r in train + read("mixed/eval.jsonl")}
    assert [r["id"] for r in long_set] == [r["id"] for r in long_rows]
    assert {r["decode"] for r in long_set} == {"history"}  # what evaluate reads, kept by mix
    mix = json.loads((tmp_path / "reports/mix.json").read_text())
    assert mix["holdout"]["pieces"]["train_rows_skipped"] == 1
    assert mix["holdout"]["pieces"]["train_rows_with_piece"] == 0
    assert mix["prepare"]["long_docs"]["builtin_source"]["module"] == "pydoc_data.topics"


def test_a_set_from_a_file_is_not_held_out_by_pieces(tmp_path):
    """Piece by piece is for sets assembled from paragraphs: a file eval set (whose prompts may
    share an instruction paragraph with many train prompts) keeps the twin rules alone."""
    from draftline.data.config import held_out_by_pieces

    assert not held_out_by_pieces(DatasetSpec(path="bench.jsonl"))
    assert held_out_by_pieces(DatasetSpec(builtin="pydoc_long"))
