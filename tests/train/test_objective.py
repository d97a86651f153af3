"""The builtin loop trains with train.loss and the method's position weighting: one optimizer step
on the captured rows of tests/train/test_train.py (its `data` fixture) per loss and weighting,
each reaching speculators' own eager loss and metrics with what the params say, with a finite
loss that moves the weights. Their values against formulas, and the speculators backend's flags:
tests/draft/test_objective.py."""

import importlib
import inspect
import json

import pytest
import torch

from draftline.draft import model as draft_model
from draftline.draft.params.objective import LOSSES
from draftline.train import resume as train_state
from draftline.train import run as training
from draftline.train.config import TrainConfig
from draftline.train.data import make_loader
from tests.train.test_train import TRAIN, data  # noqa: F401 (the captured rows, a fixture)

MIX = {"ce": 0.1, "tv": 0.9}

CASES = [
    *[("eagle3", {"loss": name}) for name in LOSSES],
    ("eagle3", {"loss": MIX}),
    ("eagle3", {"loss": "nla", "ttt_step_loss_decay": 0.8}),
    ("peagle", {"loss": "lk_hybrid"}),
    ("dflash", {"loss": "kl_div"}),
    ("dflash", {"loss": "nla", "dflash": {"gamma": 2.0}}),
    ("dflash", {"loss": "ce", "dflash": {"position_weight": "dpace", "dpace_alpha": 0.3}}),
]


def spied_metrics(monkeypatch, method: str) -> list[dict]:
    """The arguments, by name, of each call of speculators' own metrics (its loss) in the method's
    forward; the call itself goes through."""
    core = importlib.import_module(f"speculators.models.{method}.core")
    real, calls = core.compute_metrics, []

    def spy(*args, **kwargs):
        bound = inspect.signature(real).bind(*args, **kwargs)
        bound.apply_defaults()
        calls.append(dict(bound.arguments))
        return real(*args, **kwargs)

    monkeypatch.setattr(core, "compute_metrics", spy)
    return calls


@pytest.mark.parametrize(("method", "objective"), CASES, ids=lambda v: json.dumps(v))
def test_a_builtin_step_trains_with_the_objective(data, monkeypatch, method, objective):  # noqa: F811
    from speculators.losses import resolve_loss_config

    dflash = {"max_anchors": 64, **objective.get("dflash", {})}  # fewer anchors: a faster CPU step
    cfg = TrainConfig(
        **{**TRAIN, "epochs": 1, "warmup_steps": 0},  # the first step at full lr: the weights move
        method=method,
        peagle={"max_anchors": 64},
        **{**objective, "dflash": dflash},
    )
    train_state.seed_everything(0)
    model = draft_model.build_draft(data["card"], data["vocab"], cfg)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    calls = spied_metrics(monkeypatch, method)

    loop = training._setup_loop(model, cfg, data["rows"], "cpu", None)
    loader = iter(make_loader(loop.train_set, loop.plan[0], loop.layout, "cpu", 0))
    sums: dict[str, float] = {}
    training._optimizer_step(loop, loader, 1, sums)

    losses = [v for k, v in sums.items() if k.startswith("loss") and k.endswith("_sum")]
    assert losses and all(torch.isfinite(torch.tensor(v)) for v in losses)
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())
    # speculators' own eager loss of that name reached its metrics, with the method's weighting
    spec = cfg.loss if isinstance(cfg.loss, str) else json.dumps(cfg.loss)
    assert calls and all(c["loss_config"] == resolve_loss_config(spec, "eager") for c in calls)
    if method == "eagle3":
        assert {c["ttt_step_loss_decay"] for c in calls} == {cfg.ttt_step_loss_decay}
    if method == "dflash":
        d = cfg.dflash
        assert calls[0]["per_position_loss_weight"] == d.position_weight
        assert (calls[0]["gamma"], calls[0]["dpace_alpha"]) == (d.gamma, d.dpace_alpha)
    if isinstance(cfg.loss, dict):  # each term of a mix is reported beside the total
        assert any(k.startswith("ce_loss") for k in sums) and any(
            k.startswith("tv_loss") for k in sums
        )
