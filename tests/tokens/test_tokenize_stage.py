"""Stage `tokenize` on a toy input: speculators' Arrow layout, rows by regenerate run then prompt order, frequencies of
trainable tokens only, the report, and conversations split where the template rewrites history."""

import contextlib
import copy
import json
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from draftline.core.card import TargetCard
from draftline.core.io import text_sha256
from draftline.targets.corpus import arithmetic, multi_turn, tool_call

TEMPLATES = Path(__file__).parents[1] / "fixtures" / "templates"


def write_inputs(
    root: Path,
    card: TargetCard,
    conversations: list[dict],
    max_length: int,
    regen_meta: dict | None = None,
    tokenize: dict | None = None,
) -> None:
    """The stage's inputs under root; `tokenize`: params.yaml tokenize keys besides max_length."""
    section = {"max_length": max_length, "assistant_ids": "retokenize", **(tokenize or {})}
    (root / "params.yaml").write_text(
        "samples: 10\ndatasets:\n  d: {path: d.jsonl, format: openai}\nmix:\n  weights: {d: 1.0}\n"
        f"tokenize: {json.dumps(section)}\n"
    )
    card.write(root / "card.json")
    (root / "regenerated").mkdir(exist_ok=True)
    with (
        open(root / "prompts.jsonl", "w") as p,
        open(root / "regenerated" / "conversations.jsonl", "w") as c,
    ):
        for row in conversations:
            p.write(json.dumps({"id": row["id"]}) + "\n")
        p.write(json.dumps({"id": "never-regenerated"}) + "\n")
        for row in reversed(conversations):  # finish order differs from prompt order
            c.write(json.dumps(row) + "\n")
        c.write('{"id": "cut-by-a-kill", "mess')  # the line a killed regeneration leaves
    if regen_meta is not None:
        (root / "regenerated" / "meta.json").write_text(json.dumps(regen_meta))


def run(root: Path) -> dict:
    from stages.tokenize import main

    with contextlib.chdir(root):
        main(
            "card.json",
            "prompts.jsonl",
            "regenerated/conversations.jsonl",
            "tokenized",
            "tokenize.json",
        )
    return json.loads((root / "tokenize.json").read_text())


def test_layout_order_frequencies_and_report(tmp_path, random_target):
    from datasets import load_from_disk

    rng = random.Random(4)
    convs = [
        dict(id=f"c{k}", **make(rng))
        for k, make in enumerate([arithmetic, tool_call, multi_turn, arithmetic, tool_call])
    ]
    convs[3]["messages"][-1]["content"] = (
        "The answer is"  # cut by max_tokens: no end-of-turn to learn
    )
    for c in convs:
        c["regeneration"] = {"run": 1}
    convs[0]["regeneration"] = {"run": 2}  # filled by a later run of the stage
    convs[3]["regeneration"] = {"finish_reasons": ["length"], "run": 1}
    write_inputs(tmp_path, random_target, convs, 512)
    report = run(tmp_path)

    data = load_from_disk(str(tmp_path / "tokenized"))
    assert data.format["type"] == "torch"
    # by run, then prompt order: the finish order within a run (reversed here) does not matter
    assert data.with_format(None)["id"] == ["c1", "c2", "c3", "c4", "c0"]
    assert data.with_format(None)["part"] == [0] * len(convs)
    row = data[0]
    assert row["input_ids"].dtype == torch.int64 and row["loss_mask"].dtype == torch.int64
    assert row["seq_len"].item() == len(row["input_ids"]) == len(row["loss_mask"])
    cut = data[2]  # convs[3]
    assert cut["input_ids"][cut["loss_mask"].bool()][-1].item() != random_target.eos_token_id
    assert (
        data[0]["input_ids"][data[0]["loss_mask"].bool()][-1].item() == random_target.eos_token_id
    )

    freq = torch.load(tmp_path / "tokenized" / "token_freq.pt", weights_only=True)
    expected = Counter()
    for r in data:
        expected.update(r["input_ids"][r["loss_mask"].bool()].tolist())
    assert freq == dict(expected)
    tokens = sum(len(r["input_ids"]) for r in data)
    assert report["tokens"] == tokens and report["trainable_tokens"] == sum(expected.values())
    assert report["trainable_fraction"] == round(sum(expected.values()) / tokens, 4)
    assert report["conversations"] == report["rows"] == 5 and report["truncated"] == 0
    assert report["missing_regenerations"] == 1 and report["unreadable_regenerated_lines"] == 1
    assert "<|im_end|>" in report["end_of_turn_tokens"] and report["rows_tokenized_whole"] == 0

    assert report["check"]["verdict"] == "pass" and report["check"]["truncated"] == 0
    # the threshold decides whether the stage passes, not what it writes
    meta = json.loads((tmp_path / "tokenized" / "meta.json").read_text())
    assert meta["params"] == {"max_length": 512, "assistant_ids": "retokenize"}

    # truncation to max_length: counted, rows cut, and rerunning replaces the old dataset whole
    # (past tokenize.max_truncated_share the stage fails: see the test below)
    write_inputs(tmp_path, random_target, convs, 24, tokenize={"max_truncated_share": 1.0})
    report = run(tmp_path)
    data = load_from_disk(str(tmp_path / "tokenized"))
    assert max(data.with_format(None)["seq_len"]) <= 24
    assert (
        report["truncated"] >= 1
        and report["truncated"] + report["skipped"]["no_trainable_tokens"] >= 3
    )
    assert (
        sum(torch.load(tmp_path / "tokenized" / "token_freq.pt", weights_only=True).values())
        == report["trainable_tokens"]
    )


