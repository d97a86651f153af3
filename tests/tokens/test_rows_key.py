"""The key the tokenized rows are kept under (draftline/tokens/tokenize.py rows_key), checked by
difference: two conversations tokenized under the defaults, then under one change at a time of what
the rows depend on (each tokenize param, the tokenizer's files, the chat template, the template
arguments regenerate recorded, the code that shapes the rows); wherever the stored bytes differ
from the default's, the key recorded in meta.json differs too. A tokenize param nobody classified
here fails test_every_tokenize_param_is_classified."""

import json
import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from draftline.targets.corpus import arithmetic, multi_turn
from draftline.targets.tiny import CHAT_TEMPLATE

# The tokenize params by how the rows' key treats them: a param added to TokenizeConfig without a
# line here (and a change in param_changes) fails test_every_tokenize_param_is_classified.
KEYED_PARAMS = {"max_length", "assistant_ids"}
NOT_KEYED = {"max_truncated_share": "decides whether the stage passes, not the rows"}


def param_changes(longest_row: int) -> dict[str, dict]:
    """One change of each tokenize param away from its default (`longest_row`: the default run's)."""
    return {
        "max_length": {"max_length": longest_row - 1},  # cuts the longest row's last token
        "assistant_ids": {"assistant_ids": "server"},  # c0's server ids write a token as two
        "max_truncated_share": {"max_truncated_share": 1.0},
    }


# The tiny template, made to read what real templates read besides the messages: a special token
# (Llama 3's starts with bos_token) and a template argument (Qwen3's enable_thinking).
TEMPLATE = (
    "{{- bos_token or '' -}}"
    "{%- if enable_thinking is defined and not enable_thinking -%}"
    "{{- '<|im_start|>system\\n/no_think<|im_end|>\\n' -}}"
    "{%- endif -%}" + CHAT_TEMPLATE
)


def test_every_tokenize_param_is_classified(random_target):
    from draftline.core.config import kind_of
    from draftline.targets.model import card_tokenizer
    from draftline.tokens.chat import end_of_turn_tokens
    from draftline.tokens.config import TokenizeConfig
    from draftline.tokens.tokenize import rows_key

    fields = set(TokenizeConfig.model_fields)
    assert fields == KEYED_PARAMS | set(NOT_KEYED), (
        "classify the new tokenize param here, in rows_key and in param_changes"
    )
    assert set(param_changes(100)) == fields
    assert all(kind_of(TokenizeConfig, f) == "shaping" for f in KEYED_PARAMS)
    tok = card_tokenizer(random_target)
    key = rows_key(random_target, tok, TokenizeConfig(), {}, end_of_turn_tokens(tok))
    assert set(key["parts"]["params"]) == KEYED_PARAMS


def split_a_token(tok, ids: list[int]) -> list[int]:
    """ids with one token written as two tokens of the same text (a server's other tokenization)."""
    vocab = tok.get_vocab()
    for k, t in enumerate(ids):
        piece = tok.convert_ids_to_tokens(t)
        if len(piece) > 1 and piece[:1] in vocab and piece[1:] in vocab:
            return ids[:k] + [vocab[piece[:1]], vocab[piece[1:]]] + ids[k + 1 :]
    raise AssertionError("no token to split")


def conversations(tok) -> list[dict]:
    """Two regenerated lines; c0 with the server's ids for its answer, one token of it split."""
    from draftline.tokens.chat import tokenize_conversation, trained_runs

    rng = random.Random(7)
    convs = [
        {"id": f"c{k}", **make(rng), "regeneration": {"run": 1}}
        for k, make in enumerate([arithmetic, multi_turn])
    ]
    (row,) = tokenize_conversation(tok, convs[0]["messages"], convs[0]["tools"], 4096)
    ids = trained_runs(row["input_ids"], row["loss_mask"])
    ids[0] = split_a_token(tok, ids[0])
    convs[0]["regeneration"].update(completion_token_ids=ids, finish_reasons=["stop"] * len(ids))
    return convs


