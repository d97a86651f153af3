"""The draft model: parts taken from the target, the saved format vLLM reads, fine-tune init checks
and remaps, EAGLE-layout conversion, and the speculators multi-GPU command."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from draftline.draft import checkpoint
from draftline.draft import model as draft_model
from draftline.draft import pretrained as draft_init
from draftline.draft.init_checks import InitMismatch
from draftline.engines.config import VllmEngineConfig
from draftline.hidden_states.online_server import speculators_hidden_states_args
from draftline.targets.model import load_target
from draftline.train import speculators as handoff
from draftline.train.config import TrainConfig


def launch_in(vocab: Path, tmp_path: Path, nproc: int, **extra) -> handoff.SpeculatorsLaunch:
    """The hand-off's launch with its data, checkpoint and log folders under tmp_path."""
    folders = [tmp_path / name for name in ("tok", "hs", "ckpt", "logs")]
    return handoff.SpeculatorsLaunch(vocab, *folders, nproc, **extra)


def resolved(cmd: list[str]) -> dict:
    """What speculators' trainer runs with, given the hand-off's torchrun command."""
    from speculators.train.config import TrainConfig as SpeculatorsTrainConfig
    from torch.distributed.run import get_args_parser

    args = get_args_parser().parse_args(cmd[1:]).training_script_args
    return SpeculatorsTrainConfig.resolve(args).flatten()


@pytest.fixture(scope="module")
def target(random_target):
    model, _ = load_target(random_target)
    return model


@pytest.fixture(scope="module")
def saved_draft(tmp_path_factory, random_target, vocab_dir):
    """A draft with non-trivial trained parts, saved in speculators format."""
    torch.manual_seed(3)
    model = draft_model.build_draft(random_target, vocab_dir, TrainConfig(speculative_tokens=4))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.1)
    path = tmp_path_factory.mktemp("draft") / "draft"
    fields = draft_model.save_draft(model, path)
    return path, model, fields


def trained_parts(model) -> dict:
    return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}


def test_embeddings_lm_head_and_norm_come_from_the_target(random_target, vocab_dir, target):
    model = draft_model.build_draft(random_target, vocab_dir, TrainConfig(num_layers=2))
    t2d = torch.from_numpy(np.load(vocab_dir / "t2d.npy"))
    assert (
        len(model.layers) == 2
        and model.config.transformer_layer_config.hidden_size == random_target.hidden_size
    )
    assert torch.equal(model.embed_tokens.weight, target.model.embed_tokens.weight)
    assert torch.equal(model.lm_head.weight, target.lm_head.weight[t2d])
    assert torch.equal(model.verifier_norm.weight, target.model.norm.weight)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert {
        "embed_tokens.weight",
        "lm_head.weight",
        "verifier_lm_head.weight",
        "verifier_norm.weight",
    } <= frozen
    assert "fc.weight" not in frozen
    opened = draft_model.build_draft(
        random_target, vocab_dir, TrainConfig(train_embeddings=True, train_lm_head=True)
    )
    assert opened.embed_tokens.weight.requires_grad and opened.lm_head.weight.requires_grad
    assert not opened.verifier_lm_head.weight.requires_grad and opened.config.embed_requires_grad


def test_saved_draft_loads_and_carries_what_vllm_reads(saved_draft, random_target):
    from speculators.models.eagle3 import Eagle3DraftModel

    from draftline.draft.checkpoint import load_draft

    path, model, fields = saved_draft
    loaded = Eagle3DraftModel.from_pretrained(str(path))
    for name, value in trained_parts(model).items():
        assert torch.equal(loaded.state_dict()[name], value), name
    assert (
        load_draft(path, random_target, "cpu").config.transformer_layer_config._attn_implementation
        == "eager"
    )  # noqa: SLF001
    config = json.loads((path / "config.json").read_text())
    assert fields == draft_model.vllm_speculator_fields(config)
    assert fields["method"] == "eagle3" and fields["draft_model_type"] == "llama"
    assert fields["num_speculative_tokens"] == 4
    assert fields["verifier"] == random_target.model
    assert fields["eagle_aux_hidden_state_layer_ids"] == random_target.aux_ids
    assert fields["draft_vocab_size"] == random_target.vocab_size // 2
    assert fields["target_vocab_size"] == random_target.vocab_size
    assert (fields["norm_before_residual"], fields["norm_before_fc"], fields["norm_output"]) == (
        True,
        True,
        True,
    )


