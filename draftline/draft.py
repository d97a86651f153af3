"""The EAGLE-3 draft: speculators' Eagle3DraftModel built from the target card or fine-tuned from
an existing checkpoint, a resumable training loop for CPU and one GPU, and the
`torchrun -m speculators.train` command that takes over on several GPUs.

What comes from the target: the draft decoder's shape (create_transformer_layer_config over the
target's config), the token embeddings, the lm_head rows of the draft vocabulary (t2d), and the
target's final norm (`verifier_norm`, used to turn the stored last hidden state into the teacher
logits). Embeddings and lm_head are frozen unless train.train_embeddings / train.train_lm_head;
the verifier norm and lm_head are always frozen.

The loop reuses speculators' data path unchanged: ArrowDataset over the tokenized rows and
hs_{i}.safetensors files, the Multipack packing plan, CollateFn with shift_batch, and the model's
own TTT forward/loss. CPU runs float32 with eager attention and the eager loss; a GPU runs bf16
autocast (float32 master weights) with flex attention and the fused loss, as speculators does.

Resume: every `checkpoint_every_steps` optimizer steps and at each epoch end, one file
(state.pt, written atomically) holds the trainable weights, optimizer, scheduler, step, epoch,
position in the epoch's packing plan, RNG states, partial-epoch metric sums, the history and the
best epoch so far, plus a fingerprint of params, data and init. A rerun with the same fingerprint
continues from it; any other fingerprint starts fresh.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import time
from pathlib import Path

import numpy as np
import torch

from draftline.config import OPERATIONAL, TrainConfig

STATE_FILE = "state.pt"
LAST_RUN_FILE = "last_run.json"
CONVERTED_INIT_DIR = "converted_init"
# Params that change how often state is saved or how the speculators hand-off is launched,
# never the weights the builtin loop produces: a resume may differ in them (declared in config.py).
NOT_IN_FINGERPRINT = tuple(sorted(OPERATIONAL[TrainConfig]))


class InitMismatch(ValueError):
    """train.init does not fit the target, vocabulary or params; the message names the key."""


class DataMismatch(ValueError):
    """The training data were made for another target configuration; the message names the file."""


# ---------------------------------------------------------------- building the draft


def draft_layer_config(card: dict, num_layers: int):
    """Llama decoder config for the draft, shaped from the target (full attention everywhere)."""
    from speculators.train.cli import create_transformer_layer_config

    return create_transformer_layer_config(
        verifier_name_or_path=card["model"],
        num_layers=num_layers,
        draft_arch="llama",
        hidden_act="silu",
        sliding_window=4096,
        full_attention_indices=list(range(num_layers)),
        trust_remote_code=card.get("trust_remote_code", False),
    )


def load_vocab(vocab_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d): d2t[i] is the offset of draft token i (target id = i + d2t[i]); t2d a bool mask."""
    vocab_dir = Path(vocab_dir)
    return torch.from_numpy(np.load(vocab_dir / "d2t.npy")), torch.from_numpy(np.load(vocab_dir / "t2d.npy"))