def test_rows_cut_by_max_length_fail_the_stage_naming_it(tmp_path, random_target):
    """Issue 24: a 4k-token thinking answer at tokenize.max_length 512 was only counted as
    `truncated`, and the hidden-state disk check passed on the cut rows. Past
    tokenize.max_truncated_share the stage fails after writing its report, naming max_length and
    a length that would do; 1.0 turns the check off."""
    rng = random.Random(5)
    convs = [dict(id=f"c{k}", **arithmetic(rng)) for k in range(6)]
    from datasets import load_from_disk

    write_inputs(tmp_path, random_target, convs, 512)
    report = run(tmp_path)
    assert report["check"]["rows"] == 6 and report["check"]["truncated"] == 0
    longest = report["longest_row"]
    # one token short of the shortest row: every row is cut, and that one keeps trainable tokens
    cut_at = min(load_from_disk(str(tmp_path / "tokenized")).with_format(None)["seq_len"]) - 1

    write_inputs(tmp_path, random_target, convs, cut_at)
    with pytest.raises(SystemExit) as failed:
        run(tmp_path)
    message = str(failed.value)
    assert f"6 of 6 rows (100.0%) were longer than tokenize.max_length {cut_at}" in message
    assert "tokenize.max_truncated_share 0.05" in message and f"had {longest} tokens" in message
    report = json.loads((tmp_path / "tokenize.json").read_text())
    check = report["check"]
    assert (check["param"], check["rows"], check["truncated"], check["share"]) == (
        "tokenize.max_truncated_share",
        6,
        6,
        1.0,
    )
    assert check["verdict"] == "fail" and check["max_length_for_threshold"] == longest
    assert f"{longest} would cut at most 5% of these rows" in message

    write_inputs(
        tmp_path, random_target, convs, cut_at, tokenize={"max_truncated_share": 1.0}
    )  # the override
    assert run(tmp_path)["check"]["verdict"] == "pass"


def test_truncation_check_counts_rows_before_the_cut():
    from draftline.tokens.report import truncation_check

    lengths = [10] * 90 + [50] * 6 + [200] * 4
    check = truncation_check(lengths, 40, 0.05)
    assert (check["truncated"], check["share"], check["verdict"]) == (10, 0.1, "fail")
    assert check["longest_before_cut"] == 200 and check["max_length_for_threshold"] == 50
    assert truncation_check(lengths, 50, 0.05)["verdict"] == "pass"  # 4 rows cut: 4%
    assert truncation_check(lengths, 40, 0.1)["verdict"] == "pass"  # at the threshold
    assert truncation_check([], 40, 0.05)["verdict"] == "pass"


