"""Hidden states: aux ids mean decoder-layer inputs, the last state is pre-norm and reproduces the
target's logits, files are atomic and checked, the stage resumes after SIGKILL and speculators'
own data path reads what it writes."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from draftline.engines import commands
from draftline.hidden_states import batches
from draftline.hidden_states.batches import BATCHES_FILE, token_budget_batches
from draftline.hidden_states.capture import capture, check_aux_layer_ids
from draftline.hidden_states.disk import check_disk, estimate_bytes
from draftline.hidden_states.files import hs_path, is_valid_file, save_hidden_states
from draftline.hidden_states.resume import VLLM_STAGING, derivation, prepare_output
from draftline.targets.corpus import generate_conversations
from draftline.targets.model import load_target_model

REPO = Path(__file__).resolve().parents[2]
SEQS = [[5, 9, 30, 41, 7, 2, 88, 17, 3], [12, 13, 14]]


@pytest.fixture(scope="module")
def target_f32(random_target):
    return load_target_model(random_target, "cpu", torch.float32)


@pytest.fixture(scope="module")
def target_bf16(random_target):
    return load_target_model(random_target, "cpu", torch.bfloat16)


def test_last_state_through_norm_and_lm_head_gives_the_targets_logits_float32(
    random_target, target_f32
):
    model = target_f32
    for seq, hs in zip(SEQS, capture(model, SEQS, random_target.aux_ids)):
        assert hs.shape == (len(seq), 4, random_target.hidden_size)
        with torch.no_grad():
            ref = model(input_ids=torch.tensor([seq]), output_hidden_states=True)
            logits = model.lm_head(model.model.norm(hs[:, 3]))
        assert (logits - ref.logits[0]).abs().max().item() < 1e-4
        # and it is not the post-norm state HF returns last
        assert not torch.allclose(hs[:, 3], ref.hidden_states[-1][0], atol=1e-3)


def test_last_state_gives_the_same_argmax_in_bfloat16(random_target, target_bf16, tmp_path):
    model = target_bf16
    for i, (seq, hs) in enumerate(zip(SEQS, capture(model, SEQS, random_target.aux_ids))):
        path = hs_path(tmp_path, i)
        save_hidden_states(path, seq, hs, torch.bfloat16)  # as stored, read back
        from safetensors.torch import load_file

        stored = load_file(str(path))["hidden_states"]
        assert stored.dtype == torch.bfloat16
        with torch.no_grad():
            ref = model(input_ids=torch.tensor([seq])).logits[0]
            logits = model.lm_head(model.model.norm(stored[:, 3]))
        assert torch.equal(logits.argmax(-1), ref.argmax(-1))


def test_aux_states_are_the_inputs_of_those_decoder_layers(random_target, target_f32):
    """Checked with forward hooks on every decoder layer (and against HF's output_hidden_states):
    slot k holds what enters layer aux_layer_ids[k], vLLM's meaning of
    eagle_aux_hidden_state_layer_ids (its LlamaModel.forward appends hidden_states + residual for
    aux layer idx right before calling layer idx)."""
    model, aux = target_f32, random_target.aux_ids
    seq = SEQS[0]
    layer_inputs = {}
    handles = [
        layer.register_forward_hook(
            lambda m, args, kwargs, out, i=i: layer_inputs.__setitem__(
                i, args[0] if args else kwargs["hidden_states"]
            ),
            with_kwargs=True,
        )
        for i, layer in enumerate(model.model.layers)
    ]
    try:
        with torch.no_grad():
            ref = model(input_ids=torch.tensor([seq]), output_hidden_states=True)
    finally:
        for h in handles:
            h.remove()
    hs = capture(model, [seq], aux)[0]
    for slot, layer_id in enumerate(aux):
        torch.testing.assert_close(hs[:, slot], layer_inputs[layer_id][0], rtol=0, atol=0)
        torch.testing.assert_close(
            hs[:, slot], ref.hidden_states[layer_id][0], rtol=1e-5, atol=1e-6
        )
        # distinct layers really differ: a wrong index would not pass by accident
        other = (
            layer_inputs[layer_id + 1][0]
            if layer_id + 1 < len(layer_inputs)
            else layer_inputs[layer_id - 1][0]
        )
        assert not torch.allclose(hs[:, slot], other, atol=1e-3)
    # id N (num_layers) is the final pre-norm output, the same as the last slot
    n = random_target.num_layers
    top = capture(model, [seq], [0, 1, n])[0]
    torch.testing.assert_close(top[:, 2], hs[:, 3], rtol=0, atol=0)
    torch.testing.assert_close(
        top[:, 0], model.model.embed_tokens(torch.tensor(seq)), rtol=0, atol=0
    )


def test_padding_in_a_batch_changes_nothing(random_target, target_f32):
    batched = capture(target_f32, SEQS, random_target.aux_ids)
    for seq, hs in zip(SEQS, batched):
        alone = capture(target_f32, [seq], random_target.aux_ids)[0]
        torch.testing.assert_close(hs, alone, rtol=1e-4, atol=1e-5)


def test_files_are_checked_before_reuse(tmp_path, random_target, target_f32):
    ids = [3, 4, 5, 6]
    hs = capture(target_f32, [ids], random_target.aux_ids)[0]
    path = hs_path(tmp_path, 0)
    save_hidden_states(path, ids, hs, torch.bfloat16)
    H = random_target.hidden_size
    assert is_valid_file(path, ids, H, torch.bfloat16, full=True)
    assert not is_valid_file(path, ids + [7], H)  # other tokens: redo
    assert not is_valid_file(path, [3, 4, 5, 7], H)
    assert not is_valid_file(path, ids, H + 1)
    assert not is_valid_file(path, ids, H, torch.float32)  # another dtype was asked for
    assert not list(tmp_path.glob("*.tmp"))
    path.write_bytes(path.read_bytes()[:-50])  # truncated by a kill
    assert not is_valid_file(path, ids, H)
    path.write_bytes(b"\x00" * 64)
    assert not is_valid_file(path, ids, H)
    assert not is_valid_file(hs_path(tmp_path, 1), ids, H)
    with pytest.raises(ValueError, match="non-finite"):
        save_hidden_states(path, ids, torch.full_like(hs, float("inf")), torch.bfloat16)


def test_aux_layer_ids_are_range_checked():
    assert check_aux_layer_ids([1, 3, 4], 6) == [1, 3, 4]
    assert check_aux_layer_ids([0, 3, 6], 6) == [0, 3, 6]
    for bad in ([1, 3, 7], [-1, 2, 3], [2, 2, 3], [1, 2]):
        with pytest.raises(ValueError, match="aux_layer_ids"):
            check_aux_layer_ids(bad, 6)


def test_token_budget_batches():
    lengths = {0: 10, 1: 300, 2: 12, 3: 290, 4: 11, 5: 900}
    batches = token_budget_batches(lengths, 600)
    assert sorted(i for b in batches for i in b) == sorted(lengths)
    for b in batches:
        assert max(lengths[i] for i in b) * len(b) <= 600 or len(b) == 1
    assert [5] in batches and len(batches) < len(lengths)


def test_disk_guard(tmp_path, capsys):
    with pytest.raises(RuntimeError, match="not enough disk"):
        check_disk(tmp_path, 10**18, 1.1)
    assert check_disk(tmp_path, 1, 1.1) > 0
    assert estimate_bytes([10, 20], 64, torch.bfloat16) == 30 * (
        4 * 64 * 2 + 8
    )  # states + int64 token id
    assert estimate_bytes([10, 20], 64, torch.float8_e4m3fn) == 30 * (
        4 * 64 + 4 + 8
    )  # + the fp8 scale


def states_key(card, **params):
    from draftline.hidden_states.config import HiddenStatesConfig

    return derivation(HiddenStatesConfig(**params), card, list(card.aux_layer_ids))


def test_output_of_another_target_is_cleared(tmp_path, random_target):
    out = tmp_path / "hs"
    out.mkdir()
    (out / "hs_0.safetensors").write_bytes(b"x")
    (out / "hs_1.safetensors.tmp").write_bytes(b"x")
    fp = states_key(random_target).key
    assert fp != states_key(random_target, dtype="float32").key
    assert fp != states_key(replace(random_target, aux_layer_ids=[1, 2, 4])).key
    (out / "meta.json").write_text(json.dumps({"fingerprint": fp}))
    assert prepare_output(out, fp) == 0 and (out / "hs_0.safetensors").exists()
    assert not (out / "hs_1.safetensors.tmp").exists()
    assert prepare_output(out, "another") == 1 and not (out / "hs_0.safetensors").exists()


def test_states_key_names_what_changed_weights_resolved_dtype_and_pins(
    tmp_path, random_target, monkeypatch
):
    """The target's weights scaled by 1.01, the compute dtype rule forced to bfloat16 (a resolved
    value, extract.py stays bookkeeping) and a transformers pin each change the key, and the
    stored parts name which; the token budget (operational in params) shapes the batches, so it
    is keyed too; the disk margin is not."""
    import shutil

    from safetensors.torch import load_file, save_file

    from draftline.core import derivation as derivation_module

    model = tmp_path / "model"
    shutil.copytree(random_target.model, model)
    card = replace(random_target, model=str(model))
    made = states_key(card)
    record = made.record()
    assert states_key(card).changed(record) == []
    assert states_key(card, disk_margin=2.0).key == made.key
    assert states_key(card, token_budget=64).changed(record) == ["resolved settings (token_budget)"]
    assert states_key(card, compute_dtype="bfloat16").changed(record) == [
        "params (compute_dtype)",
        "resolved settings (compute_dtype)",
    ]
    weights = next(model.glob("*.safetensors"))
    save_file({k: v * 1.01 for k, v in load_file(weights).items()}, str(weights), {"format": "pt"})
    assert states_key(card).changed(record) == ["target weights"]
    record = states_key(card).record()
    real = derivation_module.md.version
    monkeypatch.setattr(
        derivation_module.md, "version", lambda n: "9.9" if n == "transformers" else real(n)
    )
    assert states_key(card).changed(record) == ["environment pins (installed.transformers)"]
    assert states_key(card).changed(None) == ["what made them was not recorded"]


def test_states_survive_a_log_edit_and_go_when_the_code_that_shapes_them_changes(
    tmp_path, random_target, monkeypatch, capsys
):
    """The key holds the code of SHAPES["hidden_states"] (draftline/core/shaping.py), read here
    from a copy of the source tree: a log line edited in extract.py keeps every file; an edit to
    capture.py's code clears them all, and the stage says why."""
    from datasets import Dataset
    from draftline.core import derivation as derivation_module
    from draftline.core.shaping import shaping_fingerprint
    from draftline.hidden_states import resume
    from draftline.hidden_states.config import HiddenStatesConfig
    from tests.core.test_shaping import copy_code, edit

    code = copy_code(tmp_path / "code")
    monkeypatch.setattr(
        derivation_module, "shaping_fingerprint", lambda n: shaping_fingerprint(n, code)
    )
    out, H = tmp_path / "hs", random_target.hidden_size
    out.mkdir()
    for i, seq in enumerate(SEQS):
        save_hidden_states(hs_path(out, i), seq, torch.randn(len(seq), 4, H), torch.bfloat16)
    made = states_key(random_target)
    meta = {"fingerprint": made.key, "key": made.record()}
    (out / "meta.json").write_text(json.dumps(meta))
    rows = Dataset.from_dict({"input_ids": SEQS})

    def pending() -> resume.PendingWork:
        now = states_key(random_target)
        return resume.pending_work(HiddenStatesConfig(), rows, out, now, H, torch.bfloat16)

    edit(code, "draftline/hidden_states/extract.py", '"hidden_states: running "', '"hs: running "')
    assert states_key(random_target).key == made.key
    kept = pending()
    assert kept.stale == [] and kept.done == 2 and kept.todo == {}

    edit(code, "draftline/hidden_states/capture.py", "logits_to_keep=1", "logits_to_keep=2")
    assert states_key(random_target).key != made.key
    capsys.readouterr()
    redo = pending()
    assert redo.stale == sorted(out.glob("hs_*.safetensors")) and redo.todo == {0: 9, 1: 3}
    assert redo.why == ["the code that shapes them"] and redo.cleared == 2
    assert "; the code that shapes them changed: 2 files to remove" in capsys.readouterr().out

    (out / "meta.json").write_text(
        json.dumps({"fingerprint": made.key})
    )  # made before it was recorded
    assert pending().why == ["what made them was not recorded"]


