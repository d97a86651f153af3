"""The key of the builtin loop's resume state (draftline/train/resume.py run_derivation) against
what the loop makes: every train param classified, and, on the tiny data of test_train.py, every
change that alters the saved draft's bytes alters the key the run records in state.pt.

A key that misses something lets a rerun resume (or, once finished, write again) a state made
from other inputs: the draft of the old data, vocabulary or target weights, under the new ones."""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from draftline.core.config import kind_of
from draftline.core.derivation import Derivation
from draftline.hidden_states.files import save_hidden_states
from draftline.train import resume
from draftline.train import run as training
from draftline.train.config import TrainConfig
from draftline.train.paths import TrainPaths
from tests.train import test_train
from tests.train.test_train import TRAIN

# test_train.py's module fixture: the random target with a sharpened head, 32 rows and their states
data = test_train.data

# The train params by how the resume key treats them: a param added to TrainConfig without a line
# here fails test_every_train_param_is_classified.
KEYED_PARAMS = {
    "method",
    "peagle",
    "dflash",
    "mask_token_id",
    "backend",
    "init",
    "init_convert",
    "init_remap_aux_layers",
    "init_remap_vocab",
    "num_layers",
    "architecture",
    "train_embeddings",
    "train_lm_head",
    "init_layer_from_target",
    "epochs",
    "lr",
    "scheduler",
    "warmup_steps",
    "max_grad_norm",
    "weight_decay",
    "ttt_steps",
    "loss",
    "ttt_step_loss_decay",
    "speculative_tokens",
    "pack_len",
    "grad_accum_steps",
    "val_fraction",
    "device",
    "seed",
}
NOT_KEYED = {
    "checkpoint_every_steps": "how often the state is saved; a save draws no random number",
    "loader_workers": "threads reading the same packs in the same order ahead of the step",
    # the speculators hand-off keeps its own checkpoints and never writes or reads state.pt
    "gpus": "speculators backend only: no state.pt",
    "fsdp": "speculators backend only: no state.pt",
    "num_workers": "speculators backend only: no state.pt",
    "torchrun_args": "speculators backend only: no state.pt",
}


def test_every_train_param_is_classified():
    fields = set(TrainConfig.model_fields)
    assert fields == KEYED_PARAMS | set(NOT_KEYED), (
        "classify the new train param here (and declare its kind in train/config.py)"
    )
    assert not KEYED_PARAMS & set(NOT_KEYED)
    assert set(resume.NOT_IN_FINGERPRINT) == set(NOT_KEYED)
    assert all(kind_of(TrainConfig, f) == "shaping" for f in KEYED_PARAMS)


def test_each_keyed_param_is_in_the_key_and_no_other(random_target):
    """run_derivation on the params the stage passes it (cfg.model_dump()): a keyed param's other
    value moves the key, an unkeyed one's does not."""
    inputs = {"data": "d", "init": None, "vocab": "v"}
    other = {
        "method": "peagle",
        "peagle": {"depths": 4},
        "dflash": {"block_size": 8},
        "mask_token_id": 3,
        "backend": "speculators",
        "init": "models/init",
        "init_convert": {"norm_before_residual": True},
        "init_remap_aux_layers": True,
        "init_remap_vocab": True,
        "num_layers": 2,
        "architecture": "eagle3",
        "train_embeddings": True,
        "train_lm_head": True,
        "init_layer_from_target": "last_aux",
        "epochs": 5,
        "lr": 1e-3,
        "scheduler": "linear",
        "warmup_steps": 0,
        "max_grad_norm": 0.5,
        "weight_decay": 0.1,
        "ttt_steps": 2,
        "loss": "ce",
        "ttt_step_loss_decay": 0.8,
        "speculative_tokens": 4,
        "pack_len": 64,
        "grad_accum_steps": 2,
        "val_fraction": 0.2,
        "device": "cpu",
        "seed": 1,
        "checkpoint_every_steps": 1,
        "loader_workers": 0,
        "gpus": 2,
        "fsdp": True,
        "num_workers": 1,
        "torchrun_args": ["--nnodes=2"],
    }
    assert set(other) == set(TrainConfig.model_fields)
    base = TrainConfig().model_dump()
    key = resume.run_derivation(base, random_target, inputs, "cpu").key
    for name, value in other.items():
        if isinstance(value, dict) and isinstance(base[name], dict) and name != "init_convert":
            value = {**base[name], **value}
        params = {**base, name: value}
        assert params[name] != base[name], name
        moved = resume.run_derivation(params, random_target, inputs, "cpu").key != key
        assert moved == (name in KEYED_PARAMS), f"{name}: keyed is {name in KEYED_PARAMS}"


