"""Training the draft: the builtin loop (CPU float32, or one GPU with bf16 autocast) and the train
stage's run around it: checks of the data and train.init, the backend (this loop, or the
speculators hand-off in draftline/train/speculators.py), and the swap of the new draft into models/draft;
its logging, progress lines and report are in draftline/train/progress.py.

The loop reuses speculators' data path (draftline/train/data.py) and the draft's own TTT
forward/loss and metrics (draftline/draft/forward.py, draftline/draft/metrics.py); CPU runs eager
attention and the eager loss, a GPU flex attention and the fused loss, as speculators does. It
saves resume state as it goes (draftline/train/resume.py). The epoch kept is the one with the
best validation tau_sim, not the lowest loss.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from draftline.core.card import TargetCard
from draftline.core.config import resolve_device
from draftline.core.io import write_meta
from draftline.draft.checkpoint import dir_sha256
from draftline.draft.forward import PackLayout, autocast, device_loss_config, run_batch
from draftline.draft.methods import Forward
from draftline.draft.metrics import accumulate, summarize, validate
from draftline.draft.model import build_draft, init_layer_from_target, save_draft
from draftline.draft.pretrained import load_init_draft, prepare_init, resolve_init
from draftline.hidden_states.online_server import OnlineServerJob, online_server
from draftline.train.data import (
    OnlineStates,
    TrainingData,
    VllmOnline,
    check_hidden_states,
    epoch_batches,
    hidden_states_source,
    layout_of,
    make_dataset,
    make_loader,
    online_states,
    trained_rows,
    training_data_sha256,
)
from draftline.train.paths import Paths, TrainJob, TrainPaths
from draftline.train.progress import epoch_logger, step_reporter, train_report
from draftline.train.resume import (
    STATE_FILE,
    Resume,
    check_state_fits,
    load_state,
    rng_states,
    run_derivation,
    save_state,
    seed_everything,
    set_rng_states,
    trainable_state,
)
from draftline.train.speculators import run_speculators

if TYPE_CHECKING:
    from draftline.train.config import TrainConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainRun:
    """What a finished train run hands back: the metrics report, and for the builtin loop the small
    record finish_state keeps once the report is written (None for the speculators backend)."""

    report: dict
    last_run: dict | None


# ---------------------------------------------------------------- the loop


def make_scheduler(opt, kind: str, warmup_steps: int, total_steps: int):
    """speculators' schedules (transformers' warmup + cosine / linear decay to 0)."""
    # transformers and dvclive load on first use: importing the train modules loads torch only
    from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

    make = get_cosine_schedule_with_warmup if kind == "cosine" else get_linear_schedule_with_warmup
    return make(
        opt, num_warmup_steps=min(warmup_steps, total_steps), num_training_steps=total_steps
    )


@dataclass(frozen=True)
class LoopCallbacks:
    """What train_draft tells as it goes. epoch(record): each epoch's record, in order, those a
    resume restores included. step(p): after every optimizer step, where the run stands: epoch,
    epochs, epoch_step, epoch_steps, step, total_steps, and the tokens and seconds of this run's
    steps so far (for tokens/s and an ETA)."""

    epoch: Callable[[dict], None] | None = None
    step: Callable[[dict], None] | None = None


def train_draft(
    model,
    cfg: TrainConfig,
    data: TrainingData,
    device: str,
    resume: Resume | None = None,
    callbacks: LoopCallbacks | None = None,
) -> dict:
    """Train in place; returns the best epoch's validation summary and restores its weights.

    With `resume`, continues from a matching state in its directory and saves state as it goes.
    With data.online, the target makes each packed batch's states (no files are read), or a vLLM
    extraction server each row's."""
    callbacks = callbacks or LoopCallbacks()
    loop = _setup_loop(model, cfg, data, device, resume)
    resumed_at = _resume(loop)
    for record in loop.pos["history"]:
        if callbacks.epoch:
            callbacks.epoch(record)
    for epoch in range(loop.pos["epoch"], cfg.epochs):
        sums = _train_epoch(loop, epoch, callbacks.step)
        _end_epoch(loop, epoch, sums, callbacks.epoch)
    model.load_state_dict(
        {k: v.to(device) for k, v in loop.pos["best_state"].items()}, strict=False
    )
    return _train_result(loop, resumed_at)