def test_weights_digest_sees_a_byte_changed_in_the_middle_of_a_weight_file(tmp_path):
    """Before, only the first and last MiB of each file were read: a byte in between went unseen
    and the states of the old weights were kept. A .safetensors file: its header, each tensor's
    ends and evenly spaced blocks; any other weight file: all of it."""
    from safetensors.torch import save_file

    from draftline.core.derivation import weights_digest

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 64}')
    # 8 MiB of tensors, 1 MiB each: the file's middle is the end of one tensor
    save_file({f"w{k}": torch.zeros(1 << 18) for k in range(8)}, str(model / "model.safetensors"))
    (model / "extra.bin").write_bytes(bytes(3 << 20))
    before = weights_digest(str(model))
    assert before == weights_digest(str(model))
    for name in ("model.safetensors", "extra.bin"):
        path = model / name
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 1
        path.write_bytes(bytes(data))
        assert weights_digest(str(model)) != before, name
        data[len(data) // 2] ^= 1
        path.write_bytes(bytes(data))
        assert weights_digest(str(model)) == before
    assert weights_digest("org/hub-model") is None


# ---- the stage on a tokenized dataset ---------------------------------------------------------

PARAMS = """\
samples: 10
target: {model: tiny, aux_layer_ids: [1, 3, 4]}
datasets:
  d: {path: d.jsonl, format: openai}
mix:
  weights: {d: 1.0}
tokenize: {max_length: 256}
hidden_states: {device: cpu, dtype: bfloat16, token_budget: 1024}
"""


@pytest.fixture(scope="module")
def stage_dir(tmp_path_factory, random_target):
    """A work dir with params.yaml, the card and 120 rows tokenized by the tokenize stage."""
    root = tmp_path_factory.mktemp("hs_stage")
    (root / "params.yaml").write_text(PARAMS)
    (root / "card.json").write_text(json.dumps(random_target.to_dict()))
    convs = generate_conversations(120, 11)
    with open(root / "prompts.jsonl", "w") as p, open(root / "conversations.jsonl", "w") as c:
        for k, conv in enumerate(convs):
            row = {"id": f"p{k:04d}", "messages": conv["messages"], "tools": conv["tools"]}
            p.write(json.dumps({"id": row["id"]}) + "\n")
            c.write(json.dumps(row) + "\n")
    with contextlib.chdir(root):
        from stages.tokenize import main as tokenize

        tokenize("card.json", "prompts.jsonl", "conversations.jsonl", "tokenized", "tokenize.json")
    return root


@pytest.fixture(scope="module")
def subsets(stage_dir):
    """tokenized_20 and tokenized_26: the first rows, as a smaller `samples` would give."""
    from datasets import load_from_disk

    rows = load_from_disk(str(stage_dir / "tokenized"))
    for n in (20, 26):
        rows.select(range(n)).save_to_disk(str(stage_dir / f"tokenized_{n}"))
    return stage_dir


@pytest.fixture(scope="module")
def hs_read(subsets):
    """The hf backend's states of tokenized_20 and its report."""
    return run_stage(subsets, "tokenized_20", "hs_read")


def run_stage(root: Path, tokenized: str, out: str) -> dict:
    from stages.hidden_states import main

    with contextlib.chdir(root):
        main("card.json", tokenized, out, f"{out}.json")
    return json.loads((root / f"{out}.json").read_text())


def all_valid(root: Path, tokenized: str, out: str, H: int) -> bool:
    from datasets import load_from_disk

    rows = load_from_disk(str(root / tokenized)).with_format(None)["input_ids"]
    return all(
        is_valid_file(hs_path(root / out, i), ids, H, torch.bfloat16, full=True)
        for i, ids in enumerate(rows)
    )


def test_sigkill_then_rerun_redoes_nothing_that_was_complete(stage_dir, random_target):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = stage_dir / "hs_kill"
    # one row per forward pass, so the kill lands mid-run; the rerun batches the same way (the
    # token budget shapes the batches, so it is in the files' key)
    (stage_dir / "params.yaml").write_text(PARAMS.replace("token_budget: 1024", "token_budget: 16"))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stages.hidden_states",
            "card.json",
            "tokenized",
            "hs_kill",
            "hs_kill.json",
        ],
        cwd=stage_dir,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while len(list(out.glob("hs_*.safetensors"))) < 5:
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "no hidden-state file appeared"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    rows = 120
    from datasets import load_from_disk

    token_ids = load_from_disk(str(stage_dir / "tokenized")).with_format(None)["input_ids"]
    H = random_target.hidden_size
    complete = {
        f.name: (f.stat().st_ino, f.stat().st_mtime_ns)
        for f in out.glob("hs_*.safetensors")
        if is_valid_file(f, token_ids[int(f.stem[3:])], H, torch.bfloat16)
    }
    assert 5 <= len(complete) < rows  # killed mid-run
    # one finished file damaged after the kill (a disk error, a partial copy) must be redone
    damaged = sorted(complete)[0]
    (out / damaged).write_bytes((out / damaged).read_bytes()[:-100])
    del complete[damaged]

    try:
        report = run_stage(stage_dir, "tokenized", "hs_kill")
    finally:
        (stage_dir / "params.yaml").write_text(PARAMS)
    assert all_valid(stage_dir, "tokenized", "hs_kill", H)
    assert not list(out.glob("*.tmp"))
    assert report["reused"] == len(complete) and report["extracted_now"] == rows - len(complete)
    for name, stamp in complete.items():  # untouched: same inode, same mtime
        assert ((out / name).stat().st_ino, (out / name).stat().st_mtime_ns) == stamp
    assert json.loads((out / "meta.json").read_text())["complete"] is True