def speculators_config(card: dict, speculative_tokens: int):
    """Algorithm, greedy proposal with its token count, and the verifier: what vLLM reads."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    return SpeculatorsConfig(
        algorithm="eagle3",
        proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=speculative_tokens)],
        default_proposal_method="greedy",
        verifier=VerifierConfig.from_pretrained(card["model"], revision=card.get("revision")),
    )


def load_verifier_tensors(model, card: dict, embed: bool = True, lm_head: bool = True) -> None:
    """The target's embeddings, lm_head rows of the draft vocabulary (t2d) and final norm, read by
    the names the card recorded (draftline.target.read_verifier_tensors). Replaces speculators'
    load_verifier_weights, which matches names by suffix, falls back to a norm of ones, and reads
    the verifier's config without trust_remote_code. embed / lm_head False keep the model's own
    (trained) ones; verifier_lm_head and verifier_norm always come from the target."""
    from draftline.target import read_verifier_tensors

    tensors = read_verifier_tensors(card)
    H = model.hidden_size
    if tensors["norm"].shape != (H,) or tensors["embed_tokens"].shape[1] != H:
        raise ValueError(f"target {card['model']!r}: verifier tensors {card['verifier_tensors']} do not fit a draft of "
                         f"hidden size {H}")
    head = tensors["lm_head"]
    if model.use_draft_vocab:
        head = head[model.t2d.to(dtype=torch.bool, device=head.device)]
    with torch.no_grad():
        if embed:
            model.embed_tokens.weight.copy_(tensors["embed_tokens"])
        if lm_head:
            model.lm_head.weight.copy_(head)
        model.verifier_lm_head.weight.copy_(head)
        model.verifier_norm.weight.copy_(tensors["norm"])


def set_trainable(model, train_embeddings: bool, train_lm_head: bool) -> None:
    model.embed_tokens.weight.requires_grad_(train_embeddings)
    model.lm_head.weight.requires_grad_(train_lm_head)
    model.verifier_lm_head.weight.requires_grad_(False)
    model.verifier_norm.weight.requires_grad_(False)
    model.config.embed_requires_grad = train_embeddings


# The draft's norms (train.architecture). speculators: its eagle3 defaults (a norm over the three
# aux states before fc, the hidden norm before the residual, the normed state carried to the next
# step); vLLM serves both. eagle3: the original EAGLE-3 decoder, the one SGLang's
# LlamaForCausalLMEagle3 implements (see draftline/sglang_export.py).
ARCHITECTURES = {
    "speculators": {"norm_before_residual": True, "norm_before_fc": True, "norm_output": True},
    "eagle3": {"norm_before_residual": False, "norm_before_fc": False, "norm_output": False},
}


def architecture_of(config) -> str | None:
    """The ARCHITECTURES name of a draft config (object or dict), None for another combination."""
    get = config.get if isinstance(config, dict) else (lambda key: getattr(config, key, None))
    if get("fc_norm"):
        return None
    flags = {key: bool(get(key)) for key in ARCHITECTURES["eagle3"]}
    return next((name for name, arch in ARCHITECTURES.items() if arch == flags), None)


def build_draft(card: dict, vocab_dir: Path, num_layers: int, ttt_steps: int, attn_impl: str = "eager", *,
                speculative_tokens: int | None = None, train_embeddings: bool = False, train_lm_head: bool = False,
                architecture: str = "speculators"):
    """A fresh draft with embeddings, lm_head (masked to the draft vocab) and norm from the target."""
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    # what speculators' Eagle3DraftModel.from_training_args builds, with the verifier tensors
    # taken from the card's names (load_verifier_tensors)
    d2t, t2d = load_vocab(vocab_dir)
    layer_config = draft_layer_config(card, num_layers)
    layer_config._attn_implementation = attn_impl  # noqa: SLF001
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer_config,
        draft_vocab_size=int(d2t.shape[0]),
        **ARCHITECTURES[architecture],
        fc_norm=False,
        embed_requires_grad=train_embeddings,
        eagle_aux_hidden_state_layer_ids=list(card["aux_layer_ids"]),
        speculators_config=speculators_config(card, speculative_tokens or ttt_steps),
    )
    model = Eagle3DraftModel(config)
    model.load_vocab_mappings(t2d, d2t)
    load_verifier_tensors(model, card)
    set_trainable(model, train_embeddings, train_lm_head)
    return model


def load_saved_draft(directory: Path, card: dict, attn_impl: str = "eager"):
    """A draft saved in speculators format, with the verifier tensors it does not store restored from
    the card's target (Eagle3DraftModel.from_pretrained would read the verifier's config without
    trust_remote_code and match its tensors by suffix)."""
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    config = Eagle3SpeculatorConfig.from_pretrained(str(directory))
    config.transformer_layer_config._attn_implementation = attn_impl  # noqa: SLF001
    model = Eagle3DraftModel(config)
    weights = read_weights(directory)
    missing, unexpected = model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in weights.items()},
                                                strict=False)
    missing = set(missing) - {"verifier_lm_head.weight", "verifier_norm.weight", "embed_tokens.weight", "input_norm.weight"}
    if missing or unexpected:
        raise ValueError(f"{directory}: weights do not fit its config: missing {sorted(missing)[:8]}, "
                         f"unexpected {sorted(unexpected)[:8]}")
    load_verifier_tensors(model, card, embed="embed_tokens.weight" not in weights, lm_head="lm_head.weight" not in weights)
    return model


# ---------------------------------------------------------------- fine-tuning an existing draft


CONVERT_KEYS = {"norm_before_residual", "norm_before_fc", "fc_norm", "norm_output", "eagle_aux_hidden_state_layer_ids"}


def prepare_init(init: str | Path, card: dict, convert_kwargs: dict, work_dir: Path) -> Path:
    """A speculators-format directory for train.init: itself, or its conversion into work_dir
    when it is an EAGLE/SpecForge checkpoint (config.json + midlayer.* weights)."""
    path = Path(init)
    config_path = path / "config.json"
    if not config_path.is_file():
        raise InitMismatch(f"train.init: {path} has no config.json (a local checkpoint directory is required)")
    config = json.loads(config_path.read_text())
    kind = config.get("speculators_model_type")
    if kind is not None:
        if kind != "eagle3":
            raise InitMismatch(f"train.init: {path} is a {kind!r} speculator, not eagle3")
        return path
    unknown = sorted(set(convert_kwargs) - CONVERT_KEYS)
    if unknown:
        raise InitMismatch(f"train.init_convert: unknown keys {unknown}; allowed {sorted(CONVERT_KEYS)}")
    from speculators.convert.eagle.eagle3_converter import Eagle3Converter

    out = Path(work_dir) / CONVERTED_INIT_DIR
    Eagle3Converter().convert(path, out, card["model"], validate=False, **convert_kwargs)
    return out


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """model.safetensors, or the shards its index names."""
    from safetensors.torch import load_file

    directory = Path(directory)
    if (directory / "model.safetensors").is_file():
        return load_file(str(directory / "model.safetensors"))
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weights = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            weights.update(load_file(str(directory / shard)))
        return weights
    raise InitMismatch(f"train.init: no model.safetensors in {directory}")


def draft_target_ids(d2t: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """Target token id of every draft token (the identity when the draft keeps the full vocab)."""
    if d2t is None:
        return torch.arange(vocab_size)
    return torch.arange(d2t.shape[0]) + d2t.long()


def check_init(config, init_d2t: torch.Tensor | None, card: dict, d2t: torch.Tensor, num_layers: int,
               remap_aux: bool, remap_vocab: bool) -> list[str]:
    """Refuse a checkpoint that cannot serve this target; return the remaps that were allowed."""
    from draftline.config import eagle3_default_aux_ids

    tl = config.transformer_layer_config
    if tl.hidden_size != card["hidden_size"]:
        raise InitMismatch(f"train.init: hidden size {tl.hidden_size} differs from the target's "
                           f"{card['hidden_size']} ({card['model']}); no remap exists for this")
    if tl.vocab_size != card["vocab_size"]:
        raise InitMismatch(f"train.init: target vocabulary of {tl.vocab_size} tokens differs from the "
                           f"target's {card['vocab_size']}: it was trained for another tokenizer")
    if tl.num_hidden_layers != num_layers:
        raise InitMismatch(f"train.num_layers: {num_layers}, but train.init has {tl.num_hidden_layers} "
                           "decoder layers; set train.num_layers to match")
    notes = []
    # EAGLE checkpoints without ids were trained with the EAGLE-3 rule (as vLLM assumes).
    init_aux = list(config.eagle_aux_hidden_state_layer_ids or eagle3_default_aux_ids(card["num_layers"]))
    if init_aux != list(card["aux_layer_ids"]):
        if not remap_aux:
            raise InitMismatch(f"train.init: aux layer ids {init_aux} differ from the target card's "
                               f"{card['aux_layer_ids']} (target.aux_layer_ids); set "
                               "train.init_remap_aux_layers: true to reuse its fc slot by slot")
        notes.append(f"aux layers {init_aux} -> {card['aux_layer_ids']}")
    ours = draft_target_ids(d2t, card["vocab_size"])
    theirs = draft_target_ids(init_d2t, card["vocab_size"])
    if not torch.equal(ours, theirs):
        shared = len(set(ours.tolist()) & set(theirs.tolist()))
        if not remap_vocab:
            raise InitMismatch(f"train.init: draft vocabulary differs ({len(theirs)} tokens, {shared} shared "
                               f"with our {len(ours)} in models/vocab); set train.init_remap_vocab: true")
        notes.append(f"vocab {len(theirs)} -> {len(ours)} tokens ({shared} shared)")
    return notes


def remap_lm_head(init_head: torch.Tensor, init_d2t: torch.Tensor | None, target_rows: torch.Tensor,
                  d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """lm_head rows for our draft vocab: the init's row where it has the token, else the target's
    (target_rows: the target's lm_head rows of our draft vocab, in draft order)."""
    row_of = {t: i for i, t in enumerate(draft_target_ids(init_d2t, vocab_size).tolist())}
    ours = draft_target_ids(d2t, vocab_size).tolist()
    head = target_rows.clone()
    for i, t in enumerate(ours):
        if t in row_of:
            head[i] = init_head[row_of[t]]
    return head


# Parts the target provides (or that are recomputed); the checkpoint may carry them or not.
FROM_TARGET = {"embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight", "verifier_norm.weight", "d2t", "t2d"}


def load_init_draft(init_dir: Path, card: dict, vocab_dir: Path, num_layers: int, ttt_steps: int, attn_impl: str = "eager", *,
                    speculative_tokens: int | None = None, train_embeddings: bool = False, train_lm_head: bool = False,
                    remap_aux: bool = False, remap_vocab: bool = False, architecture: str | None = None):
    """(draft, notes): the checkpoint's architecture and trained weights, re-targeted to our card:
    our verifier, aux layer ids and draft vocabulary; frozen parts taken from our target.
    architecture: the train.architecture the checkpoint must have (None: any)."""
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    d2t, t2d = load_vocab(vocab_dir)
    config = Eagle3SpeculatorConfig.from_pretrained(str(init_dir))
    found = architecture_of(config)
    if architecture is not None and found != architecture:
        flags = {key: getattr(config, key, None) for key in (*ARCHITECTURES["eagle3"], "fc_norm")}
        raise InitMismatch(f"train.init: its norms {flags} are the {found or 'neither'!s} architecture, "
                           f"train.architecture is {architecture!r}: set train.architecture to match"
                           + ("" if found else " (or convert it with train.init_convert flags that match)"))
    weights = read_weights(init_dir)
    notes = check_init(config, weights.get("d2t"), card, d2t, num_layers, remap_aux, remap_vocab)
    config.eagle_aux_hidden_state_layer_ids = list(card["aux_layer_ids"])
    config.draft_vocab_size = int(d2t.shape[0])
    config.embed_requires_grad = train_embeddings
    config.speculators_config = speculators_config(card, speculative_tokens or ttt_steps)
    config.transformer_layer_config._attn_implementation = attn_impl  # noqa: SLF001
    model = Eagle3DraftModel(config)
    model.load_vocab_mappings(t2d, d2t)
    load_verifier_tensors(model, card)  # embeddings, lm_head rows, verifier norm/head from our target

    trained = {k: v for k, v in weights.items() if k not in FROM_TARGET}
    if train_embeddings and "embed_tokens.weight" in weights:
        trained["embed_tokens.weight"] = weights["embed_tokens.weight"]
    if train_lm_head and "lm_head.weight" in weights:  # verifier_lm_head = the target's rows of our vocab
        trained["lm_head.weight"] = remap_lm_head(weights["lm_head.weight"], weights.get("d2t"),
                                                  model.verifier_lm_head.weight.detach(), d2t, card["vocab_size"])
    expected = set(model.state_dict()) - FROM_TARGET
    if "input_norm.weight" in expected - set(trained):  # tolerated by speculators too
        notes.append("input_norm.weight missing: starts at ones")
        expected.discard("input_norm.weight")
    missing = sorted(expected - set(trained))
    unexpected = sorted(set(trained) - set(model.state_dict()))
    if missing or unexpected:
        raise InitMismatch(f"train.init: weights do not fit its config: missing {missing[:8]}, unexpected {unexpected[:8]}")
    try:
        model.load_state_dict({k: v.float() for k, v in trained.items()}, strict=False)
    except RuntimeError as err:
        raise InitMismatch(f"train.init: {err}") from None
    set_trainable(model, train_embeddings, train_lm_head)
    return model, notes


def dir_sha256(directory: Path, patterns=("*.json", "*.safetensors")) -> str:
    """Hash of a checkpoint directory's config and weight files (names and contents)."""
    from draftline.io import file_sha256

    h = hashlib.sha256()
    for pattern in patterns:
        for path in sorted(Path(directory).glob(pattern)):
            h.update(f"{path.name}:{file_sha256(path)}\n".encode())
    return h.hexdigest()


# ---------------------------------------------------------------- data


def training_data_sha256(tokenized_dir: Path, hs_dir: Path) -> str:
    """The tokenized rows (file contents) and the hidden-state files (names and sizes: hashing
    terabytes of hidden states is not affordable; hs_{i} is keyed to row i and validated upstream);
    in online mode (no files are read) the mode, format and target fingerprint instead."""
    from draftline.io import file_sha256

    h = hashlib.sha256()
    for path in sorted(Path(tokenized_dir).glob("*.arrow")):
        h.update(f"{path.name}:{file_sha256(path)}\n".encode())
    source = hidden_states_source(hs_dir)
    if source["mode"] == "online":
        h.update(f"online:{source['format']}:{source.get('states_fingerprint')}\n".encode())
        return h.hexdigest()
    for path in sorted(Path(hs_dir).iterdir()):
        if path.name.startswith("hs_") or path.name == "meta.json":
            h.update(f"{path.name}:{path.stat().st_size}\n".encode())
    return h.hexdigest()


def hidden_states_source(hs_dir: Path) -> dict:
    """What the hidden_states stage recorded: mode (offline files / online), format, aux ids..."""
    meta = Path(hs_dir) / "meta.json"
    found = json.loads(meta.read_text()) if meta.is_file() else {}
    return {**found, "mode": found.get("mode", "offline"), "format": found.get("format", "bf16")}


def check_hidden_states(hs_dir: Path, card: dict) -> None:
    meta = Path(hs_dir) / "meta.json"
    if meta.is_file():
        ids = json.loads(meta.read_text()).get("aux_layer_ids")
        if ids is not None and list(ids) != list(card["aux_layer_ids"]):
            raise DataMismatch(f"{meta}: hidden states hold aux layers {ids}, the target card says "
                             f"{card['aux_layer_ids']}; rerun the hidden_states stage")


class OnlineStates:
    """hidden_states.mode: online for the builtin loop: the target (eval mode, on the train device)
    and what extraction would have captured and stored (aux ids, storage dtype of the format)."""

    def __init__(self, target, aux_layer_ids: list[int], storage: torch.dtype):
        self.target, self.aux_layer_ids, self.storage = target, list(aux_layer_ids), storage


def hidden_states_dtype(device: str) -> torch.dtype:
    return torch.float32 if device == "cpu" else torch.bfloat16


def autocast(device: str):
    """bf16 autocast on a GPU (master weights stay float32); plain float32 on CPU."""
    if device == "cpu":
        return torch.autocast("cpu", enabled=False)
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)


