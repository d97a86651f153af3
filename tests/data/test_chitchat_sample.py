"""The bundled real-chat sample (datasets/samples/chitchat.jsonl) and its generator
(scripts/make_chitchat_sample.py): varied enough for a held-out split, every row usable by prepare,
and the generator deterministic, here on a small synthetic dataset.json (no package needed)."""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

from draftline.data.formats import content_hash, prepare_records
from draftline.data.holdout import twin_keys
from draftline.data.sources import read_rows

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "datasets/samples/chitchat.jsonl"
SCRIPT = ROOT / "scripts/make_chitchat_sample.py"


def test_bundled_sample_is_varied_and_prepare_keeps_every_row():
    lines = SAMPLE.read_text().splitlines()
    assert len(lines) == len(set(lines)) == 600
    assert SAMPLE.stat().st_size < 300_000  # a committed file: small
    records, stats = prepare_records(read_rows(str(SAMPLE)), "chitchat_sample", "sharegpt")
    assert stats["rows_kept"] == 600 and stats["dropped"] == {}, stats
    # no two rows alike, and no two first turns alike under mix's own hold-out keys
    assert len({content_hash(r["messages"], r["tools"]) for r in records}) == 600
    keys = [twin_keys(r["messages"], r["tools"]) for r in records]
    assert len({k["exact"] for k in keys}) >= 500 and len({k["template"] for k in keys}) >= 500
    for row in map(json.loads, lines):
        turns = row["conversations"]
        # whole exchanges from the first substantive turn, at most two
        assert [t["from"] for t in turns] in (["human", "gpt"], ["human", "gpt"] * 2), row["id"]
        assert len(turns[0]["value"].split()) >= 4 and all(t["value"].strip() for t in turns)
        assert row["id"].startswith("chitchat-")


def test_bundled_eval_set_has_no_twin_in_the_sample():
    """chitchat_eval.jsonl (the default run's eval set): the rule's next 40 chats, none a twin or a
    near-twin (the mix's own keys and threshold) of a chat in the sample."""
    from draftline.data.config import MixConfig
    from draftline.data.holdout import NearTwinIndex

    sample, _ = prepare_records(read_rows(str(SAMPLE)), "chitchat_sample", "sharegpt")
    more, stats = prepare_records(
        read_rows(str(SAMPLE.with_name("chitchat_eval.jsonl"))), "chitchat_more", "sharegpt"
    )
    assert stats["rows_kept"] == 40 and not {r["id"] for r in more} & {r["id"] for r in sample}
    keys = {k for r in sample for k in twin_keys(r["messages"], r["tools"]).values()}
    assert not [r["id"] for r in more if set(twin_keys(r["messages"], r["tools"]).values()) & keys]
    threshold = MixConfig.model_fields["near_twin_jaccard"].default
    index = NearTwinIndex({r["id"]: r["messages"] for r in more}, threshold)
    assert [index.near(r["messages"]) for r in sample] == [[]] * len(sample)


def conversation(a: str, b: str, *texts: str) -> dict:
    """A chitchat-dataset conversation: the speakers alternate from `a`; a text with newlines is
    several lines of one turn."""
    return {
        "messages": [
            [
                {"text": line, "sender": (a, b)[i % 2], "timestamp": "2018-04-20T01:57:41"}
                for line in text.split("\n")
            ]
            for i, text in enumerate(texts)
        ]
    }


SYNTHETIC = {  # in the seeded order (sha256 of "0:<id>"): c4, c3, c6, c5, c2, c1
    "c6": conversation(
        "p",
        "q",
        "hello?",
        "Hiii! How are you?",
        "I spent the whole weekend hiking near the lake with my sister",
        "That sounds lovely\nwas the weather good?",
        "It rained on Sunday but we stayed dry in the cabin",
        "Nice, I love cabins",
        "We also saw a moose",
        "No way!",
    ),
    # the same opening in other case and punctuation: a near duplicate of c6
    "c5": conversation(
        "r", "s", "hey", "I spent the whole weekend hiking near the lake with my SISTER!!", "fun"
    ),
    "c4": conversation("t", "u", "What would you do with a superpower like flying?", "x" * 300),
    "c3": conversation("v", "w", "hi is anyone there?", "hello", "how are you doing today?"),
    "c2": conversation(
        "x", "y", "Good morning", "My favourite book is about a robot who learns to paint", "Why?"
    ),
    "c1": conversation("z", "o", "Which city would you move to if money were no object at all?"),
}


def generate(
    tmp_path: Path, dataset: dict, name: str, rows: int = 2
) -> subprocess.CompletedProcess:
    source = tmp_path / f"{name}.json"
    source.write_text(json.dumps(dataset))
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(source), str(tmp_path / name), str(rows), "0"],
        capture_output=True,
        text=True,
    )


def test_generator_keeps_the_rule_and_is_deterministic(tmp_path):
    assert generate(tmp_path, SYNTHETIC, "a").returncode == 0
    # the same dataset with its conversations in the other order: the seeded order decides
    reordered = dict(reversed(list(SYNTHETIC.items())))
    assert generate(tmp_path, reordered, "b").returncode == 0
    written = (tmp_path / "a/chitchat.jsonl").read_text()
    assert written == (tmp_path / "b/chitchat.jsonl").read_text()
    rows = {row["id"]: row["conversations"] for row in map(json.loads, written.splitlines())}
    # c4's one reply is too long, c3 only greets, c5 is c6's near twin, c1 has no reply: of the
    # two rows, c6 and c2, the greetings are cut and c6 stops after two exchanges
    assert rows == {
        "chitchat-c6": [
            {
                "from": "human",
                "value": "I spent the whole weekend hiking near the lake with my sister",
            },
            {"from": "gpt", "value": "That sounds lovely\nwas the weather good?"},
            {"from": "human", "value": "It rained on Sunday but we stayed dry in the cabin"},
            {"from": "gpt", "value": "Nice, I love cabins"},
        ],
        "chitchat-c2": [
            {
                "from": "human",
                "value": "My favourite book is about a robot who learns to paint",
            },
            {"from": "gpt", "value": "Why?"},
        ],
    }
    assert not (tmp_path / "a/LICENSE-chitchat").exists()  # a bare dataset.json has no licence
    done = generate(tmp_path, SYNTHETIC, "c", rows=3)
    assert done.returncode != 0 and "only 2 conversations" in done.stderr


def test_generator_reads_the_wheel_and_copies_its_licence(tmp_path):
    wheel = tmp_path / "chitchat_dataset-0.9.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("chitchat_dataset/dataset.json", json.dumps(SYNTHETIC))
        zf.writestr("chitchat_dataset-0.9.0.dist-info/LICENSE", "MIT License\n\nCopyright ...\n")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(wheel), str(tmp_path / "out"), "2", "0"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out/LICENSE-chitchat").read_text() == "MIT License\n\nCopyright ...\n"
    assert len((tmp_path / "out/chitchat.jsonl").read_text().splitlines()) == 2


def test_the_licence_and_attribution_are_bundled():
    licence = (ROOT / "datasets/samples/LICENSE-chitchat").read_text()
    assert licence.startswith(
        "MIT License\n\nCopyright (c) 2019 Perception, Control and Cognition Lab"
    )
    readme = (ROOT / "datasets/samples/README.md").read_text()
    assert "chitchat-dataset" in readme and "LICENSE-chitchat" in readme