class Killed(BaseException):
    """Stands in for SIGKILL: raised from inside a batch, after some of its files were written."""


def test_resumed_extraction_is_byte_identical_to_an_uninterrupted_one(subsets, monkeypatch):
    """Issue #16.7: a run killed mid-batch and resumed writes the same bytes as an uninterrupted
    run (before: the rerun re-batched the remaining rows, and other padding rounds bf16 otherwise,
    so some files differed and `train` went stale)."""
    stage_dir = subsets
    (stage_dir / "params.yaml").write_text(
        PARAMS.replace("token_budget: 1024", "token_budget: 1024, compute_dtype: bfloat16")
    )
    try:
        run_stage(stage_dir, "tokenized", "hs_whole")
        real_save, saved = save_hidden_states, []

        def save_then_die(path, *args):
            if len(saved) == 41:  # inside a batch: some of its rows written, the others not
                raise Killed
            real_save(path, *args)
            saved.append(path.name)

        monkeypatch.setattr(batches, "save_hidden_states", save_then_die)
        with pytest.raises(Killed):
            run_stage(stage_dir, "tokenized", "hs_resumed")
        monkeypatch.setattr(batches, "save_hidden_states", real_save)
        assert len(list((stage_dir / "hs_resumed").glob("hs_*.safetensors"))) == 41
        report = run_stage(stage_dir, "tokenized", "hs_resumed")
    finally:
        (stage_dir / "params.yaml").write_text(PARAMS)
    assert report["reused"] == 41 and report["extracted_now"] == 120 - 41
    whole, resumed = stage_dir / "hs_whole", stage_dir / "hs_resumed"
    names = sorted(f.name for f in whole.glob("hs_*.safetensors"))
    assert len(names) == 120 and names == sorted(f.name for f in resumed.glob("hs_*.safetensors"))
    differ = [n for n in names if (whole / n).read_bytes() != (resumed / n).read_bytes()]
    assert differ == []
    assert not (resumed / BATCHES_FILE).exists() and not (whole / BATCHES_FILE).exists()


def test_disk_guard_prints_the_estimate_and_refuses_before_any_work(subsets, capsys):
    (subsets / "params.yaml").write_text(
        PARAMS.replace("token_budget: 1024", "token_budget: 1024, disk_margin: 1.0e+15")
    )
    try:
        with pytest.raises(SystemExit, match="not enough disk for hidden states"):
            run_stage(subsets, "tokenized_20", "hs_guard")
    finally:
        (subsets / "params.yaml").write_text(PARAMS)
    assert "0 rows done, 20 to extract" in capsys.readouterr().out
    assert not list((subsets / "hs_guard").glob("hs_*"))