@pytest.fixture()
def qwen3_target(tmp_path, tiny_tokenizer, random_target):
    """The random target's weights with a Qwen3-style thinking template (a copy of its directory)."""
    import shutil

    path = tmp_path / "qwen3_target"
    shutil.copytree(random_target.model, path)
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = (TEMPLATES / "qwen3_thinking.jinja").read_text()
    tok.save_pretrained(path)
    return replace(
        random_target, model=str(path), chat_template_sha256=text_sha256(tok.chat_template)
    )


def test_template_that_drops_old_reasoning_splits_the_conversation(tmp_path, qwen3_target):
    from datasets import load_from_disk

    messages = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "reasoning_content": "2 + 3 = 5.", "content": "5."},
        {"role": "user", "content": "And times 4?"},
        {"role": "assistant", "reasoning_content": "5 * 4 = 20.", "content": "20."},
    ]
    simple = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    write_inputs(
        tmp_path,
        qwen3_target,
        [{"id": "a", "messages": messages}, {"id": "b", "messages": simple}],
        512,
    )
    report = run(tmp_path)
    data = load_from_disk(str(tmp_path / "tokenized")).with_format(None)
    assert data["id"] == ["a", "a", "b"] and data["part"] == [
        0,
        1,
        0,
    ]  # prompt order within one run
    assert (
        report["rows"] == 3 and report["conversations"] == 2 and report["split_conversations"] == 1
    )
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(qwen3_target.model)

    def masked(k):
        return tok.decode([t for t, m in zip(data["input_ids"][k], data["loss_mask"][k]) if m])

    assert masked(0) == "<think>\n2 + 3 = 5.\n</think>\n\n5.<|im_end|>"
    assert masked(1) == "<think>\n5 * 4 = 20.\n</think>\n\n20.<|im_end|>"
    assert (
        masked(2) == "<think>\n\n</think>\n\nHello.<|im_end|>"
    )  # thinking on: the model wrote the empty block

    # regenerated with enable_thinking=false (recorded in its meta.json): the server pre-filled
    # the empty think block, so it is context
    write_inputs(
        tmp_path,
        qwen3_target,
        [{"id": "b", "messages": simple}],
        512,
        regen_meta={"params": {"chat_template_kwargs": {"enable_thinking": False}}},
    )
    run(tmp_path)
    data = load_from_disk(str(tmp_path / "tokenized")).with_format(None)
    assert masked(0) == "Hello.<|im_end|>"
    assert tok.decode(data["input_ids"][0]).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\nHello.<|im_end|>"
    )
    tok_meta = json.loads((tmp_path / "tokenized" / "meta.json").read_text())
    assert tok_meta["chat_template_kwargs"] == {"enable_thinking": False}


def split_a_token(tok, ids: list[int]) -> tuple[int, list[int]]:
    """(k, ids with ids[k] written as two tokens of the same text)."""
    vocab = tok.get_vocab()
    for k, t in enumerate(ids):
        piece = tok.convert_ids_to_tokens(t)
        if len(piece) > 1 and piece[:1] in vocab and piece[1:] in vocab:
            return k, ids[:k] + [vocab[piece[:1]], vocab[piece[1:]]] + ids[k + 1 :]
    raise AssertionError("no token to split")