def copy_with_config(src, dst, edit):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    edit(config)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_finetune_init_takes_trained_parts_and_our_target(
    saved_draft, random_target, vocab_dir, target
):
    path, model, _ = saved_draft
    loaded, notes = draft_init.load_init_draft(
        path, random_target, vocab_dir, TrainConfig(speculative_tokens=2)
    )
    assert notes == []
    for name, value in trained_parts(model).items():
        assert torch.equal(loaded.state_dict()[name], value), name
    assert torch.equal(loaded.verifier_norm.weight, target.model.norm.weight)
    assert loaded.config.speculators_config.proposal_methods[0].speculative_tokens == 2
    assert not loaded.lm_head.weight.requires_grad and loaded.fc.weight.requires_grad


@pytest.mark.parametrize(
    "edit, key",
    [
        (lambda c: c["transformer_layer_config"].__setitem__("hidden_size", 96), "hidden size"),
        (
            lambda c: c["transformer_layer_config"].__setitem__("vocab_size", 4000),
            "target vocabulary",
        ),
        (
            lambda c: c["transformer_layer_config"].update(
                num_hidden_layers=2, layer_types=["full_attention"] * 2
            ),
            "train.num_layers",
        ),
        (
            lambda c: c.__setitem__("eagle_aux_hidden_state_layer_ids", [0, 2, 4]),
            "train.init_remap_aux_layers",
        ),
    ],
)
def test_init_mismatch_is_a_clear_error(saved_draft, random_target, vocab_dir, tmp_path, edit, key):
    bad = copy_with_config(saved_draft[0], tmp_path / "bad", edit)
    with pytest.raises(InitMismatch, match=key):
        draft_init.load_init_draft(bad, random_target, vocab_dir, TrainConfig())


def test_aux_layer_remap_is_explicit(saved_draft, random_target, vocab_dir, tmp_path):
    other = copy_with_config(
        saved_draft[0],
        tmp_path / "other",
        lambda c: c.__setitem__("eagle_aux_hidden_state_layer_ids", [0, 2, 4]),
    )
    loaded, notes = draft_init.load_init_draft(
        other, random_target, vocab_dir, TrainConfig(init_remap_aux_layers=True)
    )
    assert notes == ["aux layers [0, 2, 4] -> [1, 2, 3]"]
    assert loaded.config.eagle_aux_hidden_state_layer_ids == [1, 2, 3]
    assert torch.equal(loaded.fc.weight, saved_draft[1].fc.weight)


def test_vocab_remap_matches_lm_head_rows_by_target_token(
    saved_draft, random_target, vocab_dir, tmp_path, target
):
    # our new vocabulary: target tokens 100 .. 100+n (the checkpoint's was 0 .. n)
    n = random_target.vocab_size // 2
    shifted = tmp_path / "vocab"
    shifted.mkdir()
    np.save(shifted / "d2t.npy", np.full(n, 100, dtype=np.int64))
    t2d = np.zeros(random_target.vocab_size, dtype=bool)
    t2d[100 : 100 + n] = True
    np.save(shifted / "t2d.npy", t2d)
    with pytest.raises(InitMismatch, match="train.init_remap_vocab"):
        draft_init.load_init_draft(saved_draft[0], random_target, shifted, TrainConfig())
    cfg = TrainConfig(init_remap_vocab=True, train_lm_head=True)
    loaded, notes = draft_init.load_init_draft(saved_draft[0], random_target, shifted, cfg)
    assert notes and loaded.lm_head.weight.shape == (n, random_target.hidden_size)
    old_head = saved_draft[1].lm_head.weight
    assert torch.equal(
        loaded.lm_head.weight[0], old_head[100]
    )  # target token 100 was in both vocabularies
    assert torch.equal(
        loaded.lm_head.weight[n - 1], target.lm_head.weight[100 + n - 1]
    )  # new token: target's row
    assert torch.equal(loaded.d2t, torch.full((n,), 100))