def test_a_disk_refusal_after_a_dtype_change_removes_nothing(
    subsets, hs_read, random_target, capsys
):
    """Issue #16.2: the states of another dtype are to be cleared, but the disk check refuses: every
    file must still be there, untouched (before: all were removed, then the stage refused). With
    room, they are cleared and redone, the space they held counted as free."""
    import shutil

    out = subsets / "hs_dtype"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(subsets / "hs_read", out)
    stamps = {f.name: (f.stat().st_ino, f.stat().st_mtime_ns) for f in out.iterdir()}
    assert len([n for n in stamps if n.startswith("hs_")]) == 20
    (subsets / "params.yaml").write_text(
        PARAMS.replace(
            "dtype: bfloat16, token_budget: 1024",
            "dtype: float16, token_budget: 1024, disk_margin: 1.0e+15",
        )
    )
    try:
        with pytest.raises(SystemExit, match="not enough disk"):
            run_stage(subsets, "tokenized_20", "hs_dtype")
        assert {f.name: (f.stat().st_ino, f.stat().st_mtime_ns) for f in out.iterdir()} == stamps
        assert "format, params (dtype) changed: 20 files to remove" in capsys.readouterr().out

        (subsets / "params.yaml").write_text(PARAMS.replace("dtype: bfloat16", "dtype: float16"))
        report = run_stage(subsets, "tokenized_20", "hs_dtype")
    finally:
        (subsets / "params.yaml").write_text(PARAMS)
    assert report["removed_for_new_fingerprint"] == 20 and report["extracted_now"] == 20
    from datasets import load_from_disk

    rows = load_from_disk(str(subsets / "tokenized_20")).with_format(None)["input_ids"]
    H = random_target.hidden_size
    assert all(is_valid_file(hs_path(out, i), ids, H, torch.float16) for i, ids in enumerate(rows))


def test_growing_samples_extracts_only_the_new_rows(subsets, random_target):
    stage_dir = subsets
    first = run_stage(stage_dir, "tokenized_20", "hs_grow")
    assert first["extracted_now"] == 20 and first["reused"] == 0
    stamps = {
        f.name: f.stat().st_mtime_ns for f in (stage_dir / "hs_grow").glob("hs_*.safetensors")
    }
    second = run_stage(stage_dir, "tokenized_26", "hs_grow")
    assert second["extracted_now"] == 6 and second["reused"] == 20
    assert {
        f.name: f.stat().st_mtime_ns
        for f in (stage_dir / "hs_grow").glob("hs_*.safetensors")
        if f.name in stamps
    } == stamps
    assert all_valid(stage_dir, "tokenized_26", "hs_grow", random_target.hidden_size)