def make_dataset(tokenized_dir: Path, hs_dir: Path, split: str, train_ratio: float, pack_len: int, dtype,
                 online: OnlineStates | None = None):
    """speculators' ArrowDataset over the rows; states from the files through hs-connectors'
    FP8Transfer (it dequantizes fp8 files and passes bf16 ones through), or, `online`, from the
    target at fetch time (draftline/online.py)."""
    common = dict(max_len=pack_len, datapath=str(tokenized_dir), train_ratio=train_ratio, split=split, hidden_states_dtype=dtype)
    if online is not None:
        from draftline.online import OnlineArrowDataset

        return OnlineArrowDataset(online.target, online.aux_layer_ids, online.storage, **common)
    from hs_connectors import FP8Transfer
    from speculators.train.data import ArrowDataset

    return ArrowDataset(transfer=FP8Transfer(Path(hs_dir), dequantize_dtype=dtype), on_missing="raise", **common)


def epoch_batches(dataset, pack_len: int, seed: int, epoch: int) -> list[list[int]]:
    """speculators' Multipack packing plan for one epoch (depends only on lengths, seed, epoch)."""
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    sampler = MultipackDistributedBatchSamplerV2(
        batch_max_length=pack_len, lengths=dataset.approx_lengths, num_replicas=1, rank=0, seed=seed
    )
    sampler.set_epoch(epoch)
    return [[int(i) for i in batch] for batch in sampler]