@pytest.fixture(scope="module")
def drafter_with_head(saved_draft, tmp_path_factory):
    """saved_draft with an lm_head of its own (not the target's rows), as a fine-tuned drafter has."""
    path = tmp_path_factory.mktemp("drafter_head") / "drafter"
    shutil.copytree(saved_draft[0], path)
    weights = load_file(str(path / "model.safetensors"))
    head = torch.randn(weights["lm_head.weight"].shape, generator=torch.Generator().manual_seed(9))
    weights["lm_head.weight"] = head
    save_file(weights, str(path / "model.safetensors"))
    return path, head


def shifted_vocab(directory: Path, card, offset: int = 100) -> Path:
    """A draft vocabulary of target tokens offset .. offset+n (the fixture vocabulary is 0 .. n)."""
    n = card.vocab_size // 2
    directory.mkdir()
    np.save(directory / "d2t.npy", np.full(n, offset, dtype=np.int64))
    t2d = np.zeros(card.vocab_size, dtype=bool)
    t2d[offset : offset + n] = True
    np.save(directory / "t2d.npy", t2d)
    return directory


def test_finetune_keeps_the_drafters_lm_head(
    drafter_with_head, random_target, vocab_dir, tmp_path, target
):
    """Without train_lm_head the drafter's head is kept, frozen, not replaced by the target's rows;
    on another draft vocabulary its rows follow the tokens, new tokens take the target's rows."""
    path, head = drafter_with_head
    loaded, notes = draft_init.load_init_draft(path, random_target, vocab_dir, TrainConfig())
    assert torch.equal(loaded.lm_head.weight, head) and not loaded.lm_head.weight.requires_grad
    t2d = torch.from_numpy(np.load(vocab_dir / "t2d.npy"))
    assert torch.equal(loaded.verifier_lm_head.weight, target.lm_head.weight[t2d])  # the teacher
    assert notes == []

    n = random_target.vocab_size // 2
    shifted = shifted_vocab(tmp_path / "vocab", random_target)
    remap = TrainConfig(init_remap_vocab=True)
    loaded, notes = draft_init.load_init_draft(path, random_target, shifted, remap)
    assert torch.equal(loaded.lm_head.weight[: n - 100], head[100:])  # tokens 100 .. n-1: shared
    assert torch.equal(loaded.lm_head.weight[n - 100 :], target.lm_head.weight[n : n + 100])
    assert "lm_head: 100 tokens new to the draft take the target's rows" in notes
    assert not loaded.lm_head.weight.requires_grad