@dataclass
class _Loop:
    """One train_draft run: its data, model, optimizer and schedule, and where it stands (pos: what
    the resume state saves and restores; the step times and tokens of this run's steps)."""

    model: torch.nn.Module
    cfg: TrainConfig
    device: str
    online: OnlineStates | VllmOnline | None
    hidden_size: int
    forward: Forward  # the method's forward arguments (draftline/draft/methods/)
    train_set: Any  # make_dataset's ArrowDataset
    val_set: Any
    plan: list[list[list[int]]]  # per epoch, its packed batches of row indices
    val_batches: list[list[int]]
    total_steps: int
    loss_config: Any
    workers: int
    params: list[torch.nn.Parameter]
    opt: torch.optim.Optimizer
    sched: Any
    pos: dict
    resume: Resume | None
    step_seconds: list[float] = field(default_factory=list)
    run_tokens: int = 0
    run_seconds: float = 0.0

    @property
    def layout(self) -> PackLayout:
        return layout_of(self.cfg, self.hidden_size)


def _training_data(cfg: TrainConfig, data: TrainingData, device: str):
    """(train set, val set, each epoch's packed train batches, the val batches): the split and its
    packing plan, fixed by the seed before the first step."""
    train_ratio = 1 - cfg.val_fraction
    train_set = make_dataset(data, "train", train_ratio, cfg.pack_len, device)
    val_set = make_dataset(data, "val", train_ratio, cfg.pack_len, device)
    plan = [epoch_batches(train_set, cfg.pack_len, cfg.seed, e) for e in range(cfg.epochs)]
    val_batches = epoch_batches(val_set, cfg.pack_len, cfg.seed, 0)
    return train_set, val_set, plan, val_batches


def _setup_loop(
    model, cfg: TrainConfig, data: TrainingData, device: str, resume: Resume | None
) -> _Loop:
    """train_draft's run at its start: the data, the loss, the model moved to `device`, its
    optimizer and schedule over the whole run's steps."""
    hidden_size = model.config.transformer_layer_config.hidden_size
    train_set, val_set, plan, val_batches = _training_data(cfg, data, device)
    accum = cfg.grad_accum_steps
    total_steps = sum(math.ceil(len(b) / accum) for b in plan)
    # online: the target computes each pack on the train device, nothing to read ahead of the
    # step; a vLLM server's answers are read ahead as files are (the threads' requests overlap)
    workers = 0 if isinstance(data.online, OnlineStates) else cfg.loader_workers

    model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = make_scheduler(opt, cfg.scheduler, cfg.warmup_steps, total_steps)
    pos = {
        "epoch": 0,
        "batch": 0,
        "step": 0,
        "train_sums": {},
        "history": [],
        "best": None,
        "best_state": None,
    }
    return _Loop(
        model=model,
        cfg=cfg,
        device=device,
        online=data.online,
        hidden_size=hidden_size,
        forward=Forward.for_training(cfg),
        train_set=train_set,
        val_set=val_set,
        plan=plan,
        val_batches=val_batches,
        total_steps=total_steps,
        loss_config=device_loss_config(device, cfg.loss),
        workers=workers,
        params=params,
        opt=opt,
        sched=sched,
        pos=pos,
        resume=resume,
    )