def test_every_redo_says_why(subsets, random_target, capsys):
    """Existing files that are redone are named and counted by reason on the console and in the
    report: a truncated file (unreadable), one for other tokens; a missing one is just extracted."""
    first = run_stage(subsets, "tokenized_20", "hs_redo")
    assert first["redone"] == {} and first["extracted_now"] == 20
    out = subsets / "hs_redo"
    data = hs_path(out, 3).read_bytes()
    hs_path(out, 3).write_bytes(data[: len(data) // 2])  # cut by a full disk, say
    from safetensors.torch import load_file, save_file

    tensors = load_file(hs_path(out, 6))
    tensors["token_ids"][0] += 1  # the row was tokenized otherwise since
    save_file(tensors, hs_path(out, 6))
    hs_path(out, 9).unlink()
    capsys.readouterr()
    again = run_stage(subsets, "tokenized_20", "hs_redo")
    shown = capsys.readouterr().out
    assert again["extracted_now"] == 3 and again["reused"] == 17
    assert again["redone"] == {"other_tokens": 1, "unreadable": 1}
    assert again["redone_first"]["unreadable"][0].startswith("hs_3.safetensors: ")
    assert again["redone_first"]["other_tokens"] == ["hs_6.safetensors: the tokenized row changed"]
    assert "1 existing files redone (unreadable), first: hs_3.safetensors" in shown
    assert "1 existing files redone (other_tokens), first: hs_6.safetensors" in shown
    assert all_valid(subsets, "tokenized_20", "hs_redo", random_target.hidden_size)


def test_speculators_dataset_and_collate_read_our_data(subsets, hs_read, random_target):
    """speculators' own ArrowDataset and CollateFn (what its trainer uses) over our tokenized rows
    and hidden-state files."""
    from hs_connectors import FileTransfer
    from speculators.train.data import ArrowDataset, CollateFn

    stage_dir = subsets
    assert hs_read["extracted_now"] == 20
    H = random_target.hidden_size
    ds = ArrowDataset(
        max_len=1024,
        datapath=str(stage_dir / "tokenized_20"),
        transfer=FileTransfer(stage_dir / "hs_read"),
        on_missing="raise",
    )
    assert len(ds) == 20
    items = [ds[i] for i in range(3)]
    for item in items:
        L = item["input_ids"].shape[0]
        assert item["hidden_states"].shape == (L, 3 * H)
        assert item["verifier_last_hidden_states"].shape == (L, H)
        assert item["loss_mask"].shape == (L,) and item["loss_mask"].sum() > 0
        assert item["hidden_states"].dtype == torch.bfloat16
    batch = CollateFn(1024, H, num_target_layers=3, dtype=torch.bfloat16)(items)
    total = sum(item["input_ids"].shape[0] for item in items)
    assert batch["hidden_states"].shape == (1, 1024, 3 * H)
    assert batch["verifier_last_hidden_states"].shape == (1, 1024, H)
    assert batch["input_ids"].shape == batch["loss_mask"].shape == (1, 1024)
    lengths = [item["input_ids"].shape[0] for item in items]
    assert total <= 1024 and batch["document_ids"][0, :total].tolist() == sum(
        ([k] * n for k, n in enumerate(lengths)), []
    )
    assert (batch["document_ids"][0, total:] == -1).all()
    torch.testing.assert_close(
        batch["verifier_last_hidden_states"][0, : lengths[0]],
        items[0]["verifier_last_hidden_states"],
    )


# ---- format fp8, mode online, the plan ----------------------------------------------------------


def test_fp8_files_hold_hs_connectors_layout_and_read_back_through_fp8transfer(
    subsets, random_target, target_f32
):
    """format fp8: hs-connectors' layout, its bytes per token, speculators' ArrowDataset with
    FP8Transfer loads it, and the last state through norm + lm_head keeps the target's argmax."""
    from hs_connectors import FP8Transfer
    from safetensors import safe_open
    from speculators.train.data import ArrowDataset

    from datasets import load_from_disk
    from draftline.hidden_states.formats import bytes_per_token, minimum_bytes_per_token

    (subsets / "params.yaml").write_text(PARAMS.replace("dtype: bfloat16,", "format: fp8,"))
    try:
        report = run_stage(subsets, "tokenized_20", "hs_fp8")
        again = run_stage(subsets, "tokenized_20", "hs_fp8")
    finally:
        (subsets / "params.yaml").write_text(PARAMS)
    H = random_target.hidden_size
    assert (
        report["format"] == "fp8"
        and report["extracted_now"] == 20
        and report["dtype"] == "float8_e4m3fn"
    )
    assert (
        again["extracted_now"] == 0 and again["reused"] == 20
    )  # the rerun checks fp8 files as valid
    rows = load_from_disk(str(subsets / "tokenized_20")).with_format(None)["input_ids"]
    out = subsets / "hs_fp8"
    with safe_open(str(out / "hs_0.safetensors"), framework="pt") as f:
        assert set(f.keys()) == {"hidden_states", "hidden_states_scales", "token_ids"}
        assert f.get_slice("hidden_states").get_dtype() == "F8_E4M3"
        assert f.get_slice("hidden_states_scales").get_shape() == [len(rows[0]), 1, 1]
    tokens = sum(len(r) for r in rows)
    files = sum(hs_path(out, i).stat().st_size for i in range(20))
    assert (
        files - tokens * bytes_per_token(H, "fp8") < 20 * 400
    )  # the estimate is the content; headers are small
    assert bytes_per_token(H, "fp8") / minimum_bytes_per_token(H, "fp8") == (4 * H + 12) / (
        4 * H + 4
    )
    assert report["bytes_per_token"] == 4 * H + 12

    # The random target's logits are nearly flat (median top-2 gap ~0.03), so fp8 rounding flips
    # near-ties; away from them the argmax must hold. On the trained default target it holds on
    # >= 99% of all positions (overhead/hs_extraction.py measures it).
    ds = ArrowDataset(
        max_len=1024,
        datapath=str(subsets / "tokenized_20"),
        transfer=FP8Transfer(out),
        on_missing="raise",
    )
    agree = total = clear_agree = clear = 0
    for i in range(20):
        item = ds[i]
        assert item["hidden_states"].dtype == torch.bfloat16 and item["hidden_states"].shape == (
            len(rows[i]),
            3 * H,
        )
        with torch.no_grad():
            logits = target_f32(input_ids=torch.tensor([rows[i]])).logits[0]
            got = target_f32.lm_head(
                target_f32.model.norm(item["verifier_last_hidden_states"].float())
            ).argmax(-1)
        same = got == logits.argmax(-1)
        top2 = logits.topk(2).values
        not_tie = top2[:, 0] - top2[:, 1] > 0.05
        agree, total = agree + int(same.sum()), total + len(rows[i])
        clear_agree, clear = clear_agree + int(same[not_tie].sum()), clear + int(not_tie.sum())
    assert clear_agree / clear >= 0.99 and clear > total / 3 and agree / total >= 0.9


def test_online_mode_writes_only_meta_and_report_and_keeps_offline_files(
    subsets, hs_read, random_target
):
    import shutil

    out = subsets / "hs_online"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(subsets / "hs_read", out)  # an offline run's files: kept for a switch back
    files = {f.name: f.stat().st_mtime_ns for f in out.glob("hs_*.safetensors")}
    (subsets / "params.yaml").write_text(
        PARAMS.replace("token_budget: 1024", "token_budget: 1024, mode: online")
    )
    try:
        report = run_stage(subsets, "tokenized_20", "hs_online")
    finally:
        (subsets / "params.yaml").write_text(PARAMS)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["mode"] == "online" and meta["format"] == "bf16" and report["mode"] == "online"
    assert report["extracted_now"] == 0 and report["files_kept_from_offline"] == 20
    assert report["offline_bytes"]["offline_bf16"] == report["tokens"] * (
        4 * random_target.hidden_size * 2 + 8
    )
    assert {f.name: f.stat().st_mtime_ns for f in out.glob("hs_*.safetensors")} == files
    back = run_stage(
        subsets, "tokenized_20", "hs_online"
    )  # offline again, same target: every file reused
    assert back["reused"] == 20 and back["extracted_now"] == 0


def test_refusal_names_the_modes_that_would_fit(subsets, capsys):
    import shutil

    free = shutil.disk_usage(subsets).free
    from datasets import load_from_disk

    tokens = sum(load_from_disk(str(subsets / "tokenized_20")).with_format(None)["seq_len"])
    H = 64
    bf16, fp8 = tokens * (8 * H + 8), tokens * (4 * H + 12)
    margin = free / (bf16 + fp8) * 2  # bf16 does not fit, fp8 does
    (subsets / "params.yaml").write_text(
        PARAMS.replace("token_budget: 1024", f"token_budget: 1024, disk_margin: {margin}")
    )
    try:
        with pytest.raises(SystemExit) as err:
            run_stage(subsets, "tokenized_20", "hs_refused")
    finally:
        (subsets / "params.yaml").write_text(PARAMS)
    message = str(err.value)
    assert (
        "not enough disk" in message
        and "hidden_states.format: fp8" in message
        and "hidden_states.mode: online" in message
    )
    assert "draftline plan" in message and not list((subsets / "hs_refused").glob("hs_*"))


def test_plan_prints_the_seeds_scale_without_model_or_gpu(tmp_path, random_target):
    (tmp_path / "params.yaml").write_text(PARAMS)
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "draftline.tools.plan",
        "--hidden-size",
        "7168",
        "--samples",
        "25000",
        "--tokens-per-sample",
        "4000",
        "--free-gb",
        "2800",
        "--json",
    ]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    modes = plan["modes"]
    assert plan["tokens"] == 100_000_000
    assert (
        modes["offline_bf16"]["bytes_per_token"] == 4 * 7168 * 2 + 8
        and modes["offline_bf16"]["total_bytes"] == 100_000_000 * 57352
    )
    assert modes["offline_fp8"]["bytes_per_token"] / (4 * 7168 + 4) <= 1.01
    assert not modes["offline_bf16"]["fits"] and modes["online"]["fits"]
    assert modes["online"]["target_forwards_per_epoch"] >= 100_000_000 // 2048  # train.pack_len
    table = subprocess.run(cmd[:-1], cwd=tmp_path, env=env, capture_output=True, text=True).stdout
    assert "| offline fp8 | 28,684 |" in table and "5.7 TB" in table
    # without data yet: an upper bound from samples x max_length, with the card's hidden size
    replace(random_target, hidden_size=64).write(tmp_path / "card.json")
    bound = json.loads(
        subprocess.run(
            [sys.executable, "-m", "draftline.tools.plan", "--card", "card.json", "--json"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
        ).stdout
    )
    assert bound["tokens"] == 10 * 256 and "upper bound" in bound["tokens_from"]


# ---- backend vllm ------------------------------------------------------------------------------


def test_generate_offline_data_command_parses_with_speculators_own_cli():
    import typer.main
    from speculators.cli import app

    cmd = commands.generate_offline_data_command(
        commands.OfflineDataRun("http://127.0.0.1:8012/v1", Path("tok"), Path("hs"), 8, 60.0, 2)
    )
    assert cmd[:3] == [sys.executable, "-m", "speculators"]
    group = typer.main.get_command(app)

    def parse(argv):
        ctx = group.make_context("speculators", list(argv))
        name, sub, rest = group.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
        return name, sub.make_context(name, rest, parent=ctx).params

    name, params = parse(cmd[3:])
    assert name == "generate-offline-data"
    assert params["endpoint"] == "http://127.0.0.1:8012/v1" and params["preprocessed_data"] == "tok"
    assert (
        params["output"] == "hs"
        and params["concurrency"] == 8
        and params["validate_outputs"] is True
    )
    assert params["request_timeout"] == 60.0 and params["max_retries"] == 2
    with pytest.raises(
        Exception, match="No such option: --no-such-flag"
    ):  # the parse really checks names
        parse([*cmd[3:], "--no-such-flag"])


def test_vllm_extract_command_asks_for_aux_layers_and_the_last_one(tmp_path):
    from draftline.engines.config import VllmEngineConfig

    cmd = commands.vllm_extract_command(
        VllmEngineConfig(python="/venv/bin/python"),
        commands.ExtractServe(
            "org/target",
            "abc123",
            [2, 16, 29],
            32,
            tmp_path / "staging",
            "127.0.0.1",
            8012,
            "bfloat16",
            4,
            4097,
            0.8,
            ["--enforce-eager"],
        ),
    )
    assert cmd[:5] == [
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "org/target",
    ]
    flags = dict(zip(cmd[5:-1:2], cmd[6:-1:2]))
    spec = json.loads(flags["--speculative-config"])
    # speculators' scripts/launch_vllm.py: extract_hidden_states with ids + [num_layers] (the last layer)
    assert spec == {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [2, 16, 29, 32]}},
    }
    assert json.loads(flags["--kv-transfer-config"]) == {
        "kv_connector": "ExampleHiddenStatesConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(tmp_path / "staging")},
    }
    assert (
        flags["--tensor-parallel-size"] == "4"
        and flags["--max-model-len"] == "4097"
        and flags["--dtype"] == "bfloat16"
    )
    assert (
        flags["--revision"] == "abc123"
        and flags["--port"] == "8012"
        and cmd[-1] == "--enforce-eager"
    )