def test_speculators_handoff_starts_from_the_drafters_head(
    drafter_with_head, random_target, vocab_dir, tmp_path, target
):
    """The checkpoint `--from-pretrained` gets carries the drafter's head (remapped to our
    vocabulary), and speculators' own loader, from the command's arguments, keeps it."""
    import argparse

    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.cli import build_draft_model

    path, head = drafter_with_head
    n = random_target.vocab_size // 2
    shifted = shifted_vocab(tmp_path / "vocab", random_target)
    cfg = TrainConfig(backend="speculators", init_remap_vocab=True)
    view = tmp_path / "verifier_view"  # what verifier_for_speculators hands speculators
    view.symlink_to(random_target.model)
    out, notes, architecture = handoff.retarget_init(
        cfg, random_target, shifted, path, tmp_path / "init_retargeted", str(view)
    )
    assert architecture == "speculators" and any(note.startswith("vocab") for note in notes)
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == str(view)
    saved = load_file(str(out / "model.safetensors"))["lm_head.weight"]
    assert torch.equal(saved[: n - 100], head[100:])
    assert torch.equal(saved[n - 100 :], target.lm_head.weight[n : n + 100])

    cmd = handoff.speculators_train_command(
        cfg,
        random_target,
        launch_in(shifted, tmp_path, 2, init_dir=out, architecture=architecture),
    )
    run = resolved(cmd)
    assert run["from_pretrained"] == str(out)
    d2t = torch.from_numpy(np.load(shifted / "d2t.npy"))
    t2d = torch.from_numpy(np.load(shifted / "t2d.npy"))
    args = argparse.Namespace(**{**run, "draft_attn_impl": "eager"})
    model = build_draft_model(args, Eagle3DraftModel, t2d, d2t, n)
    assert torch.equal(model.lm_head.weight, saved) and not model.lm_head.weight.requires_grad
    assert torch.equal(model.verifier_lm_head.weight, target.lm_head.weight[t2d])


def test_architecture_sets_the_norms_and_init_must_match_it(saved_draft, random_target, vocab_dir):
    assert checkpoint.architecture_of(saved_draft[1].config) == "speculators"  # the default
    original = draft_model.build_draft(random_target, vocab_dir, TrainConfig(architecture="eagle3"))
    assert checkpoint.architecture_of(original.config) == "eagle3" and original.input_norm is None
    assert (
        checkpoint.architecture_of(
            {"norm_before_residual": True, "norm_before_fc": False, "norm_output": True}
        )
        is None
    )
    with pytest.raises(InitMismatch, match="train.architecture"):
        draft_init.load_init_draft(
            saved_draft[0], random_target, vocab_dir, TrainConfig(architecture="eagle3")
        )
    loaded, _ = draft_init.load_init_draft(
        saved_draft[0], random_target, vocab_dir, TrainConfig(architecture="speculators")
    )
    assert checkpoint.architecture_of(loaded.config) == "speculators"