def test_server_token_ids_are_checked_per_source_and_can_be_used_verbatim(tmp_path, random_target):
    """Lines as regenerate writes them: each turn's token ids and usage from the server. Seeded
    drift (a token written as two, a count off by one, a line from before ids were recorded) is
    counted per dataset source; assistant_ids: server trains on the server's ids."""
    from transformers import AutoTokenizer

    from datasets import load_from_disk
    from draftline.tokens.chat import tokenize_conversation, trained_runs

    tok = AutoTokenizer.from_pretrained(random_target.model)
    rng = random.Random(4)
    sources = [
        ("math", arithmetic),
        ("tools", tool_call),
        ("chat", multi_turn),
        ("math", arithmetic),
    ]
    convs = [dict(id=f"c{k}", source=src, **make(rng)) for k, (src, make) in enumerate(sources)]
    for c in convs:
        (row,) = tokenize_conversation(tok, c["messages"], c["tools"], 4096)
        ids = trained_runs(row["input_ids"], row["loss_mask"])  # what the target generated
        c["regeneration"] = {
            "run": 1,
            "finish_reasons": ["stop"] * len(ids),
            "completion_token_ids": ids,
            "turn_completion_tokens": [len(t) for t in ids],
        }
    k, drifted = split_a_token(tok, convs[1]["regeneration"]["completion_token_ids"][0])
    convs[1]["regeneration"]["completion_token_ids"][0] = drifted
    convs[1]["regeneration"]["turn_completion_tokens"][0] = len(drifted)
    convs[3]["regeneration"]["turn_completion_tokens"][0] += 1
    chat_turns = len(convs[2]["regeneration"].pop("completion_token_ids"))
    del convs[2]["regeneration"]["turn_completion_tokens"]  # a line from before ids were kept
    tool_turns = len(convs[1]["regeneration"]["completion_token_ids"])

    write_inputs(tmp_path, random_target, convs, 512)
    report = run(tmp_path)["server_token_ids"]
    retokenized = load_from_disk(str(tmp_path / "tokenized")).with_format(None)

    def counts(turns, **nonzero):
        zero = dict.fromkeys(
            [
                "no_server_ids",
                "server_ids",
                "retokenized_equal_server_ids",
                "retokenized_differ_from_server_ids",
                "server_ids_without_end_of_turn",
                "prefilled",
                "spliced",
                "with_usage",
                "retokenized_count_differs_from_usage",
                "server_ids_count_differs_from_usage",
            ],
            0,
        )
        return {"assistant_turns": turns, **zero, **nonzero}

    assert report["by_source"] == {
        "chat": counts(chat_turns, no_server_ids=chat_turns),
        "math": counts(
            2,
            server_ids=2,
            retokenized_equal_server_ids=2,
            with_usage=2,
            retokenized_count_differs_from_usage=1,
            server_ids_count_differs_from_usage=1,
        ),
        "tools": counts(
            tool_turns,
            server_ids=tool_turns,
            retokenized_equal_server_ids=tool_turns - 1,
            retokenized_differ_from_server_ids=1,
            with_usage=tool_turns,
            retokenized_count_differs_from_usage=1,
        ),
    }
    assert (
        report["assistant_ids"] == "retokenize"
        and report["assistant_turns"] == 4 + tool_turns + chat_turns - 2
    )
    assert report["retokenized_differ_from_server_ids"] == 1
    (shown,) = report["first_differences"]
    assert (shown["id"], shown["first_difference"]) == ("c1", k)

    write_inputs(tmp_path, random_target, convs, 512, tokenize={"assistant_ids": "server"})
    report = run(tmp_path)["server_token_ids"]
    verbatim = load_from_disk(str(tmp_path / "tokenized")).with_format(None)
    assert report["spliced"] == report["server_ids"] == 4 + tool_turns - 2
    assert verbatim["id"] == retokenized["id"] == ["c0", "c1", "c2", "c3"]
    for i in (0, 2, 3):  # equal ids, or none recorded: the same row
        assert verbatim[i]["input_ids"] == retokenized[i]["input_ids"]
        assert verbatim[i]["loss_mask"] == retokenized[i]["loss_mask"]
    row = verbatim[1]
    trained = trained_runs(row["input_ids"], row["loss_mask"])
    assert trained == convs[1]["regeneration"]["completion_token_ids"]
    assert trained[0] == drifted and row["input_ids"] != retokenized[1]["input_ids"]
    assert tok.decode(row["input_ids"]) == tok.decode(retokenized[1]["input_ids"])
    assert row["seq_len"] == len(row["input_ids"]) == len(retokenized[1]["input_ids"]) + 1


