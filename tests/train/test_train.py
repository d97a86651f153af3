"""Training: same seed -> same weights; a SIGKILL mid-epoch resumes to the uninterrupted result;
fine-tuning starts from a previous run's draft; the stage refuses what it cannot do.

Data: a few dozen token sequences through the random target (conftest), tokenized in speculators'
Arrow layout and captured with draftline.hidden_states.capture, as the tokenize and hidden_states stages write them.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from draftline.core.io import write_json
from draftline.draft import checkpoint
from draftline.draft import metrics as draft_metrics
from draftline.draft import model as draft_model
from draftline.draft import pretrained as draft_init
from draftline.draft.forward import PackLayout, device_loss_config
from draftline.draft.methods import Forward
from draftline.hidden_states.capture import capture
from draftline.hidden_states.files import hs_path, save_hidden_states
from draftline.targets.model import load_target
from draftline.train import data as draft_data
from draftline.train import resume as train_state
from draftline.train import run as training
from draftline.train import speculators as handoff
from draftline.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
TRAIN = {
    "epochs": 2,
    "pack_len": 128,
    "lr": 3e-3,
    "warmup_steps": 2,
    "val_fraction": 0.25,
    "checkpoint_every_steps": 2,
    "device": "cpu",
    "seed": 0,
}


@pytest.fixture(scope="module")
def data(tmp_path_factory, random_target, vocab_dir):
    from datasets import Dataset
    from draftline.targets.model import build_card

    root = tmp_path_factory.mktemp("train_data")
    # the random target with a sharpened lm_head: its next-token distribution is peaked, so the
    # draft has something to learn and tau_sim moves
    model, tokenizer = load_target(random_target)
    with torch.no_grad():
        model.lm_head.weight.mul_(10)
    model.save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    card = build_card(str(root / "target"), "test", None, random_target.aux_ids, {})
    g = torch.Generator().manual_seed(0)
    patterns = [torch.randint(3, card.vocab_size, (48,), generator=g).tolist() for _ in range(4)]
    rows = []  # prefixes of a few recurring sequences: contexts the draft sees again and again
    for i in range(32):
        length = int(torch.randint(16, 48, (1,), generator=g))
        rows.append(patterns[i % 4][:length])
    mask = [[0] * (len(ids) // 4) + [1] * (len(ids) - len(ids) // 4) for ids in rows]
    dataset = Dataset.from_dict(
        {"input_ids": rows, "loss_mask": mask, "seq_len": [len(r) for r in rows]}
    )
    dataset.set_format(type="torch", columns=["input_ids", "loss_mask", "seq_len"])
    dataset.save_to_disk(str(root / "tokenized"))
    (root / "hs").mkdir()
    for i, ids in enumerate(rows):
        hs = capture(model, [ids], card.aux_ids)[0]
        save_hidden_states(hs_path(root / "hs", i), ids, hs, torch.bfloat16)
    write_json(root / "hs" / "meta.json", {"aux_layer_ids": card.aux_ids})
    card.write(root / "card.json")
    return {
        "root": root,
        "card": card,
        "vocab": vocab_dir,
        "tokenized": root / "tokenized",
        "hs": root / "hs",
        "rows": draft_data.TrainingData(root / "tokenized", root / "hs"),
    }


def train_in_process(data, **overrides):
    cfg = TrainConfig(**{**TRAIN, **overrides})
    train_state.seed_everything(cfg.seed)
    model = draft_model.build_draft(data["card"], data["vocab"], cfg)
    result = training.train_draft(model, cfg, data["rows"], "cpu")
    return model, result


def test_progress_follows_every_step_with_tokens_and_time(data):
    seen = []
    cfg = TrainConfig(**{**TRAIN, "epochs": 2})
    model = draft_model.build_draft(data["card"], data["vocab"], cfg)
    callbacks = training.LoopCallbacks(step=seen.append)
    result = training.train_draft(model, cfg, data["rows"], "cpu", callbacks=callbacks)
    assert [p["step"] for p in seen] == list(range(1, result["steps"] + 1))
    assert seen[-1]["step"] == seen[-1]["total_steps"] and seen[-1]["epoch"] == 1
    ends = [p for p in seen if p["epoch_step"] == p["epoch_steps"]]
    assert [p["epoch"] for p in ends] == [0, 1]
    assert all(
        b["tokens"] > a["tokens"] and b["seconds"] > a["seconds"] for a, b in zip(seen, seen[1:])
    )


def test_step_reporter_prints_steps_tokens_per_s_and_eta(capsys):
    from draftline.train.progress import step_reporter

    now = [0.0]
    progress = step_reporter(every_s=10, clock=lambda: now[0])
    for step in range(1, 21):  # 10 steps an epoch, 2 s and 1,000 tokens a step
        now[0] = 2.0 * step
        progress(
            {
                "epoch": (step - 1) // 10,
                "epochs": 2,
                "epoch_step": (step - 1) % 10 + 1,
                "epoch_steps": 10,
                "step": step,
                "total_steps": 20,
                "tokens": 1000 * step,
                "seconds": 2.0 * step,
            }
        )
    lines = capsys.readouterr().out.splitlines()
    # the first step, the end of each epoch, and every 10 s between
    assert [line.split(" (")[0] for line in lines] == [
        "train: epoch 1/2 step 1/10",
        "train: epoch 1/2 step 6/10",
        "train: epoch 1/2 step 10/10",
        "train: epoch 2/2 step 5/10",
        "train: epoch 2/2 step 10/10",
    ]
    assert (
        "500 tok/s" in lines[0]
        and "epoch ETA 0:00:18" in lines[0]
        and "run ETA 0:00:38" in lines[0]
    )


def test_same_params_and_seed_give_identical_weights(data):
    untrained = draft_model.build_draft(data["card"], data["vocab"], TrainConfig(**TRAIN))
    first, result = train_in_process(data, epochs=1, grad_accum_steps=2)
    second, _ = train_in_process(data, epochs=1, grad_accum_steps=2)
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), name
    assert not torch.equal(first.fc.weight, untrained.fc.weight)
    train_set = draft_data.make_dataset(data["rows"], "train", 0.75, 128, "cpu")
    batches = len(draft_data.epoch_batches(train_set, 128, 0, 0))
    assert result["steps"] == -(-batches // 2) >= 3  # one optimizer step per 2 micro-batches


def count_reads(monkeypatch) -> dict[int, int]:
    """{file index: times read} of every hidden-state file the loops open from now on (hs-connectors'
    FP8Transfer, the trainer's reader), whichever thread reads it."""
    import threading

    from hs_connectors import FP8Transfer

    reads, lock, read = {}, threading.Lock(), FP8Transfer.get_cached

    def counted(self, file_idx):
        with lock:
            reads[file_idx] = reads.get(file_idx, 0) + 1
        return read(self, file_idx)

    monkeypatch.setattr(FP8Transfer, "get_cached", counted)
    return reads


def test_read_ahead_trains_the_same_packs_to_the_same_weights(data, monkeypatch):
    """train.loader_workers reads packs ahead in threads: the same packs in the same order, so the
    same losses and weights as reading each pack between steps; every row once per epoch."""
    train_set = draft_data.make_dataset(data["rows"], "train", 0.75, 128, "cpu")
    plan = draft_data.epoch_batches(train_set, 128, 0, 0)
    packs = {
        workers: list(draft_data.make_loader(train_set, plan, PackLayout(128, 64), "cpu", workers))
        for workers in (0, 3)
    }
    assert len(packs[3]) == len(plan) >= 3
    for a, b in zip(packs[0], packs[3]):
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a if isinstance(a[k], torch.Tensor))

    runs = {}
    for workers in (0, 3):
        reads = count_reads(monkeypatch)
        runs[workers] = (*train_in_process(data, loader_workers=workers), dict(reads))
    (first, one, _), (second, other, reads) = runs[0], runs[3]
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), name
    assert [r["train"] for r in one["history"]] == [r["train"] for r in other["history"]]
    assert [r["val"] for r in one["history"]] == [r["val"] for r in other["history"]]
    # 32 rows, train + validation, each read once in each of the 2 epochs
    assert sorted(reads) == list(range(32)) and set(reads.values()) == {TRAIN["epochs"]}