def draft_bytes(out: Path) -> bytes:
    """What the saved draft is made of (meta.json aside: it records every param, operational too)."""
    return (out / "config.json").read_bytes() + (out / "model.safetensors").read_bytes()


def scale_weights(directory: Path, factor: float) -> None:
    for f in directory.glob("*.safetensors"):
        save_file({k: v * factor for k, v in load_file(f).items()}, str(f), {"format": "pt"})


@pytest.fixture(scope="module")
def workspace(data, tmp_path_factory):
    """Copies of the fixture's target, vocabulary and data, edited in place by the input changes
    below (their paths stay those of the base run, so only their contents differ)."""
    ws = tmp_path_factory.mktemp("train_key")
    target = ws / "target"
    shutil.copytree(data["card"].model, target)
    for name in ("vocab", "tokenized", "hs"):
        shutil.copytree(data[name], ws / name)
    return ws, replace(data["card"], model=str(target))


def train_once(ws: Path, card, name: str, **overrides) -> tuple[Derivation, bytes]:
    """The train stage's library run (draftline/train/run.py `train`) in a fresh state directory:
    the key it recorded in state.pt (with its parts), and the draft it saved."""
    cfg = TrainConfig(**{**TRAIN, "epochs": 1, **overrides})
    run = ws / "runs" / name
    paths = TrainPaths(ws / "vocab", ws / "tokenized", ws / "hs", run / "state")
    training.train(cfg, card, paths, run / "draft", run / "live")
    state = torch.load(run / "state" / resume.STATE_FILE, map_location="cpu", weights_only=True)
    made = Derivation("train", state["key"]["parts"])
    assert made.key == state["fingerprint"]  # the key resumed on is the one whose parts are kept
    return made, draft_bytes(run / "draft")


@pytest.fixture(scope="module")
def base(workspace):
    """One epoch under TRAIN on the unedited inputs: (its key, its draft's bytes)."""
    ws, card = workspace
    made, drafted = train_once(ws, card, "base")
    again, drafted_again = train_once(ws, card, "again")
    assert (again.key, drafted_again) == (made.key, drafted)  # a change is seen, not noise
    return made, drafted


def check_differs(workspace, base, name: str, edit, inputs: Path) -> None:
    """`edit` the inputs in place (their path unchanged), train, put them back: the draft differs
    from the base run's, and so must the key."""
    ws, card = workspace
    made, drafted = base
    backup = ws / "backup" / name
    shutil.copytree(inputs, backup)
    try:
        edit()
        key, changed = train_once(ws, card, name)
    finally:
        shutil.rmtree(inputs)
        shutil.copytree(backup, inputs)
    assert changed != drafted, f"{name}: the edit changed nothing the draft holds"
    assert key.key != made.key, f"{name} changed the draft but not the resume key"