def write_lines(root: Path, convs: list[dict], template_kwargs: dict | None = None) -> None:
    """prompts.jsonl, regenerated/conversations.jsonl and regenerate's meta.json under root."""
    (root / "regenerated").mkdir(parents=True)
    (root / "prompts.jsonl").write_text("".join(json.dumps({"id": c["id"]}) + "\n" for c in convs))
    (root / "regenerated" / "conversations.jsonl").write_text(
        "".join(json.dumps(c) + "\n" for c in convs)
    )
    if template_kwargs is not None:
        meta = {"params": {"chat_template_kwargs": template_kwargs}}
        (root / "regenerated" / "meta.json").write_text(json.dumps(meta))


def stored(out: Path) -> tuple[str, bytes]:
    """(the key meta.json records, every byte a rerun may keep: each shard's rows and frequencies,
    the index, token_freq.pt)."""
    meta = json.loads((out / "meta.json").read_text())
    files = [name for s in meta["shards"] for name in (s["file"], s["freq"])]
    files += [meta["index"], "token_freq.pt"]
    return meta["key_sha256"], b"".join((out / name).read_bytes() for name in files)


@pytest.fixture()
def keyed_target(tmp_path, random_target):
    """The random target's weights and tokenizer with TEMPLATE, in a directory of their own."""
    import shutil

    from transformers import AutoTokenizer

    from draftline.targets.model import build_card

    path = tmp_path / "target"
    shutil.copytree(random_target.model, path)
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(path)
    return build_card(str(path), "test", None, [1, 2, 3], {})


def test_wherever_the_stored_bytes_change_the_key_changes(tmp_path, keyed_target):
    """Each dependency of the rows changed alone: the tokenize params, the tokenizer's files (its
    merges dropped, a special token the template reads, split_special_tokens, the generation config's end
    of turn), the chat template (with its card made again, and without), the template arguments
    regenerate recorded. Wherever the kept bytes differ from the default run's, so does the key;
    the operational param changes neither."""
    import shutil

    from transformers import AutoTokenizer

    from draftline.targets.model import build_card
    from draftline.tokens.config import TokenizeConfig
    from draftline.tokens.tokenize import tokenize_dataset

    convs = conversations(AutoTokenizer.from_pretrained(keyed_target.model))

    def tokenize(name: str, card=keyed_target, template_kwargs=None, **params) -> tuple:
        root = tmp_path / name
        write_lines(root, convs, template_kwargs)
        args = str(root / "prompts.jsonl"), str(root / "regenerated" / "conversations.jsonl")
        report = tokenize_dataset(card, *args, str(root / "tokenized"), TokenizeConfig(**params))
        return (*stored(root / "tokenized"), report)

    def target(name: str, edit, card_again: bool = True):
        """A copy of the target directory with `edit` applied to it, and its card (made again,
        or the default's as a card left behind by an edit to the files)."""
        path = tmp_path / f"target-{name}"
        shutil.copytree(keyed_target.model, path)
        edit(path)
        if card_again:
            return build_card(str(path), "test", None, [1, 2, 3], {})
        return replace(keyed_target, model=str(path))

    def edit_json(name: str, change):
        def edit(path: Path) -> None:
            data = json.loads((path / name).read_text())
            change(data)
            (path / name).write_text(json.dumps(data))

        return edit

    def retemplate(path: Path) -> None:
        (path / "chat_template.jinja").write_text("{{- 'Chat:\\n' -}}" + TEMPLATE)

    base_key, base_bytes, base_report = tokenize("base")
    assert base_report["rows"] == 2
    tok = AutoTokenizer.from_pretrained(keyed_target.model)
    end_of_text = tok.convert_tokens_to_ids("<|endoftext|>")
    changes = {
        name: {"params": params}
        for name, params in param_changes(base_report["longest_row"]).items()
    }
    changes |= {
        "tokenizer merges": {
            "card": target(
                "merges", edit_json("tokenizer.json", lambda t: t["model"]["merges"].clear())
            )
        },
        "bos_token": {
            "card": target(
                "bos",
                edit_json("tokenizer_config.json", lambda c: c.update(bos_token="<|endoftext|>")),
            )
        },
        "split_special_tokens": {
            "card": target(
                "split",
                edit_json("tokenizer_config.json", lambda c: c.update(split_special_tokens=True)),
            )
        },
        "generation eos ids": {
            "card": target(
                "eos",
                edit_json(
                    "generation_config.json",
                    lambda g: g.update(eos_token_id=[tok.eos_token_id, end_of_text]),
                ),
            )
        },
        "chat template": {"card": target("template", retemplate)},
        "chat template, card not made again": {
            "card": target("template-stale-card", retemplate, card_again=False)
        },
        "chat_template_kwargs": {"template_kwargs": {"enable_thinking": False}},
    }
    changed_bytes = set()
    for name, change in changes.items():
        params = change.get("params", {})
        card = change.get("card", keyed_target)
        key, data, _ = tokenize(name, card, change.get("template_kwargs"), **params)
        if data != base_bytes:
            changed_bytes.add(name)
            assert key != base_key, f"{name} changed the stored bytes but not the key"
    # every change that should reach the rows did (else the check above proves nothing of it)
    assert set(changes) - changed_bytes == {"max_truncated_share", "generation eos ids"}
    key, data, _ = tokenize("share again", **changes["max_truncated_share"]["params"])
    assert (key, data) == (base_key, base_bytes)  # operational: the rows are kept