def test_a_read_error_surfaces_in_the_loop_and_closing_stops_the_readers():
    def fetch(i):
        if i == 3:
            raise OSError(f"hs_{i}.safetensors: unreadable")
        return i

    loader = draft_data.prefetched(fetch, range(6), 2, 4)
    assert [next(loader) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(OSError, match="hs_3"):
        next(loader)
    started = []
    loader = draft_data.prefetched(lambda i: started.append(i) or i, range(100), 2, 4)
    assert next(loader) == 0
    loader.close()  # an epoch cut short: the readers stop, at most `depth` packs were asked for
    assert len(started) <= 5


def write_params(directory: Path, **train) -> None:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["train"] = {**TRAIN, **train}
    (directory / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def stage_args(data, run: Path) -> list[str]:
    return [
        str(data["root"] / "card.json"),
        str(data["vocab"]),
        str(data["tokenized"]),
        str(data["hs"]),
        str(run / "draft"),
        str(run / "train.json"),
        str(run / "checkpoints"),
    ]


def run_stage_in_process(data, run: Path, monkeypatch, **train) -> dict:
    from stages import train as stage

    run.mkdir(parents=True, exist_ok=True)
    write_params(run, **train)
    monkeypatch.chdir(run)
    stage.main(*stage_args(data, run))
    return json.loads((run / "train.detail.json").read_text())


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    """One uninterrupted stage run: the baseline for resume and the init for fine-tuning."""
    with pytest.MonkeyPatch.context() as mp:
        run = tmp_path_factory.mktemp("reference")
        report = run_stage_in_process(data, run, mp)
    return run, report


def test_stage_output_meta_and_curves(reference, data):
    run, report = reference
    meta = json.loads((run / "draft" / "meta.json").read_text())
    assert (
        meta["params"]["epochs"] == 2
        and meta["data_sha256"]
        and meta["target"] == data["card"].model
    )
    assert meta["vllm_speculator"]["eagle_aux_hidden_state_layer_ids"] == data["card"].aux_ids
    assert report["resumed_at"] is None and report["best_epoch"] in (0, 1)
    tau = (run / "train" / "plots" / "metrics" / "val" / "tau_sim.tsv").read_text().splitlines()
    assert tau[0] == "step\ttau_sim" and len(tau) == 3  # one row per epoch
    assert float(tau[2].split()[1]) > float(tau[1].split()[1]) > 1.0  # it learns
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == sorted(
        [train_state.LAST_RUN_FILE, train_state.STATE_FILE]
    )  # the final state kept: a rerun under the same key trains nothing


def test_a_rerun_under_the_same_key_trains_nothing_and_writes_the_same_draft(
    reference, data, tmp_path, capsys
):
    """The stage rerun after a log-line edit (stale for DVC, the same key for the state): the
    finished run's state is resumed at its end, no step runs, and the draft is byte-identical."""
    import shutil

    ref_run, ref_report = reference
    run = tmp_path / "again"
    shutil.copytree(ref_run, run)
    before = (run / "draft" / "model.safetensors").read_bytes()
    with pytest.MonkeyPatch.context() as mp:
        report = run_stage_in_process(data, run, mp)
    assert "nothing to train" in capsys.readouterr().out
    assert report["resumed_at"]["epoch"] == 2 and report["steps"] == ref_report["steps"]
    assert report["val_tau_sim"] == ref_report["val_tau_sim"]
    assert (run / "draft" / "model.safetensors").read_bytes() == before


def test_kill_mid_epoch_then_resume_matches_uninterrupted_run(reference, data, tmp_path):
    ref_run, ref_report = reference
    run = tmp_path / "killed"
    run.mkdir()
    write_params(run)
    cmd = [sys.executable, "-m", "stages.train", *stage_args(data, run)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    state = run / "checkpoints" / train_state.STATE_FILE
    with open(run / "first.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=run, env=env, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None and not state.exists():
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)  # right after the first mid-epoch state was written
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, (run / "first.log").read_text()[-2000:]
    assert not (run / "draft").exists()

    second = subprocess.run(cmd, cwd=run, env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    report = json.loads((run / "train.detail.json").read_text())
    assert json.loads((run / "train.json").read_text()) == {
        "val_tau_sim": report["val_tau_sim"],
        "val_loss": report["val_loss"],
    }
    assert report["resumed_at"]["epoch"] == 0 and report["resumed_at"]["batch"] > 0  # mid-epoch
    assert (
        report["steps"] == ref_report["steps"] and report["best_epoch"] == ref_report["best_epoch"]
    )
    assert report["val_tau_sim"] == pytest.approx(ref_report["val_tau_sim"], abs=1e-3)
    ours, ref = (
        load_file(str(run / "draft/model.safetensors")),
        load_file(str(ref_run / "draft/model.safetensors")),
    )
    for name in ref:
        torch.testing.assert_close(ours[name], ref[name], rtol=1e-4, atol=1e-5, msg=name)
    tau = (run / "train" / "plots" / "metrics" / "val" / "tau_sim.tsv").read_text().splitlines()
    assert len(tau) == 3  # the restored epochs are in the curves too


def test_finetune_from_a_previous_run(reference, data, tmp_path, monkeypatch):
    ref_run, ref_report = reference
    init = tmp_path / "init"
    shutil.copytree(ref_run / "draft", init)
    # before any step, the fine-tune starts exactly where the previous run ended
    model, notes = draft_init.load_init_draft(init, data["card"], data["vocab"], TrainConfig())
    val_set = draft_data.make_dataset(data["rows"], "val", 0.75, 128, "cpu")
    hidden_size = model.config.transformer_layer_config.hidden_size
    plan = draft_data.epoch_batches(val_set, 128, 0, 0)
    packs = draft_data.make_loader(val_set, plan, PackLayout(128, hidden_size), "cpu")
    val = draft_metrics.validate(
        model, packs, "cpu", Forward.for_training(TrainConfig()), device_loss_config("cpu")
    )
    assert notes == [] and val["tau_sim"] == pytest.approx(ref_report["val_tau_sim"], abs=1e-4)

    report = run_stage_in_process(
        data, tmp_path / "finetune", monkeypatch, init=str(init), epochs=1, lr=1e-3
    )
    meta = json.loads((tmp_path / "finetune" / "draft" / "meta.json").read_text())
    assert report["init"] == str(init) and meta["init_sha256"] == checkpoint.dir_sha256(init)
    scratch_one_epoch = float(
        (ref_run / "train/plots/metrics/val/tau_sim.tsv").read_text().splitlines()[1].split()[1]
    )
    assert (
        report["val_tau_sim"] > scratch_one_epoch
    )  # one epoch on top of a trained draft beats one from scratch


def test_finetune_keeps_the_drafters_head_through_training(data, tmp_path, monkeypatch):
    """A drafter whose lm_head is its own (not the target's rows): the fine-tuned draft the stage
    saves still has exactly that head (kept and frozen without train.train_lm_head)."""
    torch.manual_seed(4)
    drafter = draft_model.build_draft(data["card"], data["vocab"], TrainConfig())
    with torch.no_grad():
        drafter.lm_head.weight.normal_()
    init = tmp_path / "drafter"
    draft_model.save_draft(drafter, init)
    head = drafter.lm_head.weight.detach().clone()
    weights = load_file(str(init / "model.safetensors"))
    assert torch.equal(weights["lm_head.weight"], head)

    run_stage_in_process(data, tmp_path / "finetune", monkeypatch, init=str(init), epochs=1)
    saved = load_file(str(tmp_path / "finetune" / "draft" / "model.safetensors"))
    assert torch.equal(saved["lm_head.weight"], head)
    assert not torch.equal(saved["fc.weight"], weights["fc.weight"])  # the rest was trained


def test_stage_refuses_its_own_output_as_init(data, tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="own output"):
        run_stage_in_process(
            data, tmp_path / "run", monkeypatch, init=str(tmp_path / "run" / "draft")
        )


def test_state_of_other_params_is_not_resumed(tmp_path, capsys):
    train_state.save_state(tmp_path, {"fingerprint": "a", "step": 3})
    assert train_state.load_state(tmp_path, "a")["step"] == 3
    assert capsys.readouterr().out == ""
    assert train_state.load_state(tmp_path, "b") is None
    assert "starting fresh" in capsys.readouterr().out


def test_a_resume_state_survives_a_log_edit_and_not_the_code_that_shapes_it(
    tmp_path, random_target, monkeypatch, capsys
):
    """The resume key holds the code of SHAPES["train"] (draftline/core/shaping.py), read here
    from a copy of the source tree: a progress line edited keeps the state; an edit to the loss
    starts fresh, and the log says why."""
    from draftline.core import derivation
    from draftline.core.shaping import shaping_fingerprint
    from tests.core.test_shaping import copy_code, edit

    code = copy_code(tmp_path / "code")
    monkeypatch.setattr(derivation, "shaping_fingerprint", lambda n: shaping_fingerprint(n, code))
    params = TrainConfig().model_dump()

    def key():
        inputs = {"data": "data", "init": None, "vocab": "v1"}
        return train_state.run_derivation(params, random_target, inputs, "cpu")

    made, state_dir = key(), tmp_path / "state"
    saved = {"fingerprint": made.key, "key": made.record(), "step": 3}
    train_state.save_state(state_dir, saved)

    edit(code, "draftline/train/progress.py", "(validation aside)", "(validation not counted)")
    assert key().key == made.key
    assert train_state.load_state(state_dir, key().key, key())["step"] == 3

    edit(
        code,
        "draftline/draft/forward.py",
        '"eager" if device == "cpu"',
        '"fused" if device == "cpu"',
    )
    assert key().key != made.key
    capsys.readouterr()
    assert train_state.load_state(state_dir, key().key, key()) is None
    said = capsys.readouterr().out
    assert "the code that shapes them changed: 1 state set aside; starting fresh" in said


def test_a_vocabulary_change_mid_train_starts_fresh_and_a_state_that_does_not_fit_stops(
    tmp_path, random_target, capsys
):
    """The draft vocabulary is in the resume key: an interrupted run whose models/vocab changed
    starts fresh and names it. A state whose key matched but whose weights do not fit the draft
    (what made it was not all in the key) stops the run instead of loading with strict=False."""
    params = TrainConfig().model_dump()

    def key(vocab: str):
        inputs = {"data": "data", "init": None, "vocab": vocab}
        return train_state.run_derivation(params, random_target, inputs, "cpu")

    made, state_dir = key("vocab-a"), tmp_path / "state"
    saved = {"fingerprint": made.key, "key": made.record(), "step": 3}
    train_state.save_state(state_dir, saved)
    capsys.readouterr()
    assert train_state.load_state(state_dir, key("vocab-b").key, key("vocab-b")) is None
    assert "draft vocabulary changed: 1 state set aside" in capsys.readouterr().out

    model = torch.nn.Linear(4, 3)
    fits = {"model": {"weight": torch.zeros(3, 4), "bias": torch.zeros(3)}}
    train_state.check_state_fits(fits, model, state_dir / "state.pt")
    other = {"model": {"weight": torch.zeros(5, 4), "bias": torch.zeros(3)}}
    with pytest.raises(RuntimeError, match=r"weight: saved \(5, 4\), draft \(3, 4\)"):
        train_state.check_state_fits(other, model, state_dir / "state.pt")


def test_the_data_hash_follows_the_states_fingerprint(tmp_path):
    """Hidden states redone for another target's weights or other shaping code keep their names
    and sizes: the fingerprint they were made under (their meta.json) is in the resume key."""
    tokenized, hs = tmp_path / "tokenized", tmp_path / "hs"
    tokenized.mkdir()
    hs.mkdir()
    (tokenized / "data-00000.arrow").write_bytes(b"rows")
    (hs / "hs_0.safetensors").write_bytes(bytes(16))
    (hs / "meta.json").write_text(json.dumps({"fingerprint": "a" * 64}))
    before = draft_data.training_data_sha256(tokenized, hs)
    (hs / "meta.json").write_text(json.dumps({"fingerprint": "b" * 64}))
    assert draft_data.training_data_sha256(tokenized, hs) != before


class RunsCodeWhenUnpickled:
    """What a tampered state.pt on a shared DVC remote could carry: unpickling calls Path.touch."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_tampered_resume_state_runs_no_code(tmp_path, capsys):
    """Issue #16.9: models/draft_checkpoints/state.pt comes back with `dvc pull`; loading it must not
    unpickle code (before: torch.load(weights_only=False) ran whatever the file carried)."""
    marker = tmp_path / "code-ran"
    torch.save(
        {"fingerprint": "a", "step": 3, "payload": RunsCodeWhenUnpickled(marker)},
        tmp_path / train_state.STATE_FILE,
    )
    assert train_state.load_state(tmp_path, "a") is None
    assert not marker.exists() and "starting fresh" in capsys.readouterr().out

    # the state the loop writes (optimizer, scheduler, RNG states) loads without any pickled code
    import random

    import numpy as np

    train_state.seed_everything(7)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = training.make_scheduler(opt, "cosine", 2, 10)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    sched.step()
    train_state.save_state(
        tmp_path,
        {
            "fingerprint": "b",
            "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(),
            "rng": train_state.rng_states(),
            "history": [{"val": {"tau_sim": 1.5}}],
        },
    )
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    state = train_state.load_state(tmp_path, "b")
    train_state.set_rng_states(state["rng"])
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])


def test_hidden_states_for_other_aux_layers_are_refused(data, tmp_path):
    write_json(tmp_path / "meta.json", {"aux_layer_ids": [0, 1, 2]})
    with pytest.raises(draft_data.DataMismatch, match="meta.json"):
        draft_data.check_hidden_states(tmp_path, data["card"])
    draft_data.check_hidden_states(data["hs"], data["card"])


def test_best_speculators_epoch_is_chosen_by_tau_sim(reference, data, tmp_path, monkeypatch):
    """After a speculators run, its per-epoch checkpoints are scored on our validation rows, all
    in one pass over them when the drafts fit together, else never more than once per epoch."""
    ref_run, ref_report = reference
    shutil.copytree(ref_run / "draft", tmp_path / "1")  # trained
    draft_model.build_draft(data["card"], data["vocab"], TrainConfig()).save_pretrained(
        tmp_path / "0"
    )  # untrained
    (tmp_path / "checkpoint_best").symlink_to("0")  # speculators' lowest-loss pointer is ignored
    val_rows = list(range(24, 32))  # val_fraction 0.25 of 32 rows
    results = {}
    for per_pass in (None, 1):
        if per_pass:
            monkeypatch.setattr(handoff, "drafts_per_pass", lambda _bytes, _device, n=per_pass: n)
        reads = count_reads(monkeypatch)
        chosen, result = handoff.best_speculators_epoch(
            tmp_path, TrainConfig(**TRAIN), data["card"], data["rows"], "cpu"
        )
        assert [r["epoch"] for r in result["history"]] == [0, 1] and result["best"]["epoch"] == 1
        assert result["best"]["val"]["tau_sim"] == pytest.approx(
            ref_report["val_tau_sim"], abs=1e-4
        )
        assert torch.equal(
            chosen.fc.weight, load_file(str(ref_run / "draft/model.safetensors"))["fc.weight"]
        )
        results[per_pass] = result
        passes = 1 if per_pass is None else 2
        assert result["validation_passes"] == passes and reads == dict.fromkeys(val_rows, passes)
    assert results[None]["history"] == results[1]["history"]


def test_train_step_overhead_still_runs(data, tmp_path):
    """overhead/train_step.py on this module's data (its numbers are `make overhead`'s business)."""

    data["card"].write(tmp_path / "card.json")
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "train_step.json"
    proc = subprocess.run(
        [
            sys.executable,
            "overhead/train_step.py",
            "--card",
            str(tmp_path / "card.json"),
            "--vocab",
            str(data["vocab"]),
            "--tokenized",
            str(data["tokenized"]),
            "--hidden-states",
            str(data["hs"]),
            "--pack-len",
            "128",  # several steps from this module's few rows
            "--rounds",
            "2",
            "--out",
            str(out),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONPATH": str(root)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["steps"] >= 2 and result["ours_step_s"] > 0 and result["ratio_ours_over_bare"] > 0
    assert [len(v) for v in result["all_step_s"].values()] == [2, 2]
    assert (
        result["cpus"] >= 1
        and len(result["loadavg_at_start"]) == len(result["loadavg_at_end"]) == 3
    )


def test_online_mode_trains_from_the_target_like_offline_and_resumes(reference, data, tmp_path):
    """hidden_states.mode online: the target makes each packed batch's states; no file is written,
    a kill mid-epoch resumes, and validation tau_sim is that of the offline run on stored bf16 states."""
    _, ref_report = reference
    online_hs = (
        tmp_path / "hs_online"
    )  # what the hidden_states stage writes in online mode: meta.json only
    online_hs.mkdir()
    write_json(
        online_hs / "meta.json",
        {
            "mode": "online",
            "format": "bf16",
            "aux_layer_ids": data["card"].aux_ids,
            "params": {"dtype": "bfloat16"},
        },
    )
    run = tmp_path / "online"
    run.mkdir()
    write_params(run)
    args = stage_args(data, run)
    args[3] = str(online_hs)
    cmd = [sys.executable, "-m", "stages.train", *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    state = run / "checkpoints" / train_state.STATE_FILE
    with open(run / "first.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=run, env=env, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None and not state.exists():
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, (run / "first.log").read_text()[-2000:]
    second = subprocess.run(cmd, cwd=run, env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    report = json.loads((run / "train.detail.json").read_text())
    assert report["resumed_at"]["epoch"] == 0 and report["resumed_at"]["batch"] > 0
    assert report["hidden_states_mode"] == "online" and report["target_forwards_per_epoch"] > 0
    assert report["steps"] == ref_report["steps"]
    assert abs(report["val_tau_sim"] - ref_report["val_tau_sim"]) <= 0.05
    assert not list(online_hs.glob("hs_*")) and not list(run.rglob("hs_*.safetensors"))
    meta = json.loads((run / "draft" / "meta.json").read_text())
    assert meta["hidden_states"] == {"mode": "online", "format": "bf16"}


def test_trainer_reads_fp8_files_as_the_states_they_quantize(data, tmp_path):
    """Our loop's dataset (hs-connectors' FP8Transfer) over fp8 files: the bf16 states within fp8's
    rounding (3 mantissa bits: <= 1/16 of each token's largest value)."""
    from draftline.hidden_states.formats import roundtrip

    fp8_dir = tmp_path / "hs_fp8"
    fp8_dir.mkdir()
    for path in data["hs"].glob("hs_*.safetensors"):
        stored = load_file(str(path))
        save_hidden_states(
            fp8_dir / path.name,
            stored["token_ids"].tolist(),
            stored["hidden_states"].float(),
            torch.float8_e4m3fn,
        )
    plain = draft_data.make_dataset(data["rows"], "train", 0.75, 128, "cpu")
    fp8_rows = draft_data.TrainingData(data["tokenized"], fp8_dir)
    fp8 = draft_data.make_dataset(fp8_rows, "train", 0.75, 128, "cpu")
    for i in range(len(plain)):
        a, b = {k: v.float() if v.is_floating_point() else v for k, v in plain[i].items()}, fp8[i]
        assert b["hidden_states"].dtype == torch.float32 and torch.equal(
            a["input_ids"], b["input_ids"]
        )
        bound = (
            torch.cat([a["hidden_states"], a["verifier_last_hidden_states"]], 1)
            .abs()
            .amax(1, keepdim=True)
            / 16
        )
        assert ((a["hidden_states"] - b["hidden_states"]).abs() <= bound).all()
        assert not torch.equal(
            a["verifier_last_hidden_states"], b["verifier_last_hidden_states"]
        )  # really quantized
        expected = roundtrip(
            torch.cat(
                [
                    a["hidden_states"].view(-1, 3, a["verifier_last_hidden_states"].shape[1]),
                    a["verifier_last_hidden_states"][:, None],
                ],
                1,
            ),
            torch.float8_e4m3fn,
        )
        torch.testing.assert_close(b["verifier_last_hidden_states"], expected[:, 3])


def test_online_mode_refuses_a_target_larger_than_its_device_before_the_spend(
    random_target, monkeypatch
):
    """The online mode loads the whole target on the train device: when its weights on disk exceed
    80% of that device's memory the stage fails first, naming the bound and the offline way out."""
    from types import SimpleNamespace

    import psutil

    from draftline.engines.servers import checkpoint_bytes
    from draftline.train.data import check_target_fits

    size = checkpoint_bytes(random_target.model)
    check_target_fits(random_target, "cpu", "hidden_states.mode: online")  # fits: no error
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=size))
    with pytest.raises(
        draft_data.OnlineStatesRefused,
        match=r"^error: .*above 80% of the RAM free now.*mode: offline",
    ):
        check_target_fits(random_target, "cpu", "hidden_states.mode: online")


@pytest.mark.parametrize("method", ["eagle3", "peagle", "dflash"])
def test_each_method_trains_a_step_on_cpu_and_saves_what_vllm_reads(data, tmp_path, method):
    """train.method through speculators' own model class and loss: one optimizer step on CPU
    (eager attention) moves the weights with a finite loss, and the saved draft names the method
    and the fields vLLM's speculators reader requires of it."""
    from draftline.draft.model import save_draft

    # fewer sampled anchors than the methods' 512: a dense CPU mask over them is most of a step
    cfg = TrainConfig(
        **{**TRAIN, "epochs": 1},
        method=method,
        peagle={"max_anchors": 64},
        dflash={"max_anchors": 64},
    )
    train_state.seed_everything(0)
    model = draft_model.build_draft(data["card"], data["vocab"], cfg)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = training.train_draft(model, cfg, data["rows"], "cpu")
    record = result["history"][0]
    assert all(
        torch.isfinite(torch.tensor(r[key]["loss"])) for r in [record] for key in ("train", "val")
    )
    assert record["val"]["tau_sim"] >= 1.0
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed, "no weight moved"
    fields = save_draft(model, tmp_path / "draft")
    saved = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert saved["speculators_model_type"] == fields["method"] == method
    assert fields["vllm_method"] == ("eagle3" if method == "peagle" else method)
    if method != "eagle3":
        assert fields["mask_token_id"] is not None and fields["parallel_drafting"]
    if method == "dflash":
        assert fields["num_speculative_tokens"] == cfg.dflash.block_size - 1
        assert fields["aux_hidden_state_layer_ids"] == data["card"].aux_ids
    # loaded back as the method's class with every trained weight, as evaluate loads it
    loaded = checkpoint.load_draft(tmp_path / "draft", data["card"], "cpu")
    assert type(loaded) is type(model)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