def make_loader(dataset, batches: list[list[int]], pack_len: int, hidden_size: int, dtype):
    from speculators.models.eagle3 import shift_batch
    from speculators.train.data import CollateFn
    from torch.utils.data import DataLoader

    collate = CollateFn(pack_len, hidden_size, num_target_layers=3, dtype=dtype, preprocess=shift_batch)
    return DataLoader(dataset, batch_sampler=batches, num_workers=0, collate_fn=collate)


MODEL_INPUTS = ("hidden_states", "input_ids", "verifier_last_hidden_states", "loss_mask", "position_ids", "document_ids")


def run_batch(model, batch: dict, device: str, ttt_steps: int, decay: float, loss_config):
    inputs = {k: batch[k].to(device) for k in MODEL_INPUTS}
    return model(**inputs, ttt_steps=ttt_steps, ttt_step_loss_decay=decay, loss_config=loss_config)


def summarize(metric_sums: dict[str, float], ttt_steps: int) -> dict:
    """Per-position accuracy acc_k = P(steps 0..k all correct) = prod_{i<=k} of the conditional
    acceptance, and the simulated acceptance length tau_sim = 1 + sum_k acc_k."""
    def ratio(name):
        total = metric_sums.get(f"{name}_total", 0.0)
        return metric_sums.get(f"{name}_sum", 0.0) / total if total else 0.0

    acc = [ratio(f"full_acc_{k}") for k in range(ttt_steps)]
    return {
        "loss": ratio("loss"),
        "position_accuracy": [round(a, 4) for a in acc],
        "tau_sim": round(1 + sum(acc), 4),
    }