def test_an_edit_to_what_the_rows_code_does_changes_the_rows_and_their_key(tmp_path, keyed_target):
    """The code in the key, run for real: tokenize from a copy of the source tree whose rows.py
    numbers a conversation's rows from 1 writes other bytes under another key; a comment and a
    docstring edited in the same module leave the code's fingerprint as it was."""
    from draftline.core.shaping import shaping_fingerprint
    from draftline.tokens.config import TokenizeConfig
    from draftline.tokens.tokenize import tokenize_dataset
    from tests.core.test_shaping import copy_code, edit

    code = copy_code(tmp_path / "code")
    edit(
        code,
        "draftline/tokens/rows.py",
        "def server_turns(regeneration: dict) -> list | None:\n",
        "def server_turns(regeneration: dict) -> list | None:  # what the server said\n",
    )
    edit(code, "draftline/tokens/rows.py", "The code here shapes", "What is here shapes")
    assert shaping_fingerprint("tokenize", code) == shaping_fingerprint("tokenize")

    from transformers import AutoTokenizer

    convs = conversations(AutoTokenizer.from_pretrained(keyed_target.model))
    (tmp_path / "card.json").write_text(json.dumps(keyed_target.to_dict()))
    write_lines(tmp_path, convs)
    args = [str(tmp_path / p) for p in ("prompts.jsonl", "regenerated/conversations.jsonl")]
    tokenize_dataset(keyed_target, *args, str(tmp_path / "here"), TokenizeConfig())
    base_key, base_bytes = stored(tmp_path / "here")

    edit(code, "draftline/tokens/rows.py", '"part": k,', '"part": k + 1,')
    assert shaping_fingerprint("tokenize", code) != shaping_fingerprint("tokenize")
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "import draftline\n"
        "assert Path(draftline.__file__).is_relative_to(Path.cwd()), draftline.__file__\n"
        "from draftline.core.card import TargetCard\n"
        "from draftline.tokens.config import TokenizeConfig\n"
        "from draftline.tokens.tokenize import tokenize_dataset\n"
        "card = TargetCard.load(sys.argv[1])\n"
        "tokenize_dataset(card, *sys.argv[2:5], TokenizeConfig())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(code)}
    argv = [
        sys.executable,
        "-c",
        script,
        str(tmp_path / "card.json"),
        *args,
        str(tmp_path / "copy"),
    ]
    subprocess.run(argv, cwd=code, env=env, check=True)
    key, data = stored(tmp_path / "copy")
    assert data != base_bytes and key != base_key