def _resume(loop: _Loop) -> dict | None:
    """With a matching state in loop.resume's directory, restore the weights, optimizer, schedule,
    RNG and position from it; returns where the run resumes (None when it starts fresh)."""
    if loop.resume is None:
        return None
    state = load_state(loop.resume.state_dir, loop.resume.fingerprint, loop.resume.derivation)
    if state is None:
        return None
    check_state_fits(state, loop.model, loop.resume.state_dir / STATE_FILE)
    loop.model.load_state_dict(
        {k: v.to(loop.device) for k, v in state["model"].items()}, strict=False
    )
    loop.opt.load_state_dict(state["optimizer"])
    loop.sched.load_state_dict(state["scheduler"])
    set_rng_states(state["rng"])
    loop.pos = {k: state[k] for k in loop.pos}
    pos = loop.pos
    if pos["epoch"] >= loop.cfg.epochs:
        log.info(
            f"the finished run's state matches (step {pos['step']} of {loop.total_steps}): "
            "nothing to train, the best epoch's weights are written again"
        )
    else:
        log.info(
            f"resuming at epoch {pos['epoch']}, batch {pos['batch']}, step {pos['step']} of "
            f"{loop.total_steps}"
        )
    return {k: pos[k] for k in ("epoch", "batch", "step")}


def _save_checkpoint(loop: _Loop, epoch: int, batch: int, sums: dict) -> None:
    """Save the resume state (when the run has one): the run resumes at `batch` of `epoch` with
    these train metric sums."""
    if loop.resume is None:
        return
    save_state(
        loop.resume.state_dir,
        {
            "fingerprint": loop.resume.fingerprint,
            # the key's parts: a rerun names what changed
            "key": loop.resume.derivation.record() if loop.resume.derivation else None,
            "epoch": epoch,
            "batch": batch,
            "step": loop.pos["step"],
            "train_sums": dict(sums),
            "history": loop.pos["history"],
            "best": loop.pos["best"],
            "best_state": loop.pos["best_state"],
            "model": trainable_state(loop.model),
            "optimizer": loop.opt.state_dict(),
            "scheduler": loop.sched.state_dict(),
            "rng": rng_states(),
        },
    )


def _optimizer_step(loop: _Loop, loader, n: int, sums: dict) -> None:
    """One optimizer step over the loader's next n packed batches (their losses averaged, the
    gradient clipped); their metrics are added to sums."""
    cfg = loop.cfg
    loop.opt.zero_grad(set_to_none=True)
    for _ in range(n):
        with autocast(loop.device):
            _, loss, metrics = run_batch(
                loop.model, next(loader), loop.device, loop.forward, loop.loss_config
            )
        (loss / n).backward()
        accumulate(sums, metrics)
    torch.nn.utils.clip_grad_norm_(loop.params, cfg.max_grad_norm)
    loop.opt.step()
    loop.sched.step()


def _train_epoch(loop: _Loop, epoch: int, progress) -> dict:
    """One epoch's optimizer steps (the resumed epoch from its saved batch and sums), each followed
    by progress and, every train.checkpoint_every_steps, the resume state; returns the epoch's
    train metric sums."""
    cfg, pos, batches = loop.cfg, loop.pos, loop.plan[epoch]
    accum = cfg.grad_accum_steps
    epoch_steps = math.ceil(len(batches) / accum)
    first = pos["batch"] if epoch == pos["epoch"] else 0
    sums = dict(pos["train_sums"]) if epoch == pos["epoch"] else {}
    loop.model.train()
    loader = iter(
        make_loader(loop.train_set, batches[first:], loop.layout, loop.device, loop.workers)
    )
    for start in range(first, len(batches), accum):
        began = time.perf_counter()
        n = min(accum, len(batches) - start)  # the last group of an epoch may be short
        _optimizer_step(loop, loader, n, sums)
        pos["step"] += 1
        loop.step_seconds.append(time.perf_counter() - began)
        loop.run_tokens += sum(
            loop.train_set.approx_lengths[i] for batch in batches[start : start + n] for i in batch
        )
        loop.run_seconds += loop.step_seconds[-1]
        if progress:
            progress(
                {
                    "epoch": epoch,
                    "epochs": cfg.epochs,
                    "epoch_step": (start + n + accum - 1) // accum,
                    "epoch_steps": epoch_steps,
                    "step": pos["step"],
                    "total_steps": loop.total_steps,
                    "tokens": loop.run_tokens,
                    "seconds": loop.run_seconds,
                }
            )
        if pos["step"] % cfg.checkpoint_every_steps == 0 and start + n < len(batches):
            _save_checkpoint(loop, epoch, start + n, sums)
    return sums