def test_eagle_layout_checkpoint_is_converted(saved_draft, random_target, vocab_dir, tmp_path):
    """An EAGLE/SpecForge layout (flat Llama config, midlayer.* weights) goes through speculators'
    Eagle-3 converter and loads with the same trained weights."""
    _, model, _ = saved_draft
    tl = model.config.transformer_layer_config
    eagle = tmp_path / "eagle"
    eagle.mkdir()
    (eagle / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLMEagle3"],
                "model_type": "llama",
                "hidden_size": tl.hidden_size,
                "intermediate_size": tl.intermediate_size,
                "num_attention_heads": tl.num_attention_heads,
                "num_key_value_heads": tl.num_key_value_heads,
                "head_dim": tl.head_dim,
                "num_hidden_layers": 1,
                "vocab_size": tl.vocab_size,
                "draft_vocab_size": model.config.draft_vocab_size,
                "rms_norm_eps": tl.rms_norm_eps,
                "rope_theta": 10000.0,
                "max_position_embeddings": tl.max_position_embeddings,
                "hidden_act": "silu",
            }
        )
    )
    sd = model.state_dict()
    weights = {
        k.replace("layers.0.", "midlayer."): v
        for k, v in sd.items()
        if k.startswith("layers.0.")
        or k in ("fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d")
    }
    save_file({k: v.contiguous() for k, v in weights.items()}, str(eagle / "model.safetensors"))

    with pytest.raises(InitMismatch, match="init_convert"):
        draft_init.prepare_init(eagle, random_target, {"bogus": True}, tmp_path / "work")
    convert = {
        "norm_before_residual": True,
        "norm_output": True,
        "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
    }
    converted = draft_init.prepare_init(eagle, random_target, convert, tmp_path / "work")
    assert converted == tmp_path / "work" / draft_init.CONVERTED_INIT_DIR
    # what the probe stage checks before regeneration, from the config alone: the conversion's
    from speculators.models.eagle3 import Eagle3SpeculatorConfig

    seen, d2t = draft_init.init_config(eagle, random_target, convert)
    made = Eagle3SpeculatorConfig.from_pretrained(str(converted))
    for key in ("hidden_size", "vocab_size", "num_hidden_layers"):
        assert getattr(seen.transformer_layer_config, key) == getattr(
            made.transformer_layer_config, key
        ), key
    for key in ("eagle_aux_hidden_state_layer_ids", "draft_vocab_size", "fc_norm"):
        assert getattr(seen, key) == getattr(made, key), key
    assert checkpoint.architecture_of(seen) == checkpoint.architecture_of(made)
    assert torch.equal(d2t, load_file(str(converted / "model.safetensors"))["d2t"])
    assert "layers.0.self_attn.q_proj.weight" in load_file(str(converted / "model.safetensors"))
    loaded, _ = draft_init.load_init_draft(converted, random_target, vocab_dir, TrainConfig())
    assert loaded.input_norm is None  # EAGLE checkpoints have no norm before fc
    for name in (
        "fc.weight",
        "norm.weight",
        "layers.0.self_attn.q_proj.weight",
        "layers.0.hidden_norm.weight",
    ):
        assert torch.equal(loaded.state_dict()[name], sd[name]), name
    assert (
        draft_init.prepare_init(converted, random_target, {}, tmp_path / "again") == converted
    )  # already speculators format


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        (
            "peagle",
            {
                "speculator_type": "peagle",
                "num_depths": 4,
                "down_sample_ratio": 0.7,
                "down_sample_ratio_min": 0.2,
                "max_anchors": 512,
                "draft_arch": "llama",
            },
        ),
        (
            "dflash",
            {
                "speculator_type": "dflash",
                "block_size": 6,
                "max_anchors": 512,
                "dflash_decay_gamma": 4.0,
                "per_position_loss_weight": "fixed-exp-decay",
                "draft_arch": "qwen3",
                "loss_fn": "kl_div",
            },
        ),
    ],
)
def test_each_methods_handoff_resolves_in_speculators_own_config(
    method, expected, random_target, vocab_dir, tmp_path
):
    """train.method's hand-off arguments as speculators' trainer resolves them (its derived
    defaults and cross-checks included: DFlash's dpace default would refuse kl_div)."""

    cfg = TrainConfig(
        backend="speculators", method=method, peagle={"depths": 4}, dflash={"block_size": 6}
    )
    cmd = handoff.speculators_train_command(
        cfg,
        random_target,
        launch_in(vocab_dir, tmp_path, 1),
    )
    run = resolved(cmd)
    assert {k: run[k] for k in expected} == expected
    assert run["mask_token_id"] == draft_model.mask_token_id(random_target, cfg)


