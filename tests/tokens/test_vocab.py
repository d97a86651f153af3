"""Stage `vocab`: speculators' d2t/t2d conventions, the size check, the coverage report."""

import contextlib
import dataclasses
import json

import numpy as np
import pytest
import torch

PARAMS = "samples: 10\ndatasets:\n  d: {{path: d.jsonl, format: openai}}\nmix:\n  weights: {{d: 1.0}}\nvocab: {{draft_vocab_size: {size}{more}}}\n"


@pytest.fixture
def run(tmp_path, random_target):
    """run(freq, draft_vocab_size, target_vocab_size): the stage on a card with that vocabulary; its report."""

    def run(freq: dict, draft_vocab_size: int, target_vocab_size: int) -> dict:
        return run_stage(
            tmp_path,
            dataclasses.replace(random_target, vocab_size=target_vocab_size),
            freq,
            draft_vocab_size,
        )

    return run


def run_stage(tmp_path, card, freq: dict, draft_vocab_size: int, **vocab) -> dict:
    from stages.vocab import main

    more = "".join(f", {k}: {v}" for k, v in vocab.items())
    (tmp_path / "params.yaml").write_text(PARAMS.format(size=draft_vocab_size, more=more))
    card.write(tmp_path / "card.json")
    torch.save(freq, tmp_path / "token_freq.pt")
    with contextlib.chdir(tmp_path):
        main("card.json", "token_freq.pt", "vocab", "vocab.json")
    return json.loads((tmp_path / "vocab.json").read_text())


def test_d2t_offsets_and_t2d_mask(tmp_path, run):
    # target vocab 50; trainable tokens with distinct counts, the most frequent ones scattered
    freq = {40: 100, 3: 90, 17: 80, 45: 70, 8: 60, 30: 5, 2: 4, 11: 1}
    report = run(freq, 5, 50)
    d2t, t2d = np.load(tmp_path / "vocab" / "d2t.npy"), np.load(tmp_path / "vocab" / "t2d.npy")
    assert d2t.dtype == np.int64 and d2t.shape == (5,)
    assert t2d.dtype == np.bool_ and t2d.shape == (50,) and t2d.sum() == 5
    top5 = sorted(freq, key=lambda t: -freq[t])[:5]
    target_ids = np.arange(5) + d2t  # offsets: target id = draft id + d2t[draft id]
    assert target_ids.tolist() == sorted(top5)  # ascending, the most frequent
    assert t2d[target_ids].all() and np.flatnonzero(t2d).tolist() == sorted(top5)
    assert report["coverage"] == round(400 / 410, 6)
    assert report["distinct_trainable_tokens"] == 8 and report["uncovered_distinct_tokens"] == 3
    assert report["unseen_tokens_in_draft"] == 0


def test_draft_vocab_larger_than_the_distinct_tokens_is_filled(tmp_path, run):
    report = run({7: 3, 9: 1}, 4, 20)
    t2d = np.load(tmp_path / "vocab" / "t2d.npy")
    assert t2d.sum() == 4 and t2d[7] and t2d[9]  # padded with the lowest unused ids
    assert report["coverage"] == 1.0 and report["unseen_tokens_in_draft"] == 2


@pytest.mark.parametrize(
    "freq, draft_vocab_size, target_vocab_size",
    [
        ({40: 100, 3: 90, 17: 80, 45: 70, 8: 60, 30: 5, 2: 4, 11: 1}, 5, 50),
        ({7: 3, 9: 1}, 4, 20),  # topped up with the lowest unused ids
        ({5: 2, 1: 2, 9: 2, 0: 1}, 3, 10),  # ties go to the lower id
        ({}, 6, 6),  # nothing seen: the first ids
        ({i: (i * 7919) % 13 + 1 for i in range(300)}, 64, 1000),
    ],
)
def test_mappings_are_the_ones_speculators_builds(freq, draft_vocab_size, target_vocab_size):
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    from draftline.tokens.vocab import vocab_mappings

    ours = vocab_mappings(freq, draft_vocab_size, target_vocab_size)
    theirs = build_vocab_mappings_from_distribution(freq, draft_vocab_size, target_vocab_size)
    for mine, other in zip(ours, theirs):
        assert mine.dtype == other.numpy().dtype and np.array_equal(mine, other.numpy())


def test_draft_vocab_larger_than_the_target_is_an_error(tmp_path, run):
    with pytest.raises(
        SystemExit,
        match=r"vocab.draft_vocab_size \(64\) is larger than the target vocabulary \(50\)",
    ):
        run({1: 1}, 64, 50)
    assert not (tmp_path / "vocab").exists()


def test_frequencies_of_another_vocabulary_are_an_error(run):
    with pytest.raises(SystemExit, match="outside the target vocabulary"):
        run({1: 1, 70: 2}, 4, 50)


def test_a_draft_vocabulary_that_covers_too_little_fails_naming_its_size(tmp_path, random_target):
    """Issue 24: 256 draft tokens of a 160k vocabulary cover a fraction of real text, and nothing
    refused it. Below vocab.min_coverage the stage fails after writing its report, naming
    vocab.draft_vocab_size and the size that reaches the threshold; 0 turns the check off."""
    card = dataclasses.replace(random_target, vocab_size=200)
    freq = {t: 1 for t in range(150)} | {0: 51}  # a long flat tail: 10 tokens cover 60 of 200
    with pytest.raises(SystemExit) as failed:
        run_stage(tmp_path, card, freq, 10)
    message = str(failed.value)
    assert "vocab.draft_vocab_size" in message and "vocab.min_coverage 0.9" in message
    assert "30.0%" in message and "the 130 most frequent tokens reach 90%" in message
    report = json.loads((tmp_path / "vocab.json").read_text())
    assert report["check"] == {
        "param": "vocab.min_coverage",
        "coverage": 0.3,
        "threshold": 0.9,
        "verdict": "fail",
        "size_for_threshold": 130,
    }

    report = run_stage(tmp_path, card, freq, 10, min_coverage=0)  # the override
    assert report["check"]["verdict"] == "pass" and report["coverage"] == 0.3
    # the threshold decides whether the stage passes, not what it writes
    meta = json.loads((tmp_path / "vocab" / "meta.json").read_text())
    assert meta["params"] == {"draft_vocab_size": 10}
    report = run_stage(tmp_path, card, freq, 130)
    assert report["check"]["verdict"] == "pass" and report["coverage"] >= 0.9


def test_size_for_coverage():
    from draftline.tokens.vocab import size_for_coverage

    freq = {5: 50, 6: 30, 7: 15, 8: 5}
    assert [size_for_coverage(freq, s) for s in (0.5, 0.8, 0.81, 0.95, 1.0)] == [1, 2, 3, 3, 4]
