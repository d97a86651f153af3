"""The EAGLE-3 draft: speculators' Eagle3DraftModel built from the target card, and a small
training loop for CPU and one GPU (speculators' own Trainer needs a GPU).

The loop reuses speculators' data path unchanged: ArrowDataset over the tokenized rows and
hs_{i}.safetensors files, Multipack batch sampler, CollateFn packing with shift_batch, and the
model's own TTT forward/loss. On CPU it runs float32 with eager attention and the eager loss.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import torch


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
    )


def build_draft(card: dict, vocab_dir: Path, num_layers: int, ttt_steps: int, attn_impl: str = "eager"):
    """A fresh draft with embeddings, lm_head (masked to the draft vocab) and norm from the target."""
    from speculators.models.eagle3 import Eagle3DraftModel

    d2t = torch.from_numpy(np.load(vocab_dir / "d2t.npy"))
    t2d = torch.from_numpy(np.load(vocab_dir / "t2d.npy"))
    return Eagle3DraftModel.from_training_args(
        verifier_config=draft_layer_config(card, num_layers),
        t2d=t2d,
        d2t=d2t,
        draft_vocab_size=d2t.shape[0],
        norm_before_residual=True,  # speculators' eagle3 defaults
        norm_before_fc=True,
        norm_output=True,
        ttt_steps=ttt_steps,
        verifier_name_or_path=card["model"],
        target_layer_ids=card["aux_layer_ids"],
        draft_attn_impl=attn_impl,
    )


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)


def make_loader(tokenized_dir: Path, hs_dir: Path, split: str, train_ratio: float, pack_len: int, hidden_size: int, dtype, seed: int):
    from hs_connectors import FileTransfer
    from speculators.models.eagle3 import shift_batch
    from speculators.train.data import ArrowDataset, CollateFn
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2
    from torch.utils.data import DataLoader

    dataset = ArrowDataset(
        max_len=pack_len,
        datapath=str(tokenized_dir),
        transfer=FileTransfer(hs_dir),
        on_missing="raise",
        train_ratio=train_ratio,
        split=split,
        hidden_states_dtype=dtype,
    )
    sampler = MultipackDistributedBatchSamplerV2(
        batch_max_length=pack_len, lengths=dataset.approx_lengths, num_replicas=1, rank=0, seed=seed
    )
    loader = DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=0,
        collate_fn=CollateFn(pack_len, hidden_size, num_target_layers=3, dtype=dtype, preprocess=shift_batch),
    )
    return loader, sampler


MODEL_INPUTS = ("hidden_states", "input_ids", "verifier_last_hidden_states", "loss_mask", "position_ids", "document_ids")


def run_batch(model, batch: dict, device: str, ttt_steps: int, decay: float, loss_config):
    inputs = {k: batch[k].to(device) for k in MODEL_INPUTS}
    return model(**inputs, ttt_steps=ttt_steps, ttt_step_loss_decay=decay, loss_config=loss_config)


def summarize(metric_sums: dict[str, float], ttt_steps: int) -> dict:
    """Per-position accuracy acc_k = P(steps 0..k all correct) and tau_sim = 1 + sum_k acc_k."""
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


def train_draft(model, cfg, tokenized_dir: Path, hs_dir: Path, device: str, log=None) -> dict:
    """Train in place; returns the best epoch's validation summary and restores its weights."""
    from speculators.losses import resolve_loss_config

    hidden_size = model.config.transformer_layer_config.hidden_size
    dtype = torch.float32
    train_loader, train_sampler = make_loader(tokenized_dir, hs_dir, "train", 1 - cfg.val_fraction, cfg.pack_len, hidden_size, dtype, cfg.seed)
    val_loader, _ = make_loader(tokenized_dir, hs_dir, "val", 1 - cfg.val_fraction, cfg.pack_len, hidden_size, dtype, cfg.seed)
    loss_config = resolve_loss_config("kl_div", "eager" if device == "cpu" else "fused")
    model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    total_steps = cfg.epochs * len(train_loader)

    def lr_at(step: int) -> float:  # linear warmup, cosine decay to 10%
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        t = (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else torch.autocast("cpu", enabled=False)
    best, best_state, history = None, None, []
    for epoch in range(cfg.epochs):
        model.train()
        train_sampler.set_epoch(epoch)
        train_sums: dict[str, float] = {}
        for batch in train_loader:
            with autocast:
                _, loss, metrics = run_batch(model, batch, device, cfg.ttt_steps, cfg.ttt_step_loss_decay, loss_config)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()
            sched.step()
            accumulate(train_sums, metrics)
        model.eval()
        val_sums: dict[str, float] = {}
        with torch.no_grad(), autocast:
            for batch in val_loader:
                _, _, metrics = run_batch(model, batch, device, cfg.ttt_steps, cfg.ttt_step_loss_decay, loss_config)
                accumulate(val_sums, metrics)
        record = {"epoch": epoch, "train": summarize(train_sums, cfg.ttt_steps), "val": summarize(val_sums, cfg.ttt_steps)}
        history.append(record)
        if log:
            log(record)
        # The checkpoint kept is the one with the best simulated acceptance length, not loss.
        if best is None or record["val"]["tau_sim"] > best["val"]["tau_sim"]:
            best = record
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.load_state_dict(best_state)
    return {"best": best, "history": history}