def test_speculators_command_parses_with_speculators_own_parser(random_target, vocab_dir, tmp_path):
    from speculators.train.config import TrainConfig as SpeculatorsTrainConfig
    from torch.distributed.run import get_args_parser

    cfg = TrainConfig(
        backend="speculators",
        epochs=3,
        lr=5e-4,
        pack_len=4096,
        num_layers=2,
        fsdp=True,
        seed=7,
        ttt_steps=4,
        warmup_steps=20,
        scheduler="linear",
        train_embeddings=True,
    )
    cmd = handoff.speculators_train_command(
        cfg,
        random_target,
        launch_in(vocab_dir, tmp_path, 8),
    )
    assert cmd[0] == "torchrun"
    launch = get_args_parser().parse_args(cmd[1:])
    assert (
        launch.nproc_per_node == "8"
        and launch.module
        and launch.training_script == "speculators.train"
    )
    run = SpeculatorsTrainConfig.resolve(launch.training_script_args).flatten()
    expected = {
        "speculator_type": "eagle3",
        "verifier_name_or_path": random_target.model,
        "data_path": str(tmp_path / "tok"),
        "hidden_states_path": str(tmp_path / "hs"),
        "on_missing": "raise",
        "d2t_path": str(vocab_dir / "d2t.npy"),
        "t2d_path": str(vocab_dir / "t2d.npy"),
        "draft_vocab_size": random_target.vocab_size // 2,
        "target_layer_ids": random_target.aux_ids,
        "num_layers": 2,
        "full_attention_indices": [0, 1],
        "draft_arch": "llama",
        "norm_before_residual": True,
        "norm_before_fc": True,
        "norm_output": True,
        "embed_requires_grad": True,
        "total_seq_len": 4096,
        "train_data_ratio": 0.9,
        "epochs": 3,
        "lr": 5e-4,
        "optimizer": "adamw",
        "scheduler_type": "linear",
        "scheduler_warmup_steps": 20,
        "ttt_steps": 4,
        "loss_fn": "kl_div",
        "seed": 7,
        "fsdp_shard": True,
        "save_path": str(tmp_path / "ckpt"),
    }
    assert {k: run[k] for k in expected} == expected

    init_cmd = handoff.speculators_train_command(
        TrainConfig(backend="speculators"),
        random_target,
        launch_in(vocab_dir, tmp_path, 2, init_dir=tmp_path / "init"),
    )
    init_run = resolved(init_cmd)
    assert init_run["from_pretrained"] == str(tmp_path / "init") and init_run["fsdp_shard"] is False

    eagle3_cmd = handoff.speculators_train_command(
        TrainConfig(backend="speculators"),
        random_target,
        launch_in(vocab_dir, tmp_path, 2, architecture="eagle3"),
    )
    eagle3_run = resolved(eagle3_cmd)
    assert {
        k: eagle3_run[k] for k in checkpoint.ARCHITECTURES["eagle3"]
    } == checkpoint.ARCHITECTURES["eagle3"]


@pytest.mark.parametrize(
    "setting, key",
    [({"grad_accum_steps": 4}, "grad_accum_steps"), ({"train_lm_head": True}, "train_lm_head")],
)
def test_speculators_backend_refuses_what_it_cannot_do(setting, key):
    from draftline.core.config import ParamsError
    from draftline.params import load_params, parse_params

    raw = load_params(Path(__file__).resolve().parents[2] / "params.yaml").model_dump()
    raw["train"].update(backend="speculators", **setting)
    with pytest.raises(ParamsError, match=key):
        parse_params(raw)
    raw["train"]["backend"] = "builtin"
    parse_params(raw)


@pytest.fixture(scope="module")
def tied_target(tmp_path_factory, random_target):
    """The random target with lm_head tied to its embeddings: its checkpoint holds no lm_head.weight."""
    from transformers import LlamaForCausalLM

    from draftline.targets.model import build_card

    model = LlamaForCausalLM.from_pretrained(random_target.model)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    path = tmp_path_factory.mktemp("tied_target")
    model.save_pretrained(path)
    for item in Path(random_target.model).iterdir():
        if item.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(item, path)
    return build_card(str(path), "test", None, [1, 2, 3], {})


def test_a_tied_target_builds_its_draft_without_loader_warnings(tied_target, vocab_dir, capfd):
    """speculators' loader printed "Tensor 'lm_head.weight' not found" (and "index.json not found")
    for every tied, single-file target in each stage that builds or loads a draft; the card's
    verifier tensors name the embeddings as the lm_head instead."""
    assert "lm_head.weight" not in load_file(Path(tied_target.model) / "model.safetensors")
    capfd.readouterr()
    model = draft_model.build_draft(tied_target, vocab_dir, TrainConfig())
    err = capfd.readouterr().err
    assert "not found" not in err and "WARNING" not in err, err
    t2d = torch.from_numpy(np.load(vocab_dir / "t2d.npy"))
    assert torch.equal(model.verifier_lm_head.weight, model.embed_tokens.weight[t2d])


