"""The speculators backend of the train stage (train.backend: speculators): the hand-off to
`torchrun -m speculators.train` on several GPUs, and the choice of its best epoch.

Its command carries the same params as the builtin loop; speculators saves a checkpoint per epoch
under models/draft_checkpoints/speculators and resumes from the last one on rerun. The epoch kept
is the one with the best validation tau_sim on the builtin loop's held-out rows. With
hidden_states.mode online the trainers ask a vLLM extraction server for the states: an external
one (checked first) or one launched here for the run (draftline/hidden_states/online_server.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from draftline.core.errors import DraftlineError
from draftline.draft.checkpoint import (
    ARCHITECTURES,
    ORIGINAL_NORMS,
    architecture_of,
    load_saved_draft,
    load_vocab,
)
from draftline.draft.forward import device_loss_config, loss_spec
from draftline.draft.init_checks import InitMismatch
from draftline.draft.methods import Forward, drafter
from draftline.draft.metrics import validate_many
from draftline.draft.model import method_mask_token_id, speculators_config
from draftline.draft.pretrained import load_init_draft
from draftline.hidden_states.online_server import (
    OnlineServerJob,
    online_server,
    speculators_hidden_states_args,
)
from draftline.targets.model import (
    _checkpoint_file,
    checkpoint_weight_map,
    load_config,
    text_config_of,
)
from draftline.train.data import (
    OnlineStates,
    TrainingData,
    VllmOnline,
    check_target_fits,
    epoch_batches,
    layout_of,
    make_dataset,
    make_loader,
    online_states,
)

if TYPE_CHECKING:
    from draftline.core.card import TargetCard
    from draftline.train.config import TrainConfig
    from draftline.train.paths import TrainJob

log = logging.getLogger(__name__)


class SpeculatorsRefused(DraftlineError):
    """The speculators hand-off cannot run here, or its run failed; the message says why and the
    way out."""


def verifier_for_speculators(card: TargetCard, directory: Path) -> str:
    """What speculators' train CLI gets as --verifier-name-or-path.

    speculators 0.9.0 reads the verifier's config with AutoConfig and no trust_remote_code
    (Eagle3DraftModel.load_verifier_weights, resolve_target_layer_ids) and takes its tensors by
    suffix match. A target with custom code or a nested text model therefore gets a view in
    `directory`: the text model's config under a model type transformers ships (the one of the
    target's architecture class when the config's own type is custom, e.g. kimi_k2 ->
    deepseek_v3), and an index naming only the card's three verifier tensors, whose shard files
    are linked from the checkpoint. A plain target is passed as it is."""
    if (
        not card.trust_remote_code
        and (card.config_model_type or card.model_type) == card.model_type
    ):
        return card.model
    # transformers loads on first use: only the speculators backend needs it
    import transformers
    from transformers import CONFIG_MAPPING

    model_type = card.model_type
    if model_type not in CONFIG_MAPPING:
        arch = getattr(transformers, card.architecture, None)
        model_type = getattr(getattr(arch, "config_class", None), "model_type", None)
    if model_type not in CONFIG_MAPPING:
        raise InitMismatch(
            f"train.backend speculators: the target's text model ({card.model_type}, "
            f"{card.architecture}) exists only as its own code, which speculators 0.9.0 loads "
            "without trust_remote_code; use train.backend builtin"
        )
    text = text_config_of(load_config(card.model, card.revision, card.trust_remote_code))
    config = {**text.to_dict(), "model_type": model_type, "architectures": [card.architecture]}
    config.pop("auto_map", None)
    view = Path(directory)
    view.mkdir(parents=True, exist_ok=True)
    (view / "config.json").write_text(json.dumps(config, indent=2, default=str))
    weight_map = checkpoint_weight_map(card.model, card.revision)
    names = [n for n in card.verifier_tensors.values() if n]
    index = {"metadata": {}, "weight_map": {n: weight_map[n] for n in names}}
    (view / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    for shard in sorted(set(index["weight_map"].values())):
        link = view / shard
        link.unlink(missing_ok=True)
        link.symlink_to(_checkpoint_file(card.model, shard, card.revision).resolve())
    return str(view)


@dataclass(frozen=True)
class SpeculatorsLaunch:
    """One `speculators.train` run beside the train params: what it reads (the draft vocabulary,
    the tokenized rows, the hidden_states stage's directory), where it saves a checkpoint per
    epoch (save_path) and its logs, on how many GPUs, and optionally the checkpoint it starts
    from, the norms (`architecture`, an ARCHITECTURES name), where the states come from
    (speculators_hidden_states_args; None: the bf16 files in hs) and what it loads the verifier
    from (verifier_for_speculators; None: the card's model)."""

    vocab: Path
    tokenized: Path
    hs: Path
    save_path: Path
    log_dir: Path
    nproc: int
    init_dir: Path | None = None
    architecture: str = "speculators"
    hidden_states_args: list[str] | None = None
    verifier: str | None = None


def speculators_train_command(
    cfg: TrainConfig, card: TargetCard, launch: SpeculatorsLaunch
) -> list[str]:
    """`torchrun ... -m speculators.train ...` with the same params as the builtin loop.

    Differences speculators imposes: no gradient accumulation (refused in config), gradient
    clipping fixed at norm 1, packed batch = pack_len tokens per GPU; it saves a checkpoint per
    epoch under launch.save_path and resumes from the last one on rerun."""
    torchrun = ["torchrun", f"--nproc-per-node={launch.nproc}"]
    torchrun += list(cfg.torchrun_args) or ["--standalone", "--nnodes=1"]
    args = [
        *_speculators_data_args(cfg, card, launch),
        *_speculators_training_args(cfg),
        "--save-path",
        str(launch.save_path),
        "--log-dir",
        str(launch.log_dir),
        "--checkpoint-freq",
        "1",
        *_speculators_shape_args(cfg, card, launch.init_dir),
    ]
    return torchrun + ["-m", "speculators.train"] + args


def _speculators_data_args(
    cfg: TrainConfig, card: TargetCard, launch: SpeculatorsLaunch
) -> list[str]:
    """speculators_train_command's verifier, data, draft vocabulary, aux layers, norm flags and
    packing arguments."""
    d2t, _ = load_vocab(launch.vocab)
    return [
        "--speculator-type",
        cfg.method,
        "--verifier-name-or-path",
        launch.verifier or card.model,
        "--data-path",
        str(launch.tokenized),
        *(launch.hidden_states_args or speculators_hidden_states_args(launch.hs)),
        "--d2t-path",
        str(Path(launch.vocab) / "d2t.npy"),
        "--t2d-path",
        str(Path(launch.vocab) / "t2d.npy"),
        "--draft-vocab-size",
        str(int(d2t.shape[0])),
        "--target-layer-ids",
        *[str(i) for i in card.aux_ids],
        *(
            [
                f"--{'' if on else 'no-'}{key.replace('_', '-')}"
                for key, on in ARCHITECTURES[launch.architecture].items()
            ]
            if drafter(cfg.method).eagle_layout
            else []
        ),
        *_speculators_method_args(cfg, card),
        "--total-seq-len",
        str(cfg.pack_len),
        "--train-data-ratio",
        str(1 - cfg.val_fraction),
        "--hidden-states-dtype",
        "bfloat16",
    ]


def _speculators_method_args(cfg: TrainConfig, card: TargetCard) -> list[str]:
    """train.method's own arguments (P-EAGLE's depths and COD sampling, DFlash's block), with the
    mask token a masked method reads resolved here, as the builtin loop does."""
    return drafter(cfg.method).speculators_args(cfg, method_mask_token_id(card, cfg))


def _speculators_training_args(cfg: TrainConfig) -> list[str]:
    """speculators_train_command's optimizer, schedule, loss (train.loss, and EAGLE-3's TTT step
    weighting), seed and loader arguments: the builtin loop's train params."""
    return [
        "--epochs",
        str(cfg.epochs),
        "--lr",
        str(cfg.lr),
        "--optimizer",
        "adamw",
        "--weight-decay",
        str(cfg.weight_decay),
        "--scheduler-type",
        cfg.scheduler,
        "--scheduler-warmup-steps",
        str(cfg.warmup_steps),
        "--ttt-steps",
        str(cfg.ttt_steps),
        "--ttt-step-loss-decay",
        str(cfg.ttt_step_loss_decay),
        "--loss-fn",
        loss_spec(cfg.loss),
        "--seed",
        str(cfg.seed),
        "--num-workers",
        str(cfg.num_workers),
    ]


def _speculators_shape_args(cfg: TrainConfig, card: TargetCard, init_dir: Path | None) -> list[str]:
    """speculators_train_command's draft decoder (train.init's checkpoint, or num_layers llama
    layers) and its switches: trained embeddings, the target's remote code, FSDP."""
    if init_dir is not None:  # the checkpoint defines the decoder; shaping flags would conflict
        args = ["--from-pretrained", str(init_dir)]
    else:
        args = [
            "--num-layers",
            str(cfg.num_layers),
            "--draft-arch",
            drafter(cfg.method).decoder,
            "--full-attention-indices",
            *[str(i) for i in range(cfg.num_layers)],
        ]
    if cfg.train_embeddings:
        args.append("--embed-requires-grad")
    if card.trust_remote_code:
        args.append("--trust-remote-code")
    if cfg.fsdp:
        args.append("--fsdp-shard")
    return args


RETARGETED_INIT_DIR = "init_retargeted"  # under models/draft_checkpoints


def retarget_init(
    cfg: TrainConfig,
    card: TargetCard,
    vocab_dir: Path,
    init_dir: Path,
    out_dir: Path,
    verifier: str,
) -> tuple[Path, list[str], str | None]:
    """(out_dir, remap notes, architecture): train.init checked and re-targeted as in the builtin
    loop (load_init_draft: our aux ids, draft vocabulary, verifier tensors, the drafter's own
    lm_head on our vocabulary), saved as the checkpoint `--from-pretrained` starts from.

    speculators 0.9.0 keeps what such a checkpoint holds: its from_pretrained loads lm_head.weight
    and load_verifier_weights fills lm_head from the verifier only when it is missing (NaN), then
    freezes it (train.train_lm_head is refused for this backend). The config's verifier is
    `verifier` (verifier_for_speculators): speculators reads it to resolve the aux layers and load
    the verifier tensors, without trust_remote_code. architecture: the ARCHITECTURES name of its
    norms, None when the train CLI cannot set them."""
    model, notes = load_init_draft(init_dir, card, vocab_dir, cfg)
    model.config.speculators_config.verifier.name_or_path = verifier
    model.save_pretrained(out_dir)
    return out_dir, notes, cfg.architecture or architecture_of(model.config)


def epoch_checkpoints(save_path: Path) -> list[Path]:
    """speculators' per-epoch checkpoint directories (save_path/<epoch>/), in epoch order."""
    dirs = [
        d
        for d in Path(save_path).iterdir()
        if d.is_dir() and not d.is_symlink() and d.name.isdigit()
    ]
    return sorted(dirs, key=lambda d: int(d.name))


# share of the memory free on the selection's device the epoch drafts scored together may take
# (the rest: the packed batch, activations, the draft kept so far)
SELECTION_MEMORY_SHARE = 0.5


def drafts_per_pass(model_bytes: int, device: str) -> int:
    """How many epoch drafts of `model_bytes` each best-epoch selection scores in one pass over the
    validation packs: what SELECTION_MEMORY_SHARE of the memory free now holds (GPU 0's, or the
    RAM), at least 1."""
    import psutil
    import torch

    if device.startswith("cuda"):
        free = torch.cuda.mem_get_info(0)[0]
    else:
        free = psutil.virtual_memory().available
    return max(1, int(SELECTION_MEMORY_SHARE * free // max(model_bytes, 1)))


def model_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def best_speculators_epoch(
    save_path: Path,
    cfg: TrainConfig,
    card: TargetCard,
    data: TrainingData,
    device: str,
    on_epoch=None,
):
    """(draft, result): of speculators' per-epoch checkpoints, the one with the best validation
    tau_sim on the same held-out rows (speculators itself can only keep the lowest loss); each
    epoch's record to on_epoch.

    The epoch drafts are scored together (draftline/draft/metrics.py validate_many): each
    validation pack is read once, read ahead by train.loader_workers threads (with data.online,
    the target computes it once), and goes through every draft of the pass; as many drafts share a
    pass as fit the device (drafts_per_pass), so the split is read once in all when they fit, never
    more than once per epoch."""
    val_set = make_dataset(data, "val", 1 - cfg.val_fraction, cfg.pack_len, device)
    batches = epoch_batches(val_set, cfg.pack_len, cfg.seed, 0)
    loss_config = device_loss_config(device, cfg.loss)
    workers = 0 if data.online is not None else cfg.loader_workers
    checkpoints = epoch_checkpoints(save_path)
    if not checkpoints:
        raise FileNotFoundError(f"{save_path}: speculators train left no epoch checkpoints")

    def load(directory: Path):
        attn = "eager" if device == "cpu" else "simple_flex_attention"
        return load_saved_draft(directory, card, attn).float().to(device)

    best, best_model, history = None, None, []
    first = load(checkpoints[0])
    per_pass = drafts_per_pass(model_bytes(first), device)
    for start in range(0, len(checkpoints), per_pass):
        group = checkpoints[start : start + per_pass]
        models = [first if first is not None else load(group[0])]
        models += [load(d) for d in group[1:]]
        first = None
        hidden_size = models[0].config.transformer_layer_config.hidden_size
        packs = make_loader(val_set, batches, layout_of(cfg, hidden_size), device, workers)
        vals = validate_many(models, packs, device, Forward.for_training(cfg), loss_config)
        for directory, model, val in zip(group, models, vals):
            record = {
                "epoch": int(directory.name),
                "train": None,
                "val": val,
                "checkpoint": str(directory),
            }
            history.append(record)
            if on_epoch:
                on_epoch(record)
            if best is None or val["tau_sim"] > best["val"]["tau_sim"]:
                best, best_model = record, model
        del models, model  # the drafts not kept are freed before the next pass loads its own
    return best_model, {
        "best": best,
        "history": history,
        "steps": None,
        "step_seconds": None,
        "resumed_at": None,
        "validation_passes": -(-len(checkpoints) // per_pass),
    }


# ---------------------------------------------------------------- the train stage's run


def run_speculators(cfg: TrainConfig, card: TargetCard, job: TrainJob, on_epoch, live_dir: Path):
    """(model, result, init remap notes): speculators trains on the visible GPUs, then the epoch with
    the best validation tau_sim is loaded; each epoch's record to on_epoch."""
    paths, source = job.paths, job.source
    nproc = _speculators_gpus(cfg)
    online_cfg = source.get("online") or {}
    mooncake = source["mode"] == "online" and online_cfg.get("transfer") == "mooncake"
    if mooncake:  # best-epoch selection then loads it after training: check first
        check_target_fits(card, "cuda", "best-epoch selection of the online mode with mooncake")
    verifier, init_dir, notes, architecture = _speculators_init(cfg, card, job)
    save_path = paths.state / "speculators"
    with contextlib.ExitStack() as stack:
        endpoint = staging = launched = None
        if source["mode"] == "online":  # the server the trainers ask for states, stopped after
            server_job = OnlineServerJob.for_training(
                source, paths.tokenized, paths.state, live_dir
            )
            endpoint, staging, launched = stack.enter_context(online_server(card, server_job))[:3]
        hs_args = speculators_hidden_states_args(
            paths.hs,
            source["format"],
            online_cfg if endpoint else None,
            endpoint,
            staging,
        )
        launch = SpeculatorsLaunch(
            paths.vocab,
            paths.tokenized,
            paths.hs,
            save_path,
            live_dir / "speculators",
            nproc,
            init_dir,
            architecture,
            hs_args,
            verifier,
        )
        _launch_speculators(speculators_train_command(cfg, card, launch), launched, live_dir)
        online = _selection_states(card, source, online_cfg, mooncake, endpoint, staging)
        data = TrainingData(paths.tokenized, paths.hs, online)
        model, result = best_speculators_epoch(save_path, cfg, card, data, "cuda", on_epoch)
    model.config.speculators_config = speculators_config(
        card, drafter(cfg.method).speculative_tokens(cfg), cfg.method
    )  # the target, not the view
    return model, result, notes


def _speculators_gpus(cfg: TrainConfig) -> int:
    """How many GPUs speculators trains on: train.gpus, or every visible one (none: an error)."""
    import torch

    nproc = cfg.gpus or torch.cuda.device_count()
    if nproc < 1:
        raise SpeculatorsRefused(
            "error: train.backend: speculators needs CUDA GPUs (none visible); use backend builtin"
        )
    return nproc


def _speculators_init(
    cfg: TrainConfig, card: TargetCard, job: TrainJob
) -> tuple[str, Path | None, list[str], str]:
    """(verifier, init_dir, remap notes, architecture) of the train command: the verifier view
    (verifier_for_speculators) and train.init re-targeted (retarget_init); an init whose norms
    the train CLI cannot set (SpeculatorsRefused), or a target it cannot load (InitMismatch), is
    an error."""
    paths, init_dir = job.paths, job.init_dir
    verifier = verifier_for_speculators(card, paths.state / "verifier_view")
    notes, architecture = [], cfg.architecture or "speculators"
    if init_dir is not None:
        init_dir, notes, architecture = retarget_init(
            cfg, card, paths.vocab, init_dir, paths.state / RETARGETED_INIT_DIR, verifier
        )
    if architecture is None:
        raise SpeculatorsRefused(
            "error: train.init has norms speculators' train CLI cannot set (fc_norm, or a mix of "
            f"{sorted(ARCHITECTURES[ORIGINAL_NORMS])}); fine-tune it with train.backend: builtin"
        )
    return verifier, init_dir, notes, architecture


def _launch_speculators(cmd: list[str], launched: list[str] | None, live_dir: Path) -> None:
    """Run speculators' train command, first written to live_dir/command.txt (after the command of
    the extraction server launched for it, if any) and logged; its failure is an error."""
    live_dir.mkdir(parents=True, exist_ok=True)
    (live_dir / "command.txt").write_text(
        "\n".join(" ".join(c) for c in ([launched] if launched else []) + [cmd]) + "\n"
    )
    log.info(" ".join(cmd))
    if subprocess.run(cmd).returncode != 0:
        raise SpeculatorsRefused(
            f"error: speculators train failed; command in {live_dir / 'command.txt'}"
        )


def _selection_states(
    card: TargetCard, source: dict, online_cfg: dict, mooncake: bool, endpoint, staging
) -> OnlineStates | VllmOnline | None:
    """Where best-epoch selection gets the validation rows' states, online: from the same server
    (the target is never loaded here), except through Mooncake, whose store the builtin loop does
    not read (then the target); None when they are files."""
    if source["mode"] != "online":
        return None
    return (
        online_states(card, source, "cuda")
        if mooncake
        else VllmOnline.of(online_cfg, endpoint, staging)
    )