def accumulate(sums: dict[str, float], metrics: dict) -> None:
    for key, value in metrics.items():
        if key.endswith("_sum") or key.endswith("_total"):
            sums[key] = sums.get(key, 0.0) + float(value)


@torch.no_grad()
def validate(model, dataset, batches, pack_len: int, device: str, ttt_steps: int, decay: float, loss_config) -> dict:
    model.eval()
    hidden_size = model.config.transformer_layer_config.hidden_size
    dtype = hidden_states_dtype(device)
    sums: dict[str, float] = {}
    with autocast(device):
        for batch in make_loader(dataset, batches, pack_len, hidden_size, dtype):
            _, _, metrics = run_batch(model, batch, device, ttt_steps, decay, loss_config)
            accumulate(sums, metrics)
    return summarize(sums, ttt_steps)


# ---------------------------------------------------------------- resume state


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)


def run_fingerprint(params: dict, card: dict, data_sha256: str, init_sha256: str | None, device: str) -> str:
    """What a resume state must match: every param that shapes the weights, target, data, init."""
    kept = {k: v for k, v in params.items() if k not in NOT_IN_FINGERPRINT}
    facts = {"params": kept, "target": card["model"], "revision": card.get("revision"),
             "data": data_sha256, "init": init_sha256, "device": device}
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()


