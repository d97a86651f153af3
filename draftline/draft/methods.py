"""The drafters `train.method` names, each trained through speculators' own model class, config
and loss from the same data (the target's aux and last hidden states, the draft vocabulary):

- eagle3: a chain; each of the k draft steps reads the one before (training unrolls them, TTT).
- peagle: P-EAGLE; all k draft tokens in one forward, the later positions reading a mask token
  and a learnt mask state (training samples parallel groups, COD). vLLM serves it as eagle3 with
  parallel_drafting.
- dflash: a block of block_size positions after the last accepted token, filled in one forward
  from the target's context states (training samples anchored blocks). vLLM serves it as dflash.

What differs between them lives here: the classes, the batch layout their forward reads, the
forward's arguments, the draft tokens a step proposes, what their metrics summarize to, and the
speculative config a server is given. Light at import: no torch, no speculators.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from draftline.train.config import TrainConfig


@dataclass(frozen=True)
class Method:
    name: str  # train.method, and speculators_model_type in the draft's config.json
    module: str  # speculators.models.<module>
    model_class: str
    config_class: str
    # speculators' shift_batch layout (the embedding of token i+1 beside the state of token i);
    # dflash reads the rows as they are (its blocks start at an anchor token)
    shifted: bool
    # draftline's own speculative decoder runs it (evaluate's built-in engine and parity gate)
    builtin_decode: bool
    # whether the EAGLE-3 norm layouts (train.architecture) apply to its decoder
    eagle_layout: bool


METHODS = {
    "eagle3": Method(
        "eagle3", "eagle3", "Eagle3DraftModel", "Eagle3SpeculatorConfig", True, True, True
    ),
    "peagle": Method(
        "peagle", "peagle", "PEagleDraftModel", "PEagleSpeculatorConfig", True, False, True
    ),
    "dflash": Method(
        "dflash", "dflash", "DFlashDraftModel", "DFlashSpeculatorConfig", False, False, False
    ),
}


def method_named(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(
            f"speculators_model_type {name!r} is not a drafter this pipeline trains or serves "
            f"({', '.join(METHODS)})"
        )
    return METHODS[name]


def classes(method: Method):
    """(model class, config class) from speculators."""
    import importlib

    module = importlib.import_module(f"speculators.models.{method.module}")
    return getattr(module, method.model_class), getattr(module, method.config_class)


def vllm_speculative(method: str) -> dict:
    """What vLLM's speculative_config needs for a draft of `method` besides model and k: P-EAGLE
    is served as eagle3 with parallel_drafting (vLLM's speculators reader maps peagle so), DFlash
    as dflash (parallel drafting implied: vLLM sets it)."""
    if method == "peagle":
        return {"method": "eagle3", "parallel_drafting": True}
    return {"method": method_named(method).name}


def speculative_tokens(cfg: TrainConfig) -> int:
    """Draft tokens per step written into the draft's config (vLLM's default k for it)."""
    if cfg.method == "peagle":
        return cfg.peagle.depths
    if cfg.method == "dflash":
        return cfg.dflash.block_size - 1  # the anchor is the bonus token, not a draft
    return cfg.speculative_tokens or cfg.ttt_steps


@dataclass(frozen=True)
class Forward:
    """What a forward over a packed batch takes besides the batch: the method, the draft
    positions its metrics cover, and the method's own arguments (no loss config: that depends
    on the device, draftline/draft/forward.py)."""

    method: str
    positions: int
    kwargs: tuple[tuple[str, object], ...]

    @classmethod
    def for_training(cls, cfg: TrainConfig) -> Forward:
        if cfg.method == "peagle":
            p = cfg.peagle
            kwargs = {
                "num_depths": p.depths,
                "down_sample_ratio": p.down_sample_ratio,
                "down_sample_ratio_min": p.down_sample_ratio_min,
                "max_anchors": p.max_anchors,
            }
            return cls("peagle", p.depths, tuple(kwargs.items()))
        if cfg.method == "dflash":
            d = cfg.dflash
            kwargs = {"gamma": d.gamma, "max_anchors": d.max_anchors}
            return cls("dflash", d.block_size - 1, tuple(kwargs.items()))
        kwargs = {"ttt_steps": cfg.ttt_steps, "ttt_step_loss_decay": cfg.ttt_step_loss_decay}
        return cls("eagle3", cfg.ttt_steps, tuple(kwargs.items()))

    @classmethod
    def chain(cls, k: int) -> Forward:
        """An EAGLE-3 draft unrolled k steps, undecayed (what the built-in decoder measures)."""
        return cls("eagle3", k, (("ttt_steps", k), ("ttt_step_loss_decay", 1.0)))

    @classmethod
    def for_draft(cls, config, k: int) -> Forward:
        """A saved draft's forward measured at k draft positions (evaluate's tau_sim), from its
        speculators config (object or dict): EAGLE-3 unrolled k steps, undecayed; P-EAGLE's k
        parallel depths, every position kept (no down-sampling); DFlash's own blocks (its
        block size - 1 positions, fixed at training)."""
        get = config.get if isinstance(config, dict) else (lambda key: getattr(config, key, None))
        method = method_named(get("speculators_model_type") or "eagle3").name
        if method == "peagle":
            kwargs = {"num_depths": k, "down_sample_ratio": 0.999, "down_sample_ratio_min": 0.999}
            return cls("peagle", k, tuple(kwargs.items()))
        if method == "dflash":
            block = int(get("block_size"))
            return cls("dflash", block - 1, (("gamma", 4.0), ("max_anchors", 512)))
        return cls.chain(k)


def summarize(metric_sums: dict[str, float], forward: Forward) -> dict:
    """Loss, per-position accuracy acc_k = P(draft positions 0..k all correct) and the simulated
    acceptance length tau_sim = 1 + sum_k acc_k, from a method's summed `*_sum` / `*_total`
    counts. EAGLE-3's full_acc_k is that probability already (each step reads the last). P-EAGLE
    reports each depth's own accuracy: acc_k is their running product, which assumes the depths
    err independently. DFlash counts each block's accepted run itself (its `eal`, bonus token
    included), which is tau_sim; acc_k there is each position's own accuracy."""

    def ratio(name):
        total = metric_sums.get(f"{name}_total", 0.0)
        return metric_sums.get(f"{name}_sum", 0.0) / total if total else 0.0

    n = forward.positions
    if forward.method == "eagle3":
        acc = [ratio(f"full_acc_{k}") for k in range(n)]
        tau = 1 + sum(acc)
    elif forward.method == "peagle":
        acc, running = [], 1.0
        for d in range(n):
            running *= ratio(f"position_{d}_acc")
            acc.append(running)
        tau = 1 + sum(acc)
    else:
        acc = [ratio(f"position_{d}_acc") for d in range(1, n + 1)]
        tau = ratio("eal") if metric_sums.get("eal_total") else 1.0
    return {
        "loss": ratio("loss"),
        "position_accuracy": [round(a, 4) for a in acc],
        "tau_sim": round(tau, 4),
    }