def _end_epoch(loop: _Loop, epoch: int, sums: dict, on_epoch) -> None:
    """Validate the epoch's draft, record the epoch and pass it to on_epoch, keep its weights when
    it is the best so far, and save the resume state at the next epoch's start."""
    pos = loop.pos
    packs = make_loader(loop.val_set, loop.val_batches, loop.layout, loop.device, loop.workers)
    val = validate(loop.model, packs, loop.device, loop.forward, loop.loss_config)
    record = {
        "epoch": epoch,
        "step": pos["step"],
        "lr": loop.sched.get_last_lr()[0],
        "train": summarize(sums, loop.forward),
        "val": val,
    }
    pos["history"].append(record)
    if on_epoch:
        on_epoch(record)
    # The epoch kept is the one with the best simulated acceptance length, not the lowest loss.
    if pos["best"] is None or val["tau_sim"] > pos["best"]["val"]["tau_sim"]:
        pos["best"], pos["best_state"] = record, trainable_state(loop.model)
    _save_checkpoint(loop, epoch + 1, 0, {})


def _train_result(loop: _Loop, resumed_at: dict | None) -> dict:
    """train_draft's result: the best epoch's record, every epoch's, the steps, where the run
    resumed, the median step time, and the target forwards of the online mode."""
    pos, step_seconds = loop.pos, loop.step_seconds
    return {
        "best": pos["best"],
        "history": pos["history"],
        "steps": pos["step"],
        "resumed_at": resumed_at,
        "step_seconds": round(float(np.median(step_seconds)), 4) if step_seconds else None,
        # online: one target forward per packed batch, train and validation (a vLLM server's
        # work is counted in its own log)
        "target_forwards_per_epoch": len(loop.plan[0]) + len(loop.val_batches)
        if isinstance(loop.online, OnlineStates)
        else 0,
        "target_forwards_this_run": loop.train_set.forwards + loop.val_set.forwards
        if isinstance(loop.online, OnlineStates)
        else 0,
    }


# ---------------------------------------------------------------- the train stage's run


def run_builtin(cfg: TrainConfig, card: TargetCard, job: TrainJob, on_epoch):
    """(model, result, init remap notes) of the builtin loop, resumed from job.paths.state when it
    matches; each epoch's record to on_epoch."""
    paths, source = job.paths, job.source
    device = resolve_device(cfg.device)
    # the vocabulary's maps are .npy files (d2t, t2d): the digest reads them, not only its json
    vocab = dir_sha256(paths.vocab, ("*.json", "*.safetensors", "*.npy"))
    inputs = {"data": job.data_sha256, "init": job.init_sha256, "vocab": vocab}
    wanted = run_derivation(
        cfg.model_dump(),
        card,
        inputs,
        device,
        vllm=job.source["mode"] == "online"
        and (job.source.get("online") or {}).get("engine", "hf") == "vllm",
    )
    attn = "eager" if device == "cpu" else "simple_flex_attention"
    online_cfg = source.get("online") or {}
    vllm_online = source["mode"] == "online" and online_cfg.get("engine", "hf") == "vllm"
    # before seeding: loading the target must not move the RNG the draft is built and trained with
    online = (
        online_states(card, source, device)
        if source["mode"] == "online" and not vllm_online
        else None
    )
    seed_everything(cfg.seed)
    if job.init_dir is None:
        model = build_draft(card, paths.vocab, cfg, attn)
        notes = []
        if cfg.init_layer_from_target is not None:
            notes.append(init_layer_from_target(model, card, cfg.init_layer_from_target))
            log.info(f"train: {notes[-1]}")
    else:
        model, notes = load_init_draft(job.init_dir, card, paths.vocab, cfg, attn)
        for note in notes:
            log.info(f"train.init remap: {note}")
    with contextlib.ExitStack() as stack:
        if vllm_online:  # the server the loop asks for each row's states, stopped after
            server_job = OnlineServerJob.for_training(
                source, paths.tokenized, paths.state, paths.state / "online_vllm"
            )
            endpoint, staging = stack.enter_context(online_server(card, server_job))[:2]
            online = VllmOnline.of(online_cfg, endpoint, staging)
        result = train_draft(
            model,
            cfg,
            TrainingData(paths.tokenized, paths.hs, online),
            device,
            Resume(paths.state, wanted.key, wanted),
            LoopCallbacks(epoch=on_epoch, step=step_reporter()),
        )
    return model, result, notes