def write_run(
    root: Path,
    card: TargetCard,
    prompts: list[str],
    lines: list[dict],
    max_length=512,
    verify_sample: int | None = None,
):
    """params.yaml, card, train prompts and the regenerated file with `lines` in file order;
    `verify_sample`: params.yaml resume.verify_sample (absent: the default)."""
    resume = "" if verify_sample is None else f"resume: {{verify_sample: {verify_sample}}}\n"
    (root / "params.yaml").write_text(
        "samples: 10\ndatasets:\n  d: {path: d.jsonl, format: openai}\nmix:\n  weights: {d: 1.0}\n"
        f"tokenize: {{max_length: {max_length}}}\n" + resume
    )
    card.write(root / "card.json")
    (root / "regenerated").mkdir(exist_ok=True)
    (root / "prompts.jsonl").write_text("".join(json.dumps({"id": p}) + "\n" for p in prompts))
    (root / "regenerated" / "conversations.jsonl").write_text(
        "".join(json.dumps(line) + "\n" for line in lines)
    )


def dataset_files(root: Path) -> dict:
    """What a from-scratch run and an incremental one must agree on: every row, the frequencies
    file byte for byte, the index, the dataset fingerprint and the report but its `incremental`
    and `spot_check` (what a rerun kept, and how many of those it checked)."""
    from datasets import load_from_disk

    out = root / "tokenized"
    meta = json.loads((out / "meta.json").read_text())
    report = json.loads((root / "tokenize.json").read_text())
    report.pop("incremental")
    report.pop("spot_check")
    return {
        "rows": load_from_disk(str(out)).with_format(None).to_dict(),
        "token_freq": (out / "token_freq.pt").read_bytes(),
        "index": (out / meta["index"]).read_bytes(),
        "fingerprint": json.loads((out / "state.json").read_text())["_fingerprint"],
        "report": report,
    }