# vLLM needs a GPU; this stand-in speaks its wire format for extraction (GET /health, /v1/models;
# POST /v1/completions with prompt token ids -> a safetensors file in the connector's
# shared_storage_path and its path in kv_transfer_params) and records its command line.
# Faults: FAKE_VLLM_REFUSE=<message> exits at start with it (a model vLLM cannot extract from);
# FAKE_VLLM_DROP_LAYER=1 writes the states of one layer fewer than asked (a wrapper whose layer
# ids mean something else).
FAKE_VLLM = r"""
import argparse, json, os, struct, sys, uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

p = argparse.ArgumentParser()
p.add_argument("--model"); p.add_argument("--host"); p.add_argument("--port", type=int)
p.add_argument("--speculative-config"); p.add_argument("--kv-transfer-config")
args, _ = p.parse_known_args()
if os.environ.get("FAKE_VLLM_REFUSE"):
    with open(os.environ["FAKE_VLLM_ARGS"], "w") as f:
        json.dump(sys.argv, f)
    sys.exit("ValueError: " + os.environ["FAKE_VLLM_REFUSE"])
layers = json.loads(args.speculative_config)["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"]
layers = layers[: len(layers) - int(os.environ.get("FAKE_VLLM_DROP_LAYER", "0"))]
storage = json.loads(args.kv_transfer_config)["kv_connector_extra_config"]["shared_storage_path"]
connector = json.loads(args.kv_transfer_config)["kv_connector"]
H = int(os.environ["FAKE_VLLM_HIDDEN"])
with open(os.environ["FAKE_VLLM_ARGS"], "w") as f:
    json.dump(sys.argv, f)

def write_safetensors(path, ids):
    # hidden_states[t, k, :] = (id % 64) + k, in bf16 (upper half of the float32 bytes)
    hs = b"".join(struct.pack("<f", float(t % 64 + k))[2:] * H for t in ids for k in range(len(layers)))
    tok = struct.pack(f"<{len(ids)}q", *ids)
    header = {"hidden_states": {"dtype": "BF16", "shape": [len(ids), len(layers), H], "data_offsets": [0, len(hs)]},
              "token_ids": {"dtype": "I64", "shape": [len(ids)], "data_offsets": [len(hs), len(hs) + len(tok)]}}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + hs + tok)

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            return self.reply({})
        self.reply({"object": "list", "data": [{"id": args.model, "object": "model", "created": 0, "owned_by": "vllm"}]})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        path = os.path.join(storage, f"{uuid.uuid4().hex}.safetensors")
        write_safetensors(path, req["prompt"])
        if connector == "FP8HiddenStatesConnector":  # what its _write_tensors does to the same tensors
            import torch
            from hs_connectors.fp8_utils import SCALES_KEY, quantize_tensor_to_fp8
            from safetensors.torch import load_file, save_file
            tensors = load_file(path)
            fp8, scales = quantize_tensor_to_fp8(tensors["hidden_states"])
            save_file({**tensors, "hidden_states": fp8, SCALES_KEY: scales}, path)
        self.reply({"id": "cmpl-1", "object": "text_completion", "created": 0, "model": args.model,
                    "choices": [{"index": 0, "text": "x", "finish_reason": "length", "logprobs": None,
                                 "prompt_token_ids": req["prompt"]}],
                    "usage": {"prompt_tokens": len(req["prompt"]), "completion_tokens": 1, "total_tokens": len(req["prompt"]) + 1},
                    "kv_transfer_params": {"hidden_states_path": path}})

ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_vllm_python(tmp_path, random_target, monkeypatch) -> Path:
    stub = tmp_path / "stub" / "vllm" / "entrypoints" / "openai"
    stub.mkdir(parents=True)
    for d in (stub.parents[1], stub.parents[0], stub):
        (d / "__init__.py").write_text("")
    (stub / "api_server.py").write_text(FAKE_VLLM)
    python = tmp_path / "python-with-vllm"
    python.write_text(
        f'#!/bin/sh\nPYTHONPATH={tmp_path / "stub"}:{REPO} exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    monkeypatch.setenv("FAKE_VLLM_ARGS", str(tmp_path / "args.json"))
    monkeypatch.setenv("FAKE_VLLM_HIDDEN", str(random_target.hidden_size))
    return python


def test_vllm_backend_hands_off_to_generate_offline_data_and_resumes(
    subsets, hs_read, random_target, monkeypatch, tmp_path
):
    """The stage with backend vllm: launches the server, runs speculators' real client, stops the
    server. The files of an earlier hf run were computed by another engine (its key names the
    backend): all redone. A second vllm run keeps the valid files, redoes missing and mismatched
    ones."""
    import shutil

    from safetensors.torch import load_file

    python = fake_vllm_python(tmp_path, random_target, monkeypatch)

    stage_dir = subsets
    out = stage_dir / "hs_vllm"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(stage_dir / "hs_read", out)  # the hf run's 20 files

    params = PARAMS.replace(
        "hidden_states: {device: cpu, dtype: bfloat16, token_budget: 1024}",
        f"hidden_states:\n  backend: vllm\n  dtype: bfloat16\n  vllm: {{port: {free_port()}, "
        f"concurrency: 4, startup_timeout_s: 60, request_timeout_s: 30}}\n"
        f"engines: {{vllm: {{python: {python}}}}}",
    )
    (stage_dir / "params.yaml").write_text(params)
    try:
        report = run_stage(stage_dir, "tokenized_20", "hs_vllm")
        assert report["removed_for_new_fingerprint"] == 20 and report["extracted_now"] == 20
        for i in (2, 7, 11):
            hs_path(out, i).unlink()
        shutil.copy(hs_path(out, 0), hs_path(out, 5))  # another row's tokens
        kept = {
            f.name: f.stat().st_mtime_ns
            for f in out.glob("hs_*.safetensors")
            if f.name != "hs_5.safetensors"
        }
        report = run_stage(stage_dir, "tokenized_20", "hs_vllm")
    finally:
        (stage_dir / "params.yaml").write_text(PARAMS)
    assert report["backend"] == "vllm" and report["extracted_now"] == 4 and report["reused"] == 16
    assert {
        f.name: f.stat().st_mtime_ns for f in out.glob("hs_*.safetensors") if f.name in kept
    } == kept
    assert all_valid(stage_dir, "tokenized_20", "hs_vllm", random_target.hidden_size)
    assert not (out / VLLM_STAGING).exists()
    argv = json.loads((tmp_path / "args.json").read_text())
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [
        *random_target.aux_ids,
        random_target.num_layers,
    ]
    data = load_file(str(hs_path(out, 5)))
    ids = data["token_ids"]
    expected = (ids % 64).float()[:, None, None] + torch.arange(4.0)[None, :, None]
    assert torch.equal(
        data["hidden_states"].float(), expected.expand(-1, -1, random_target.hidden_size)
    )


def test_vllm_backend_with_format_fp8_uses_the_fp8_connector(
    subsets, random_target, monkeypatch, tmp_path
):
    """format fp8 with backend vllm: the server gets hs-connectors' FP8 connector config, the files
    it writes (fp8 + scales) are checked by the stage itself and read back through FP8Transfer."""
    from hs_connectors import FP8Transfer

    python = fake_vllm_python(tmp_path, random_target, monkeypatch)
    params = PARAMS.replace(
        "hidden_states: {device: cpu, dtype: bfloat16, token_budget: 1024}",
        f"hidden_states:\n  backend: vllm\n  format: fp8\n  vllm: {{port: {free_port()}, "
        f"concurrency: 4, startup_timeout_s: 60, request_timeout_s: 30}}\n"
        f"engines: {{vllm: {{python: {python}}}}}",
    )
    (subsets / "params.yaml").write_text(params)
    try:
        report = run_stage(subsets, "tokenized_20", "hs_vllm_fp8")
    finally:
        (subsets / "params.yaml").write_text(PARAMS)
    assert report["format"] == "fp8" and report["extracted_now"] == 20
    argv = json.loads((tmp_path / "args.json").read_text())
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert (
        kv["kv_connector"] == "FP8HiddenStatesConnector"
        and kv["kv_connector_module_path"] == "hs_connectors.fp8_hidden_states_connector"
    )
    sample = FP8Transfer(subsets / "hs_vllm_fp8", dequantize_dtype=torch.float32).get_cached(3)
    ids = sample["token_ids"]
    expected = (ids % 64).float()[:, None, None] + torch.arange(4.0)[None, :, None]
    bound = expected.abs().amax((1, 2), keepdim=True) / 16  # fp8 e4m3: 3 mantissa bits
    assert ((sample["hidden_states"] - expected).abs() <= bound).all()


def test_hidden_states_params_are_validated():
    import yaml

    from draftline.core.config import ParamsError
    from draftline.params import parse_params

    base = yaml.safe_load(PARAMS)
    assert (
        parse_params(
            {**base, "hidden_states": {"backend": "vllm", "vllm": {"tensor_parallel_size": 8}}}
        ).hidden_states.vllm.tensor_parallel_size
        == 8
    )
    with pytest.raises(ParamsError, match="device_map applies to backend hf"):
        parse_params({**base, "hidden_states": {"backend": "vllm", "device_map": "auto"}})
    with pytest.raises(ParamsError, match="hidden_states.vllm.tensor_parallel_sise"):
        parse_params({**base, "hidden_states": {"vllm": {"tensor_parallel_sise": 2}}})


def test_format_and_mode_params_are_validated():
    import yaml

    from draftline.core.config import ParamsError
    from draftline.params import parse_params

    base = yaml.safe_load(PARAMS)
    hs = parse_params({**base, "hidden_states": {"mode": "online", "format": "fp8"}}).hidden_states
    assert (
        hs.online.resolved_transfer(hs.format) == "fp8"
        and hs.online.resolved_transfer("bf16") == "file"
    )
    with pytest.raises(
        ParamsError, match="hidden_states: .*dtype: the stored dtype of format bf16"
    ):
        parse_params({**base, "hidden_states": {"format": "fp8", "dtype": "float32"}})
    with pytest.raises(
        ParamsError, match="online.transfer: file moves bf16 states but format is fp8"
    ):
        parse_params({**base, "hidden_states": {"format": "fp8", "online": {"transfer": "file"}}})
    with pytest.raises(ParamsError, match="hidden_states.format"):
        parse_params({**base, "hidden_states": {"format": "int4"}})
    with pytest.raises(ParamsError, match="hidden_states.online.mooncake.protocol"):
        parse_params(
            {
                **base,
                "hidden_states": {
                    "online": {"transfer": "mooncake", "mooncake": {"protocol": "udp"}}
                },
            }
        )


def test_plan_estimates_tokens_from_the_prompts_before_tokenizing(tmp_path):
    from draftline.hidden_states import plan
    from draftline.params import parse_params

    prompt = {
        "id": "a",
        "messages": [
            {"role": "user", "content": "x" * 400},
            {"role": "assistant", "content": "y" * 999},
            {"role": "user", "content": "z" * 40},
            {"role": "assistant", "content": "w"},
        ],
    }
    assert (
        plan.estimate_row_tokens(prompt, 96, 512) == 110 + 2 * 96
    )  # prompt text at 4 chars a token, max_tokens per answer
    assert plan.estimate_row_tokens(prompt, 400, 512) == 512  # capped at tokenize.max_length
    (tmp_path / "train.jsonl").write_text(json.dumps(prompt) + "\n")
    import yaml

    params = parse_params(yaml.safe_load(PARAMS))
    from draftline.tools.plan import token_counts

    tokens, rows, source = token_counts(params, tmp_path / "no_tokenized", tmp_path / "train.jsonl")
    assert (
        rows == 1
        and tokens == min(256, 110 + 2 * params.regenerate.max_tokens)
        and "estimated" in source
    )


# The hidden_states params by how the files' key treats them (resume.derivation): a param added
# to HiddenStatesConfig without a line here fails test_every_hidden_states_param_is_classified.
KEYED_PARAMS = {"format", "backend", "device", "dtype", "compute_dtype", "vllm"}
KEYED_AS_RESOLVED = {"token_budget"}  # operational in params, but it shapes the batches
NOT_KEYED = {
    "mode": "online stores no files; the offline files stay for a switch back",
    "online": "shapes the train stage's states, keyed there",
    "device_map": "where the layers sit, not what they compute (cuda either way: resolved device)",
    "disk_margin": "the free space required",
    "verify_existing": "how finished files are checked",
}


def test_every_hidden_states_param_is_classified():
    from draftline.core.config import kind_of
    from draftline.hidden_states.config import HiddenStatesConfig

    fields = set(HiddenStatesConfig.model_fields)
    assert fields == KEYED_PARAMS | KEYED_AS_RESOLVED | set(NOT_KEYED), (
        "classify the new hidden_states param here and in hidden_states/resume.py's key"
    )
    assert all(kind_of(HiddenStatesConfig, f) == "shaping" for f in KEYED_PARAMS)


def test_wherever_the_stored_bytes_change_the_key_changes(subsets, random_target, tmp_path):
    """The differential check of the files' key: two rows extracted under the default params,
    then under one change at a time (each keyed param the hf backend reads, the token budget, the
    target's weights, and operational params that must change nothing); wherever a file's bytes
    differ from the default's, the key differs too."""
    import shutil

    from safetensors.torch import load_file, save_file

    from datasets import load_from_disk
    from draftline.hidden_states.config import HiddenStatesConfig
    from draftline.hidden_states.extract import Paths, extract_hidden_states

    tokenized = tmp_path / "tokenized_2"
    load_from_disk(str(subsets / "tokenized_20")).select(range(2)).save_to_disk(str(tokenized))
    model = tmp_path / "model"
    shutil.copytree(random_target.model, model)
    card = replace(random_target, model=str(model))
    (tmp_path / "card.json").write_text(json.dumps(card.to_dict()))

    def extract(name: str, target=card, **params) -> tuple[str, bytes]:
        cfg = HiddenStatesConfig(device="cpu", **params)
        out = tmp_path / name
        paths = Paths(tmp_path / "card.json", tokenized, out, tmp_path / f"{name}.log")
        extract_hidden_states(cfg, target, paths, 64)
        data = b"".join(hs_path(out, i).read_bytes() for i in range(2))
        return resume.derivation(cfg, target, list(target.aux_layer_ids)).key, data

    from draftline.hidden_states import resume

    base_key, base_bytes = extract("base")
    changes = {
        "dtype": {"dtype": "float16"},
        "format": {"format": "fp8"},
        "compute_dtype": {"compute_dtype": "bfloat16"},
        "token_budget": {"token_budget": 16},
        "disk_margin": {"disk_margin": 2.0},
        "verify_existing": {"verify_existing": "full"},
    }
    changed_bytes = set()
    for name, params in changes.items():
        key, data = extract(name, **params)
        if data != base_bytes:
            changed_bytes.add(name)
            assert key != base_key, f"{name} changed the stored bytes but not the key"
    assert {"dtype", "format", "compute_dtype"} <= changed_bytes
    assert not {"disk_margin", "verify_existing"} & changed_bytes

    weights = next(model.glob("*.safetensors"))
    save_file({k: v * 1.01 for k, v in load_file(weights).items()}, str(weights), {"format": "pt"})
    key, data = extract("weights")
    assert data != base_bytes and key != base_key


def test_kept_files_are_recomputed_before_they_are_trusted(subsets, random_target, tmp_path):
    """resume.verify_sample kept files are recomputed by the target loaded for the rows still to
    extract: files as the target makes them pass; files whose values another target made (the
    key matched, the values did not) stop the stage before anything is written."""
    import shutil

    from draftline.hidden_states.config import HiddenStatesConfig
    from draftline.hidden_states.extract import Paths, extract_hidden_states

    cfg = HiddenStatesConfig(device="cpu", dtype="bfloat16", token_budget=1024)
    out = tmp_path / "hs"
    paths = Paths(subsets / "card.json", subsets / "tokenized_20", out, tmp_path / "hs.log")
    extract_hidden_states(cfg, random_target, paths, 64)
    backup = tmp_path / "made"
    shutil.copytree(out, backup)
    for i in (3, 4):
        hs_path(out, i).unlink()
    report = extract_hidden_states(cfg, random_target, paths, 64, verify_sample=5)
    spot = report["spot_check"]
    assert spot["checked"] == 5 and spot["not_run"] is None
    assert spot["largest_gap"] <= spot["tolerance"] and spot["unit"] == "ulps of torch.bfloat16"
    assert report["reused"] == 18 and report["extracted_now"] == 2
    # nothing to extract: the target is loaded for the check all the same
    report = extract_hidden_states(cfg, random_target, paths, 64, verify_sample=4)
    assert report["extracted_now"] == 0 and report["spot_check"]["checked"] == 4

    # the same files with every kept value nudged by 5%: same names, tokens and meta
    shutil.rmtree(out)
    shutil.copytree(backup, out)
    from safetensors.torch import load_file

    for i in range(20):
        data = load_file(str(hs_path(out, i)))
        ids = data["token_ids"].tolist()
        save_hidden_states(
            hs_path(out, i), ids, data["hidden_states"].float() * 1.05, torch.bfloat16
        )
    hs_path(out, 7).unlink()
    written = {f.name: f.stat().st_mtime_ns for f in out.iterdir()}
    with pytest.raises(Exception, match="spot-check of kept hidden-state files failed: row"):
        extract_hidden_states(cfg, random_target, paths, 64, verify_sample=3)
    assert not hs_path(out, 7).exists()
    assert {f.name: f.stat().st_mtime_ns for f in out.iterdir() if f.name != "meta.json"} == {
        k: v for k, v in written.items() if k != "meta.json"
    }
    hs_path(out, 7).write_bytes((backup / hs_path(out, 7).name).read_bytes())
    with pytest.raises(Exception, match="spot-check of kept hidden-state files failed: row"):
        extract_hidden_states(cfg, random_target, paths, 64, verify_sample=3)  # none to extract
    report = extract_hidden_states(cfg, random_target, paths, 64, verify_sample=0)
    assert report["spot_check"]["not_run"] == "resume.verify_sample is 0"