def train(
    cfg: TrainConfig, card: TargetCard, paths: TrainPaths, out_dir: Path, live_dir: Path
) -> TrainRun:
    """Train the draft with cfg.backend, per-epoch metrics to dvclive in live_dir, and replace
    out_dir with it. Raises InitMismatch / DataMismatch when train.init or the data do not fit.

    out_dir is a persist output: the last draft stays until this one is written and checked
    beside it, then replaces it whole (a failed or refused run leaves it in place)."""
    from dvclive import Live

    paths.state.mkdir(parents=True, exist_ok=True)
    check_hidden_states(paths.hs, card)
    init_source = resolve_init(cfg.init) if cfg.init else None  # a hub id: its cached snapshot
    job = TrainJob(
        paths,
        init_dir=prepare_init(init_source, card, cfg.init_convert, paths.state)
        if init_source
        else None,
        source=hidden_states_source(paths.hs),
        data_sha256=training_data_sha256(paths.tokenized, paths.hs),
        # an EAGLE / SpecForge init may hold its weights as pytorch_model.bin
        init_sha256=dir_sha256(init_source, ("*.json", "*.safetensors", "*.bin", "*.pt"))
        if init_source
        else None,
    )

    with Live(dir=str(live_dir), save_dvc_exp=False, dvcyaml=None) as live:
        if cfg.backend == "speculators":
            model, result, notes = run_speculators(cfg, card, job, epoch_logger(live), live_dir)
        else:
            model, result, notes = run_builtin(cfg, card, job, epoch_logger(live))

    out = Path(out_dir)
    staged = out.with_name(f".{out.name}.new")
    shutil.rmtree(staged, ignore_errors=True)
    vllm_fields = save_draft(model, staged)
    best, source = result["best"], job.source
    write_meta(
        staged,
        "train",
        cfg.model_dump(),
        target=card.model,
        target_revision=card.revision,
        data_sha256=job.data_sha256,
        init=cfg.init,
        init_sha256=job.init_sha256,
        init_remaps=notes,
        best_epoch=best["epoch"],
        vllm_speculator=vllm_fields,
        hidden_states={"mode": source["mode"], "format": source["format"]},
        trained_rows=trained_rows(paths.tokenized, cfg.pack_len),
    )
    shutil.rmtree(out, ignore_errors=True)
    os.replace(staged, out)
    last_run = (
        {"data_sha256": job.data_sha256, "steps": result["steps"], "best_epoch": best["epoch"]}
        if cfg.backend == "builtin"
        else None
    )
    return TrainRun(train_report(cfg, result, source), last_run)


def run(params, paths: Paths) -> TrainRun:
    """Stage `train`: the draft trained by params.train into paths.out; the run, whose report
    the stage writes and whose last_run finishes the resume state."""
    card = TargetCard.load(paths.card)
    return train(params.train, card, paths.inputs, paths.out, paths.live)