@pytest.mark.parametrize("transfer", ["file", "fp8", "mooncake"])
def test_online_speculators_command_and_vllm_server_parse(
    random_target, vocab_dir, tmp_path, transfer
):
    """hidden_states.mode online with train.backend speculators: speculators' own parser reads
    `--on-missing generate --vllm-endpoint ...` with the transfer backend from params, and the
    extraction server gets that backend's kv-transfer config, built by hs-connectors itself."""
    from hs_connectors import HiddenStatesBackend

    from draftline.engines import commands
    from draftline.hidden_states.config import HiddenStatesConfig

    hs = HiddenStatesConfig(
        mode="online",
        format="fp8" if transfer == "fp8" else "bf16",
        online={
            "transfer": transfer,
            "request_timeout_s": 90,
            "max_retries": 5,
            "mooncake": {"master": "10.0.0.5:50051", "protocol": "rdma", "device": "mlx5_0"},
        },
    )
    online = hs.online.model_dump()
    args = speculators_hidden_states_args(
        tmp_path / "hs", hs.format, online, "http://10.0.0.9:8012/v1", tmp_path / "staging"
    )
    cmd = handoff.speculators_train_command(
        TrainConfig(backend="speculators"),
        random_target,
        launch_in(vocab_dir, tmp_path, 8, hidden_states_args=args),
    )
    run = resolved(cmd)
    assert run["on_missing"] == "generate" and run["vllm_endpoint"] == "http://10.0.0.9:8012/v1"
    assert (
        run["hidden_states_backend"] == transfer
        and run["request_timeout"] == 90
        and run["max_retries"] == 5
    )
    # the trainer side's transfer, as speculators.train builds it from these arguments
    import argparse

    namespace = argparse.Namespace(**run)
    if transfer == "mooncake":
        assert (
            run["mooncake_master"] == "10.0.0.5:50051"
            and run["mooncake_protocol"] == "rdma"
            and run["mooncake_device"] == "mlx5_0"
        )
        assert (
            type(
                HiddenStatesBackend.registry[transfer].from_train_args(namespace, run["data_path"])
            ).__name__
            == "MooncakeTransfer"
        )
    else:
        transfer_obj = HiddenStatesBackend.registry[transfer].from_train_args(
            namespace, run["data_path"]
        )
        assert transfer_obj.hidden_states_path == tmp_path / "staging"
        assert type(transfer_obj).__name__ == (
            "FP8Transfer" if transfer == "fp8" else "FileTransfer"
        )

    serve = commands.vllm_extract_command(
        VllmEngineConfig(python="python"),
        commands.ExtractServe(
            "org/target",
            None,
            [2, 16, 29],
            32,
            tmp_path / "staging",
            "0.0.0.0",
            8012,
            "bfloat16",
            8,
            8193,
            0.9,
            [],
            transfer=transfer,
            mooncake=online["mooncake"],
        ),
    )
    kv = json.loads(serve[serve.index("--kv-transfer-config") + 1])
    connector = {
        "file": "ExampleHiddenStatesConnector",
        "fp8": "FP8HiddenStatesConnector",
        "mooncake": "MooncakeHiddenStatesConnector",
    }[transfer]
    assert kv["kv_connector"] == connector and kv["kv_role"] == "kv_producer"
    if transfer == "mooncake":
        assert (
            kv["kv_connector_extra_config"]["mooncake"]["master_server_address"] == "10.0.0.5:50051"
        )
        assert kv["kv_connector_extra_config"]["mooncake"]["protocol"] == "rdma"
    else:
        assert kv["kv_connector_extra_config"]["shared_storage_path"] == str(tmp_path / "staging")