def test_a_rerun_tokenizes_only_new_or_changed_conversations(tmp_path, random_target, monkeypatch):
    """The output persists (dvc.yaml: persist): growing `samples` keeps every shard and tokenizes
    only the new conversations; a conversation regenerated again moves to the end, the rows after
    its old place are copied, not tokenized; each time the output equals a from-scratch run's.
    Another tokenize param tokenizes everything again."""
    import shutil

    from speculators.train.vocab_mapping import save_token_frequency_distribution

    from datasets import load_from_disk
    from draftline.tokens import tokenize as tokenization

    monkeypatch.setattr(tokenization, "SHARD_CONVERSATIONS", 8)
    monkeypatch.setattr(tokenization, "BATCH_CONVERSATIONS", 3)
    rng = random.Random(9)
    makers = [arithmetic, tool_call, multi_turn]
    convs = [
        {"id": f"c{k}", "source": f"s{k % 2}", **makers[k % 3](rng), "regeneration": {"run": 1}}
        for k in range(30)
    ]
    ids = [c["id"] for c in convs]
    root, scratch = tmp_path / "run", tmp_path / "scratch"
    root.mkdir()

    def from_scratch(prompts, lines, **kw):
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        write_run(scratch, random_target, prompts, lines, **kw)
        assert run(scratch)["incremental"]["all_tokenized_because"] == "no previous output"
        return dataset_files(scratch)

    write_run(root, random_target, ids[:20], convs[:20])
    first = run(root)["incremental"]
    assert first["conversations_tokenized"] == 20 and first["shards_written"] == 3  # 8 + 8 + 4
    shards = sorted((root / "tokenized").glob("*.arrow"))
    stamps = {p.name: p.stat().st_mtime_ns for p in shards}

    grown = [*convs[:20], *({**c, "regeneration": {"run": 2}} for c in convs[20:])]
    write_run(root, random_target, ids, grown)
    report = run(root)["incremental"]
    assert report["conversations_kept"] == 20 and report["shards_kept"] == 3
    assert report["conversations_tokenized"] == 10 and report["conversations_copied"] == 0
    assert report["rows_copied"] == 0 and report["rows_tokenized"] == 10  # one row each
    assert {p.name: p.stat().st_mtime_ns for p in shards} == stamps  # left untouched
    assert dataset_files(root) == from_scratch(ids, grown)
    rows = load_from_disk(str(root / "tokenized")).with_format(None)
    assert rows["id"] == ids  # appended in run order: hs_{i} stays row i

    # speculators' own count over the rows writes the same file, byte for byte
    theirs = tmp_path / "speculators" / "token_freq.pt"
    save_token_frequency_distribution(load_from_disk(str(root / "tokenized")), theirs)
    assert theirs.read_bytes() == (root / "tokenized" / "token_freq.pt").read_bytes()

    # c5 regenerated again (superseded, a new line in run 3): it moves to the end
    again = {**convs[5], "regeneration": {"run": 3}}
    again["messages"] = copy.deepcopy(again["messages"])
    again["messages"][-1]["content"] += " Again."
    changed = [line for line in grown if line["id"] != "c5"] + [again]
    write_run(root, random_target, ids, changed)
    report = run(root)["incremental"]
    assert report["conversations_tokenized"] == 1 and report["rows_tokenized"] == 1
    assert report["conversations_copied"] == 29 and report["rows_copied"] == 29
    assert report["shards_kept"] == 0  # c5 sat in the first shard: all rows after it shift
    assert dataset_files(root) == from_scratch(ids, changed)
    assert load_from_disk(str(root / "tokenized")).with_format(None)["id"][-1] == "c5"

    # a tokenize param shapes every row: all of them again
    write_run(root, random_target, ids, changed, max_length=400)
    report = run(root)["incremental"]
    assert report["conversations_tokenized"] == 30 and "params" in report["all_tokenized_because"]
    assert dataset_files(root) == from_scratch(ids, changed, max_length=400)


def test_rows_survive_a_bookkeeping_edit_and_are_redone_when_the_code_that_shapes_them_changes(
    tmp_path, random_target, monkeypatch
):
    """The rows' key holds the code of SHAPES["tokenize"] (draftline/core/shaping.py), read here
    from a copy of the source tree: an edit to tokenize.py (a progress label) keeps every row; an
    edit to chat.py's code tokenizes them all again, and the report says why."""
    from draftline.core import derivation
    from draftline.core.derivation import UNRECORDED
    from draftline.core.shaping import CODE_CHANGED, shaping_fingerprint
    from draftline.tokens.output import short_sha
    from tests.core.test_shaping import copy_code, edit

    code = copy_code(tmp_path / "code")
    monkeypatch.setattr(derivation, "shaping_fingerprint", lambda n: shaping_fingerprint(n, code))
    rng = random.Random(5)
    convs = [{"id": f"c{k}", **arithmetic(rng), "regeneration": {"run": 1}} for k in range(6)]
    root = tmp_path / "run"
    root.mkdir()
    write_run(root, random_target, [c["id"] for c in convs], convs)
    assert run(root)["incremental"]["conversations_tokenized"] == 6
    made = dataset_files(root)

    edit(code, "draftline/tokens/tokenize.py", 'add_task("tokenize"', 'add_task("tokenizing"')
    kept = run(root)["incremental"]
    assert kept["conversations_kept"] == 6 and kept["conversations_tokenized"] == 0

    edit(code, "draftline/tokens/chat.py", "JOIN_WINDOW = 16", "JOIN_WINDOW = 24")
    again = run(root)["incremental"]
    assert again["all_tokenized_because"] == CODE_CHANGED
    assert again["conversations_tokenized"] == 6 and again["conversations_kept"] == 0
    assert dataset_files(root) == made  # the copy's edit runs nowhere: the same rows again

    # an output made before keys were derived (draftline/core/derivation.py): a flat key that
    # held chat.py's code and a hand-bumped ROW_FORMAT; what made it is not recorded as parts
    meta = json.loads((root / "tokenized" / "meta.json").read_text())
    meta["key"] = {"row_format": 1, "chat_code_sha256": "0" * 64, "params": {}}
    meta["key_sha256"] = short_sha(meta["key"])
    (root / "tokenized" / "meta.json").write_text(json.dumps(meta))
    assert run(root)["incremental"]["all_tokenized_because"] == UNRECORDED
    assert dataset_files(root) == made


