"""Eval sets and drafts side by side (draftline/evaluate/compare.py) through the evaluate stage: a
two-turn set asked turn by turn, the draft fine-tuning started from and a listed draft measured on
the same prompts, and a draft that does not fit the target refused before anything runs."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from draftline.core.io import read_json, read_jsonl, write_json, write_jsonl
from draftline.evaluate.compare import HELD_OUT, INIT, TRAINED, turn_prompts

ROOT = Path(__file__).resolve().parents[2]


def stage_workspace(tmp_path, trained_draft, **evaluate) -> Path:
    """A workspace for stages.evaluate: the repository's params with a two-turn eval set `chat2`
    (the trained draft's prompts, then a follow-up), the held-out split of three prompts."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["datasets"]["chat2"] = {"path": "chat2.jsonl", "format": "prompt"}
    raw["evaluate"].update(
        engine="hf", k=2, max_new_tokens=8, prompts=3, device="cpu", sets=["chat2"], **evaluate
    )
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    trained_draft.card.write(tmp_path / "card.json")
    split = [
        {"id": f"e{i}", "source": "chat", **c} for i, c in enumerate(trained_draft.conversations)
    ]
    write_jsonl(tmp_path / "eval.jsonl", split)
    write_json(tmp_path / "meta.json", {"stage": "mix", "counts": {"train": 10, "eval": 4}})
    users = [
        next(m["content"] for m in c["messages"] if m["role"] == "user")
        for c in trained_draft.conversations
    ]
    write_jsonl(
        tmp_path / "sets/chat2.jsonl",
        [
            {
                "id": f"t{i}",
                "source": "chat2",
                "tools": None,
                "messages": [
                    {"role": "user", "content": text},
                    {"role": "assistant", "content": ""},
                    {"role": "user", "content": "And again, shorter."},
                    {"role": "assistant", "content": ""},
                ],
            }
            for i, text in enumerate(users[:2])
        ],
    )
    return tmp_path


def run_evaluate(workspace: Path, draft: Path) -> subprocess.CompletedProcess:
    args = ["card.json", str(draft), "eval.jsonl", "acc.json", "plots"]
    return subprocess.run(
        [sys.executable, "-m", "stages.evaluate", *args],
        cwd=workspace,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_sets_and_drafts_side_by_side(tmp_path, trained_draft, eagle3_draft_dir):
    """train.init (a copy of the trained draft: its gain is 0) and a listed draft beside the
    trained one, on the split and on a set whose second turn follows the target's own answer."""
    start = tmp_path / "start"
    shutil.copytree(trained_draft.dir, start)
    ws = stage_workspace(tmp_path / "ws", trained_draft, compare={"other": str(eagle3_draft_dir)})
    raw = yaml.safe_load((ws / "params.yaml").read_text())
    raw["train"]["init"] = str(start)
    (ws / "params.yaml").write_text(yaml.safe_dump(raw))
    # a split row with a later turn: the headline asks its first turn, and so does every draft
    split = list(read_jsonl(ws / "eval.jsonl"))
    later = [{"role": "user", "content": "And again."}, {"role": "assistant", "content": ""}]
    split[0]["messages"] = [*split[0]["messages"], *later]
    write_jsonl(ws / "eval.jsonl", split)
    proc = run_evaluate(ws, trained_draft.dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = read_json(ws / "acc.detail.json")
    sets = report["sets"]
    assert sets["engine"] == "builtin" and list(sets["results"]) == [HELD_OUT, "chat2"]
    for row in sets["results"].values():
        assert list(row) == [TRAINED, INIT, "other"]
    held, chat2 = sets["results"][HELD_OUT], sets["results"]["chat2"]
    # the trained draft on the split is the headline's own measurement
    assert held[TRAINED]["acceptance_length"] == report["acceptance_length"]
    assert held[TRAINED]["tau_sim"] == report["tau_sim"]
    # the draft it started from is the same weights here: the same figures, a gain of 0; the
    # speculation with no draft is replayed once per set, beside the trained draft
    free = {name: row[TRAINED].pop("free") for name, row in sets["results"].items()}
    assert held[INIT] == {**held[TRAINED], "lossless_checked_prompts": 3}
    assert chat2[INIT] == chat2[TRAINED] and sets["gain_over_init"] == {HELD_OUT: 0, "chat2": 0}
    assert free[HELD_OUT] == report["free"]
    ngram = free["chat2"]["ngram"]
    assert ngram["replayed"] and ngram["k"] == 2 and ngram["prompts"] == 4  # every turn
    assert 1.0 <= ngram["acceptance_length"] <= 3 and ngram["rounds"] >= 4
    assert list(free[HELD_OUT]["ngram"]["per_prompt"]) == ["e0", "e1", "e2"]
    # two rows of two turns each, every turn checked lossless
    assert chat2[TRAINED]["prompts"] == 2 and chat2[TRAINED]["turns"] == 4
    assert chat2[TRAINED]["lossless_checked_prompts"] == 4
    assert chat2[TRAINED]["acceptance_length"] > chat2["other"]["acceptance_length"] >= 1.0
    table = (ws / "plots/sets.md").read_text()
    assert "| set | prompts | trained | init | other | ngram (no draft) | gain over init |" in table
    assert f"| chat2 | 2 (4 turns) | {chat2[TRAINED]['acceptance_length']:.3f}" in table
    assert f"| {ngram['acceptance_length']:.3f} ({ngram['tokens_per_step']:.2f}) |" in table
    assert "at k = 2" in table
    # paired over prompts (draftline/evaluate/paired.py): init is the same weights, so its gain is
    # 0 on every prompt; a row asked turn by turn is one prompt, its turns pooled
    paired = sets["paired"]
    assert paired["draft"] == TRAINED and paired["confidence"] == 0.9
    assert list(held[TRAINED]["per_prompt"]) == ["e0", "e1", "e2"]
    assert list(chat2[TRAINED]["per_prompt"]) == ["t0", "t1"]
    for name in (HELD_OUT, "chat2"):
        same = paired["sets"][name]["drafts"][INIT]
        assert (same["gain"], same["low"], same["high"], same["decision"]) == (
            0,
            0,
            0,
            "cannot tell",
        )
        assert paired["sets"][name]["drafts"]["other"]["prompts"] == (3 if name == HELD_OUT else 2)
    assert "| chat2 | other | 2 |" in table and "paired over prompts" in table
    plot = read_json(ws / "plots/sets.json")
    assert {(p["set"], p["draft"]) for p in plot} == {
        (s, d) for s in (HELD_OUT, "chat2") for d in (TRAINED, INIT, "other")
    }
    # the headline stays the held-out split's
    assert read_json(ws / "acc.json")["acceptance_length"] == report["acceptance_length"]


def test_a_draft_that_does_not_fit_the_target_is_refused(tmp_path, trained_draft):
    wrong = tmp_path / "wrong"
    shutil.copytree(trained_draft.dir, wrong)
    config = json.loads((wrong / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = [0, 1, 2]
    (wrong / "config.json").write_text(json.dumps(config))
    ws = stage_workspace(tmp_path / "ws", trained_draft, compare={"public": str(wrong)})
    proc = run_evaluate(ws, trained_draft.dir)
    assert proc.returncode != 0
    assert "evaluate.compare public" in proc.stderr and "does not fit the target" in proc.stderr
    assert "aux layer ids" in proc.stderr and "[0, 1, 2]" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_later_turn_follows_the_targets_own_reply(trained_draft):
    """Turn 2's prompt: the first turn, the target's reply (decoded), the second user turn, through
    the chat template with the generation prompt."""
    from types import SimpleNamespace

    from draftline.targets.model import load_target
    from draftline.tokens.chat import chat_prompt_ids

    _, tokenizer = load_target(trained_draft.card)
    row = {
        "id": "r",
        "tools": None,
        "messages": [
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": "two"},
            {"role": "assistant", "content": ""},
        ],
    }
    reply = tokenizer("a reply", add_special_tokens=False)["input_ids"]
    ids = turn_prompts(SimpleNamespace(tokenizer=tokenizer), row, [reply])
    expected = [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": tokenizer.decode(reply, skip_special_tokens=True)},
        {"role": "user", "content": "two"},
    ]
    assert ids == chat_prompt_ids(tokenizer, expected, None, {})