def rng_states() -> dict:
    """RNG states as tensors, ints, strings and tuples only: what torch.load(weights_only=True) reads."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    states = {"python": random.getstate(),
              "numpy": (str(name), torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
              "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    name, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.int64).astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save_state(state_dir: Path, state: dict) -> None:
    """Write atomically: a kill during the write leaves the previous state intact."""
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = state_dir / f".{STATE_FILE}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, state_dir / STATE_FILE)


def load_state(state_dir: Path, fingerprint: str, say=print) -> dict | None:
    path = Path(state_dir) / STATE_FILE
    if not path.is_file():
        return None
    # weights_only: tensors and plain containers, no pickled code. The file may come from a shared
    # DVC remote (`dvc pull`); a full unpickle would run whatever a tampered copy carries.
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - UnpicklingError, or anything a damaged file raises
        say(f"{path}: not loadable as plain tensors and containers (tampered, damaged, or from an older version: "
            f"{type(err).__name__}); ignored, starting fresh")
        return None
    if not isinstance(state, dict) or state.get("fingerprint") != fingerprint:
        say(f"{path}: made with other params, data or init; starting fresh")
        return None
    return state


def finish_state(state_dir: Path, summary: dict) -> None:
    """The run is complete: drop the resume state, keep a small record of the finished run."""
    from draftline.io import write_json

    state_dir = Path(state_dir)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    write_json(state_dir / LAST_RUN_FILE, summary)


def trainable_state(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}


# ---------------------------------------------------------------- the loop


def make_scheduler(opt, kind: str, warmup_steps: int, total_steps: int):
    """speculators' schedules (transformers' warmup + cosine / linear decay to 0)."""
    from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

    make = get_cosine_schedule_with_warmup if kind == "cosine" else get_linear_schedule_with_warmup
    return make(opt, num_warmup_steps=min(warmup_steps, total_steps), num_training_steps=total_steps)


def train_draft(model, cfg, tokenized_dir: Path, hs_dir: Path, device: str, *, state_dir: Path | None = None,
                fingerprint: str = "", log=None, say=print, online: OnlineStates | None = None,
                progress=None) -> dict:
    """Train in place; returns the best epoch's validation summary and restores its weights.

    With state_dir, resumes from a matching state there and saves state as it goes; every epoch
    record (including those restored) is passed to `log` in order. With `online`, the target makes
    each packed batch's states (no files are read). progress(p) follows every optimizer step: p has
    epoch, epochs, epoch_step, epoch_steps, step, total_steps, and the tokens and seconds of this
    run's steps so far (for tokens/s and an ETA)."""
    from speculators.losses import resolve_loss_config

    dtype = hidden_states_dtype(device)
    hidden_size = model.config.transformer_layer_config.hidden_size
    train_ratio = 1 - cfg.val_fraction
    train_set = make_dataset(tokenized_dir, hs_dir, "train", train_ratio, cfg.pack_len, dtype, online)
    val_set = make_dataset(tokenized_dir, hs_dir, "val", train_ratio, cfg.pack_len, dtype, online)
    plan = [epoch_batches(train_set, cfg.pack_len, cfg.seed, e) for e in range(cfg.epochs)]
    val_batches = epoch_batches(val_set, cfg.pack_len, cfg.seed, 0)
    accum = cfg.grad_accum_steps
    total_steps = sum(math.ceil(len(b) / accum) for b in plan)
    loss_config = resolve_loss_config("kl_div", "eager" if device == "cpu" else "fused")

    model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = make_scheduler(opt, cfg.scheduler, cfg.warmup_steps, total_steps)
    pos = {"epoch": 0, "batch": 0, "step": 0, "train_sums": {}, "history": [], "best": None, "best_state": None}

    state = load_state(state_dir, fingerprint, say) if state_dir is not None else None
    resumed_at = None
    if state is not None:
        model.load_state_dict({k: v.to(device) for k, v in state["model"].items()}, strict=False)
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        set_rng_states(state["rng"])
        pos = {k: state[k] for k in pos}
        resumed_at = {k: pos[k] for k in ("epoch", "batch", "step")}
        say(f"resuming at epoch {pos['epoch']}, batch {pos['batch']}, step {pos['step']} of {total_steps}")
    for record in pos["history"]:
        if log:
            log(record)

    def checkpoint(epoch: int, batch: int, sums: dict) -> None:
        if state_dir is None:
            return
        save_state(state_dir, {
            "fingerprint": fingerprint, "epoch": epoch, "batch": batch, "step": pos["step"], "train_sums": dict(sums),
            "history": pos["history"], "best": pos["best"], "best_state": pos["best_state"],
            "model": trainable_state(model), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "rng": rng_states(),
        })

    step_seconds = []
    run_tokens, run_seconds = 0, 0.0
    for epoch in range(pos["epoch"], cfg.epochs):
        batches = plan[epoch]
        epoch_steps = math.ceil(len(batches) / accum)
        first = pos["batch"] if epoch == pos["epoch"] else 0
        sums = dict(pos["train_sums"]) if epoch == pos["epoch"] else {}
        model.train()
        loader = iter(make_loader(train_set, batches[first:], cfg.pack_len, hidden_size, dtype))
        for start in range(first, len(batches), accum):
            began = time.perf_counter()
            n = min(accum, len(batches) - start)  # the last group of an epoch may be short
            opt.zero_grad(set_to_none=True)
            for _ in range(n):
                with autocast(device):
                    _, loss, metrics = run_batch(model, next(loader), device, cfg.ttt_steps, cfg.ttt_step_loss_decay, loss_config)
                (loss / n).backward()
                accumulate(sums, metrics)
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()
            sched.step()
            pos["step"] += 1
            step_seconds.append(time.perf_counter() - began)
            run_tokens += sum(train_set.approx_lengths[i] for batch in batches[start:start + n] for i in batch)
            run_seconds += step_seconds[-1]
            if progress:
                progress({"epoch": epoch, "epochs": cfg.epochs, "epoch_step": (start + n + accum - 1) // accum,
                          "epoch_steps": epoch_steps, "step": pos["step"], "total_steps": total_steps,
                          "tokens": run_tokens, "seconds": run_seconds})
            if pos["step"] % cfg.checkpoint_every_steps == 0 and start + n < len(batches):
                checkpoint(epoch, start + n, sums)
        val = validate(model, val_set, val_batches, cfg.pack_len, device, cfg.ttt_steps, cfg.ttt_step_loss_decay, loss_config)
        record = {"epoch": epoch, "step": pos["step"], "lr": sched.get_last_lr()[0], "train": summarize(sums, cfg.ttt_steps), "val": val}
        pos["history"].append(record)
        if log:
            log(record)
        # The epoch kept is the one with the best simulated acceptance length, not the lowest loss.
        if pos["best"] is None or val["tau_sim"] > pos["best"]["val"]["tau_sim"]:
            pos["best"], pos["best_state"] = record, trainable_state(model)
        checkpoint(epoch + 1, 0, {})
    model.load_state_dict({k: v.to(device) for k, v in pos["best_state"].items()}, strict=False)
    return {
        "best": pos["best"], "history": pos["history"], "steps": pos["step"], "resumed_at": resumed_at,
        "step_seconds": round(float(np.median(step_seconds)), 4) if step_seconds else None,
        # online: one target forward per packed batch, train and validation
        "target_forwards_per_epoch": len(plan[0]) + len(val_batches) if online is not None else 0,
        "target_forwards_this_run": train_set.forwards + val_set.forwards if online is not None else 0,
    }


# ---------------------------------------------------------------- output