def test_a_token_id_outside_the_target_vocabulary_fails_naming_the_conversation(
    tmp_path, random_target
):
    rng = random.Random(2)
    convs = [dict(id=f"c{k}", **arithmetic(rng)) for k in range(3)]
    write_inputs(tmp_path, replace(random_target, vocab_size=40), convs, 512)
    with pytest.raises(SystemExit, match=r"conversation c0: token id \d+ is outside the target"):
        run(tmp_path)
    assert not (tmp_path / "tokenized" / "meta.json").exists()  # nothing committed


def test_a_damaged_previous_output_is_tokenized_again_and_strays_removed(
    tmp_path, random_target, monkeypatch
):
    """A killed run's partial files go; a shard missing or cut short makes the rerun tokenize
    everything again rather than trust the rest (meta.json names every file at its size)."""
    from draftline.tokens import tokenize as tokenization

    monkeypatch.setattr(tokenization, "SHARD_CONVERSATIONS", 4)
    rng = random.Random(3)
    convs = [{"id": f"c{k}", **arithmetic(rng), "regeneration": {"run": 1}} for k in range(10)]
    ids = [c["id"] for c in convs]
    write_run(tmp_path, random_target, ids, convs)
    run(tmp_path)
    before = dataset_files(tmp_path)
    out = tmp_path / "tokenized"
    (out / ".shard-00007.arrow.tmp").write_bytes(b"partial")  # what a kill leaves
    (out / "data-00099-000000000000.arrow").write_bytes(b"not named by meta.json")
    again = run(tmp_path)["incremental"]
    assert again["conversations_kept"] == 10 and again["conversations_tokenized"] == 0
    assert not (out / ".shard-00007.arrow.tmp").exists()
    assert not (out / "data-00099-000000000000.arrow").exists()
    assert dataset_files(tmp_path) == before

    shard = sorted(out.glob("data-*.arrow"))[1]
    shard.write_bytes(shard.read_bytes()[:-8])
    again = run(tmp_path)["incremental"]
    assert again["all_tokenized_because"] == f"previous output incomplete ({shard.name})"
    assert again["conversations_tokenized"] == 10 and dataset_files(tmp_path) == before