def test_offline_fp8_files_go_to_speculators_through_its_fp8_backend(
    random_target, vocab_dir, tmp_path
):

    args = speculators_hidden_states_args(tmp_path / "hs", "fp8")
    cmd = handoff.speculators_train_command(
        TrainConfig(backend="speculators"),
        random_target,
        launch_in(vocab_dir, tmp_path, 2, hidden_states_args=args),
    )
    run = resolved(cmd)
    assert (
        run["hidden_states_backend"] == "fp8"
        and run["on_missing"] == "raise"
        and run["hidden_states_path"] == str(tmp_path / "hs")
    )


def test_draft_layer_starts_as_the_target_layer(random_target, vocab_dir):
    """train.init_layer_from_target: over several tokens (causal attention, rotary positions 0..5,
    so q, k and the position encoding all count), with the embedding half of q/k/v muted, the
    draft's decoder layer of the original EAGLE-3 architecture (no norm on the residual) computes
    exactly the target layer on the state entering it (fc passes it through)."""
    import torch
    from transformers import AutoModelForCausalLM

    from draftline.draft.model import build_draft, init_layer_from_target

    layer = random_target.aux_layer_ids[-1]
    model = build_draft(random_target, vocab_dir, TrainConfig(architecture="eagle3"))
    note = init_layer_from_target(model, random_target, "last_aux")  # = layer
    assert f"target layer {layer}" in note and "passes aux slot 2" in note
    target = AutoModelForCausalLM.from_pretrained(random_target.model, dtype=torch.float32)
    ref = target.model.layers[layer]
    H = random_target.hidden_size
    draft = model.layers[0]
    assert torch.equal(draft.self_attn.q_proj.weight[:, H:], ref.self_attn.q_proj.weight)
    assert torch.equal(draft.mlp.down_proj.weight, ref.mlp.down_proj.weight)
    T = 6
    torch.manual_seed(0)
    states = torch.randn(1, T, 3 * H)
    fused = model.fc(states)
    assert torch.allclose(fused, states[..., 2 * H :])
    # (1, 1, T, T) additive causal mask, the same for both
    mask = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)[None, None]
    with torch.no_grad():
        for proj in ("q_proj", "k_proj", "v_proj"):
            getattr(draft.self_attn, proj).weight[:, :H] = 0
        pos = torch.arange(T)[None]
        cos_sin = target.model.rotary_emb(fused, pos)
        want = ref(fused, attention_mask=mask, position_embeddings=cos_sin, position_ids=pos)
        want = want[0] if isinstance(want, tuple) else want
        x = torch.cat([torch.randn(1, T, H), fused], dim=-1)
        got = draft(
            x,
            attention_mask=mask,
            position_embeddings=model.rotary_emb(x, pos),
            position_ids=pos,
        )
        got = got[0] if isinstance(got, tuple) else got
        # attention does mix positions: the last token alone gives another output
        alone = draft(x[:, -1:], position_embeddings=model.rotary_emb(x[:, -1:], pos[:, -1:]))
        alone = alone[0] if isinstance(alone, tuple) else alone
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got[:, -1], alone[:, 0], atol=1e-3)


def test_init_layer_from_target_refuses_a_layer_the_target_lacks(random_target, vocab_dir):
    from draftline.draft.model import build_draft, init_layer_from_target

    model = build_draft(random_target, vocab_dir, TrainConfig())
    with pytest.raises(ValueError, match="not a decoder layer"):
        init_layer_from_target(model, random_target, random_target.num_layers)


def test_init_layer_from_target_takes_a_layer_or_last_aux():
    from draftline.train.config import TrainConfig

    assert TrainConfig(init_layer_from_target="last_aux").init_layer_from_target == "last_aux"
    assert TrainConfig(init_layer_from_target=3).init_layer_from_target == 3
    for bad in ("first", -1):
        with pytest.raises(ValueError):
            TrainConfig(init_layer_from_target=bad)
    with pytest.raises(ValueError, match="new draft only"):
        TrainConfig(init_layer_from_target=3, init="models/old_draft")