def vllm_speculator_fields(config: dict) -> dict:
    """What vLLM's speculators config reader takes from a speculators-format EAGLE-3 config.json
    (vllm/transformers_utils/configs/speculators: base.py and update_eagle3 in algos.py)."""
    spec = config["speculators_config"]
    layer = config["transformer_layer_config"]
    return {
        "method": config["speculators_model_type"],
        "num_speculative_tokens": spec["proposal_methods"][0]["speculative_tokens"],
        "verifier": spec["verifier"]["name_or_path"],
        "draft_model_type": layer["model_type"],
        "target_vocab_size": layer["vocab_size"],
        "hidden_size": layer["hidden_size"],
        "draft_vocab_size": config["draft_vocab_size"],
        "eagle_aux_hidden_state_layer_ids": config["eagle_aux_hidden_state_layer_ids"],
        "norm_before_residual": config["norm_before_residual"],
        "norm_before_fc": config["norm_before_fc"],
        "fc_norm": config["fc_norm"],
        "norm_output": config["norm_output"],
    }


def save_draft(model, out_dir: Path) -> dict:
    """Speculators format (config.json + model.safetensors); returns the fields vLLM will read."""
    out_dir = Path(out_dir)
    model.to("cpu").save_pretrained(out_dir)
    fields = vllm_speculator_fields(json.loads((out_dir / "config.json").read_text()))
    if fields["method"] != "eagle3" or fields["draft_model_type"] not in ("llama", "qwen3"):
        raise ValueError(f"{out_dir}/config.json is not an EAGLE-3 speculator vLLM can serve: {fields}")
    return fields


# ---------------------------------------------------------------- multi-GPU hand-off