def test_wherever_the_saved_draft_changes_the_key_changes(workspace, base):
    """The differential check of the resume key: one change at a time (keyed params that shape
    the weights, operational params, then each input's contents at the same path: the target's
    weights, the tokenized rows, the hidden states redone, the init draft); wherever the draft's
    bytes differ from the base run's, the key recorded in state.pt differs."""
    ws, card = workspace
    made, drafted = base
    params = {
        "lr": {"lr": 1e-2},
        "seed": {"seed": 1},
        "epochs": {"epochs": 2},
        "warmup_steps": {"warmup_steps": 0},
        "scheduler": {"scheduler": "linear"},
        "max_grad_norm": {"max_grad_norm": 0.01},
        "weight_decay": {"weight_decay": 0.5},
        "ttt_steps": {"ttt_steps": 2},
        "loss": {"loss": "ce"},
        "ttt_step_loss_decay": {"ttt_step_loss_decay": 0.5},
        "pack_len": {"pack_len": 64},
        "grad_accum_steps": {"grad_accum_steps": 2},
        "val_fraction": {"val_fraction": 0.5},
        "num_layers": {"num_layers": 2},
        "architecture": {"architecture": "eagle3"},
        "train_lm_head": {"train_lm_head": True},
        "init_layer_from_target": {"init_layer_from_target": "last_aux"},
        "speculative_tokens": {"speculative_tokens": 5},
        "checkpoint_every_steps": {"checkpoint_every_steps": 1},
        "loader_workers": {"loader_workers": 0},
    }
    changed = set()
    for name, overrides in params.items():
        key, drafted_now = train_once(ws, card, name, **overrides)
        if drafted_now != drafted:
            changed.add(name)
            assert key.key != made.key, f"train.{name} changed the draft but not the resume key"
        if name in NOT_KEYED:  # neither the draft nor the key
            assert key.changed(made.record()) == [], name
    assert changed == set(params) - set(NOT_KEYED), "a change that should show made no difference"

    target = Path(card.model)
    check_differs(workspace, base, "target_weights", lambda: scale_weights(target, 1.01), target)

    def other_loss_mask():
        """The tokenize stage's rows with one row's loss mask changed."""
        from datasets import Dataset, load_from_disk

        rows = load_from_disk(str(ws / "tokenized")).with_format(None).to_dict()
        rows["loss_mask"][0] = [1] * len(rows["loss_mask"][0])
        redone = Dataset.from_dict(rows)
        redone.set_format(type="torch", columns=["input_ids", "loss_mask", "seq_len"])
        shutil.rmtree(ws / "tokenized")
        redone.save_to_disk(str(ws / "tokenized"))

    check_differs(workspace, base, "data_rows", other_loss_mask, ws / "tokenized")

    def states_redone():
        """The hidden_states stage rerun for other target weights: the files keep their names and
        sizes, their values change, and meta.json records the new key (as the stage writes it)."""
        for path in sorted((ws / "hs").glob("hs_*.safetensors")):
            f = load_file(path)
            states = f["hidden_states"].float() * 1.01
            save_hidden_states(path, f["token_ids"].tolist(), states, torch.bfloat16)
        meta = json.loads((ws / "hs" / "meta.json").read_text())
        (ws / "hs" / "meta.json").write_text(json.dumps({**meta, "fingerprint": "b" * 64}))

    check_differs(workspace, base, "data_states", states_redone, ws / "hs")

    # train.init: a draft to fine-tune, then the same directory with other weights
    init = ws / "init"
    shutil.copytree(ws / "runs" / "base" / "draft", init)
    from_init, drafted_init = train_once(ws, card, "init", init=str(init))
    assert drafted_init != drafted and from_init.key != made.key
    scale_weights(init, 1.01)
    key, drafted_now = train_once(ws, card, "init_scaled", init=str(init))
    assert drafted_now != drafted_init, "the init's weights changed nothing the draft holds"
    assert key.key != from_init.key, "the init draft's weights changed the draft but not the key"


def test_another_draft_vocabulary_changes_the_key(workspace, base):
    """models/vocab redone with as many tokens, other ones (the vocab stage on other token
    frequencies: its meta.json, which records only its params, unchanged): the draft's lm_head
    rows and d2t change, so must the key; a state saved under the old vocabulary fits the new
    draft shape for shape, and check_state_fits cannot tell."""
    ws, _ = workspace

    def other_vocabulary():
        t2d = np.load(ws / "vocab" / "t2d.npy")
        size, n = int(t2d.sum()), len(t2d)
        ids = np.arange(n - size, n)  # the last `size` target tokens instead of the first
        np.save(ws / "vocab" / "d2t.npy", (ids - np.arange(size)).astype(np.int64))
        t2d = np.zeros(n, dtype=bool)
        t2d[ids] = True
        np.save(ws / "vocab" / "t2d.npy", t2d)

    check_differs(workspace, base, "vocab", other_vocabulary, ws / "vocab")