def output_files(out: Path) -> dict:
    """Every file of the output by name: its bytes and modification time."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(out.iterdir())}


def test_kept_rows_are_tokenized_again_before_they_are_trusted(
    tmp_path, random_target, monkeypatch
):
    """resume.verify_sample of the conversations a rerun keeps (in kept shards and copied alike)
    are tokenized again and must give their kept rows. Rows as made pass, and the report says so
    the same way on every rerun; a token id edited in a kept shard (its size and meta.json as
    they were: the key matches) stops the stage naming the conversation, the position, both ids
    and the choices, with nothing written; verify_sample 0 keeps the rows unchecked and says so."""
    import struct

    from datasets import load_from_disk
    from draftline.tokens import tokenize as tokenization

    monkeypatch.setattr(tokenization, "SHARD_CONVERSATIONS", 4)
    rng = random.Random(6)
    convs = [{"id": f"c{k}", **arithmetic(rng), "regeneration": {"run": 1}} for k in range(6)]
    ids = [c["id"] for c in convs]
    write_run(tmp_path, random_target, ids, convs, verify_sample=10)
    first = run(tmp_path)["spot_check"]
    assert first == {
        "sample": 10,
        "checked": 0,
        "rows": 0,
        "not_run": "no rows kept from a previous output",
    }

    # c5 regenerated again: c0-c3 stay in their shard, c4 is copied, c5 tokenized
    changed = copy.deepcopy(convs)
    changed[5]["messages"][-1]["content"] += " Again."
    write_run(tmp_path, random_target, ids, changed, verify_sample=10)
    report = run(tmp_path)
    assert report["incremental"]["conversations_kept"] == 4
    assert report["incremental"]["conversations_copied"] == 1
    assert report["spot_check"] == {"sample": 10, "checked": 5, "rows": 5, "not_run": None}
    write_run(tmp_path, random_target, ids, changed, verify_sample=3)
    assert run(tmp_path)["spot_check"]["checked"] == 3
    again = (tmp_path / "tokenize.json").read_bytes()
    assert run(tmp_path)["spot_check"]["checked"] == 3
    assert (tmp_path / "tokenize.json").read_bytes() == again  # the same sample, the same report

    # one stored token id of c1 edited in place in the first (kept) shard
    out = tmp_path / "tokenized"
    row = load_from_disk(str(out)).with_format(None)[1]
    assert row["id"] == "c1"
    k = len(row["input_ids"]) // 2
    made, edited = row["input_ids"][k], (row["input_ids"][k] + 1) % random_target.vocab_size
    (shard,) = [s["file"] for s in json.loads((out / "meta.json").read_text())["shards"][:1]]
    data = (out / shard).read_bytes()
    stored = struct.pack(f"<{len(row['input_ids'])}q", *row["input_ids"])  # the row's ids
    assert data.count(stored) == 1
    ids_now = [*row["input_ids"][:k], edited, *row["input_ids"][k + 1 :]]
    (out / shard).write_bytes(data.replace(stored, struct.pack(f"<{len(ids_now)}q", *ids_now)))
    write_run(tmp_path, random_target, ids, changed, verify_sample=10)
    before, report_before = output_files(out), (tmp_path / "tokenize.json").stat().st_mtime_ns
    with pytest.raises(SystemExit) as failed:
        run(tmp_path)
    message = str(failed.value)
    assert "spot-check of kept tokenized rows failed: conversation c1: row 0 input_ids" in message
    assert f"first differs at position {k}: kept {edited} (" in message
    assert f"now {made} (" in message
    assert "Nothing was written" in message and "move tokenized aside" in message
    assert "resume.verify_sample: 0" in message
    assert output_files(out) == before
    assert (tmp_path / "tokenize.json").stat().st_mtime_ns == report_before

    # the user's other choice: keep the rows as they are, unchecked
    write_run(tmp_path, random_target, ids, changed, verify_sample=0)
    report = run(tmp_path)
    assert report["spot_check"]["not_run"] == "resume.verify_sample is 0"
    assert report["spot_check"]["checked"] == 0 and report["incremental"]["conversations_kept"] == 6
    assert load_from_disk(str(out)).with_format(None)[1]["input_ids"][k] == edited


def test_a_rows_difference_names_the_row_field_and_position():
    from draftline.tokens.previous import rows_difference

    class Tokens:
        def convert_ids_to_tokens(self, i):
            return f"t{i}"

    row = {"id": "a", "part": 0, "input_ids": [5, 6, 7], "loss_mask": [0, 1, 1], "seq_len": 3}
    tok = Tokens()
    assert rows_difference([row], [dict(row)], tok) is None
    assert rows_difference([row], [], tok) == "it gives 0 rows now, 1 kept"
    mask = {**row, "loss_mask": [0, 0, 1]}
    assert (
        rows_difference([row], [mask], tok)
        == "row 0 loss_mask first differs at position 1: kept 1, now 0"
    )
    longer = {**row, "input_ids": [5, 6, 7, 8], "seq_len": 4}
    assert rows_difference([row], [longer], tok) == (
        "row 0 input_ids first differs at position 3: kept the row's end (3 tokens), now 8 ('t8')"
    )