def verifier_for_speculators(card: dict, directory: Path) -> str:
    """What speculators' train CLI gets as --verifier-name-or-path.

    speculators 0.9.0 reads the verifier's config with AutoConfig and no trust_remote_code
    (Eagle3DraftModel.load_verifier_weights, resolve_target_layer_ids) and takes its tensors by
    suffix match. A target with custom code or a nested text model therefore gets a view in
    `directory`: the text model's config under a model type transformers ships (the one of the
    target's architecture class when the config's own type is custom, e.g. kimi_k2 ->
    deepseek_v3), and an index naming only the card's three verifier tensors, whose shard files
    are linked from the checkpoint. A plain target is passed as it is."""
    if not card.get("trust_remote_code") and card.get("config_model_type", card["model_type"]) == card["model_type"]:
        return card["model"]
    import transformers
    from transformers import CONFIG_MAPPING

    from draftline.target import _checkpoint_file, checkpoint_weight_map, load_config, text_config_of

    model_type = card["model_type"]
    if model_type not in CONFIG_MAPPING:
        arch = getattr(transformers, card["architecture"], None)
        model_type = getattr(getattr(arch, "config_class", None), "model_type", None)
    if model_type not in CONFIG_MAPPING:
        raise InitMismatch(f"train.backend speculators: the target's text model ({card['model_type']}, "
                           f"{card['architecture']}) exists only as its own code, which speculators 0.9.0 loads "
                           "without trust_remote_code; use train.backend builtin")
    text = text_config_of(load_config(card["model"], card.get("revision"), card.get("trust_remote_code", False)))
    config = {**text.to_dict(), "model_type": model_type, "architectures": [card["architecture"]]}
    config.pop("auto_map", None)
    view = Path(directory)
    view.mkdir(parents=True, exist_ok=True)
    (view / "config.json").write_text(json.dumps(config, indent=2, default=str))
    weight_map = checkpoint_weight_map(card["model"], card.get("revision"))
    names = [n for n in card["verifier_tensors"].values() if n]
    index = {"metadata": {}, "weight_map": {n: weight_map[n] for n in names}}
    (view / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    for shard in sorted(set(index["weight_map"].values())):
        link = view / shard
        link.unlink(missing_ok=True)
        link.symlink_to(_checkpoint_file(card["model"], shard, card.get("revision")).resolve())
    return str(view)


def speculators_hidden_states_args(hs_dir: Path, fmt: str = "bf16", online: dict | None = None,
                                   endpoint: str | None = None, staging_dir: Path | None = None) -> list[str]:
    """Where speculators.train gets the states. Offline: the files in hs_dir, read by hs-connectors'
    `file` or `fp8` backend. Online (`online`: hidden_states.online as a dict): `--on-missing
    generate` against the vLLM `endpoint` running extract_hidden_states, the states moved by the
    `file`/`fp8` transfer through `staging_dir` (deleted once loaded) or by `mooncake`."""
    if online is None:
        return ["--hidden-states-path", str(hs_dir), "--on-missing", "raise",
                "--hidden-states-backend", "fp8" if fmt == "fp8" else "file"]
    transfer = online.get("transfer") or ("fp8" if fmt == "fp8" else "file")
    if endpoint is None:
        raise ValueError("online hidden states need the vLLM endpoint (hidden_states.online.endpoint, or a launched server)")
    args = ["--on-missing", "generate", "--vllm-endpoint", endpoint, "--hidden-states-backend", transfer,
            "--request-timeout", str(online["request_timeout_s"]), "--max-retries", str(online["max_retries"])]
    if transfer == "mooncake":
        m = online["mooncake"]
        return args + ["--mooncake-master", m["master"], "--mooncake-metadata-server", m["metadata_server"],
                       "--mooncake-protocol", m["protocol"], "--mooncake-device", m["device"],
                       "--mooncake-global-segment-gib", str(m["global_segment_gib"]),
                       "--mooncake-local-buffer-gib", str(m["local_buffer_gib"])]
    return args + ["--hidden-states-path", str(staging_dir)]


def speculators_train_command(cfg, card: dict, vocab_dir: Path, tokenized_dir: Path, hs_dir: Path,
                              save_path: Path, log_dir: Path, nproc: int, init_dir: Path | None = None,
                              architecture: str = "speculators", hidden_states_args: list[str] | None = None,
                              verifier: str | None = None) -> list[str]:
    """`torchrun ... -m speculators.train ...` with the same params as the builtin loop; the norm
    flags of `architecture` (ARCHITECTURES); `hidden_states_args` (speculators_hidden_states_args)
    say where the states come from, by default the bf16 files in hs_dir.

    Differences speculators imposes: no gradient accumulation (refused in config), gradient
    clipping fixed at 1.0, packed batch = pack_len tokens per GPU; it saves a checkpoint per
    epoch under save_path and resumes from the last one on rerun. verifier: what it loads the
    verifier from (verifier_for_speculators), the card's model when None."""
    d2t, _ = load_vocab(vocab_dir)
    torchrun = ["torchrun", f"--nproc-per-node={nproc}"]
    torchrun += list(cfg.torchrun_args) or ["--standalone", "--nnodes=1"]
    args = [
        "--speculator-type", "eagle3",
        "--verifier-name-or-path", verifier or card["model"],
        "--data-path", str(tokenized_dir),
        *(hidden_states_args or speculators_hidden_states_args(hs_dir)),
        "--d2t-path", str(Path(vocab_dir) / "d2t.npy"),
        "--t2d-path", str(Path(vocab_dir) / "t2d.npy"),
        "--draft-vocab-size", str(int(d2t.shape[0])),
        "--target-layer-ids", *[str(i) for i in card["aux_layer_ids"]],
        *[f"--{'' if on else 'no-'}{key.replace('_', '-')}" for key, on in ARCHITECTURES[architecture].items()],
        "--total-seq-len", str(cfg.pack_len),
        "--train-data-ratio", str(1 - cfg.val_fraction),
        "--hidden-states-dtype", "bfloat16",
        "--epochs", str(cfg.epochs),
        "--lr", str(cfg.lr),
        "--optimizer", "adamw",
        "--weight-decay", str(cfg.weight_decay),
        "--scheduler-type", cfg.scheduler,
        "--scheduler-warmup-steps", str(cfg.warmup_steps),
        "--ttt-steps", str(cfg.ttt_steps),
        "--ttt-step-loss-decay", str(cfg.ttt_step_loss_decay),
        "--loss-fn", "kl_div",
        "--seed", str(cfg.seed),
        "--num-workers", str(cfg.num_workers),
        "--save-path", str(save_path),
        "--log-dir", str(log_dir),
        "--checkpoint-freq", "1",
    ]
    if init_dir is not None:  # the checkpoint defines the decoder; shaping flags would conflict
        args += ["--from-pretrained", str(init_dir)]
    else:
        args += ["--num-layers", str(cfg.num_layers), "--draft-arch", "llama",
                 "--full-attention-indices", *[str(i) for i in range(cfg.num_layers)]]
    if cfg.train_embeddings:
        args.append("--embed-requires-grad")
    if card.get("trust_remote_code"):
        args.append("--trust-remote-code")
    if cfg.fsdp:
        args.append("--fsdp-shard")
    return torchrun + ["-m", "speculators.train"] + args


def epoch_checkpoints(save_path: Path) -> list[Path]:
    """speculators' per-epoch checkpoint directories (save_path/<epoch>/), in epoch order."""
    dirs = [d for d in Path(save_path).iterdir() if d.is_dir() and not d.is_symlink() and d.name.isdigit()]
    return sorted(dirs, key=lambda d: int(d.name))


def best_speculators_epoch(save_path: Path, cfg, card: dict, tokenized_dir: Path, hs_dir: Path, device: str, log=None,
                           online: OnlineStates | None = None):
    """(draft, result): of speculators' per-epoch checkpoints, the one with the best validation
    tau_sim on the same held-out rows (speculators itself can only keep the lowest loss)."""
    from speculators.losses import resolve_loss_config

    dtype = hidden_states_dtype(device)
    val_set = make_dataset(tokenized_dir, hs_dir, "val", 1 - cfg.val_fraction, cfg.pack_len, dtype, online)
    batches = epoch_batches(val_set, cfg.pack_len, cfg.seed, 0)
    loss_config = resolve_loss_config("kl_div", "eager" if device == "cpu" else "fused")
    best, best_model, history = None, None, []
    checkpoints = epoch_checkpoints(save_path)
    if not checkpoints:
        raise FileNotFoundError(f"{save_path}: speculators train left no epoch checkpoints")
    for directory in checkpoints:
        model = load_saved_draft(directory, card, "eager" if device == "cpu" else "simple_flex_attention").float().to(device)
        val = validate(model, val_set, batches, cfg.pack_len, device, cfg.ttt_steps, cfg.ttt_step_loss_decay, loss_config)
        record = {"epoch": int(directory.name), "train": None, "val": val, "checkpoint": str(directory)}
        history.append(record)
        if log:
            log(record)
        if best is None or val["tau_sim"] > best["val"]["tau_sim"]:
            best, best_model = record, model
    return best_model, {"best": best, "history": history, "steps": None, "step_seconds": None, "resumed_at": None}
