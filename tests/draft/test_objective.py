"""train.loss and the methods' position weighting (draftline/draft/params/objective.py,
draftline/draft/forward.py): every loss is speculators' own, its value is the formula written here
by hand on small tensors, each position weight reaches speculators' implementation with the value
its formula gives, the speculators backend passes them as flags speculators' own parser accepts,
and what does not fit is refused naming the key. The builtin loop's step with each:
tests/train/test_objective.py."""

import json
import math

import pytest
import torch

from draftline.draft import model as draft_model
from draftline.draft.forward import (
    PackLayout,
    device_loss_config,
    loss_spec,
    pack_collate,
    run_batch,
)
from draftline.draft.methods import Forward
from draftline.draft.params.objective import LOSSES
from draftline.train import speculators as handoff
from draftline.train.config import TrainConfig
from tests.draft.test_draft import launch_in, resolved

MIX = {"ce": 0.1, "tv": 0.9}


def small_batch(seed: int = 0, positions: int = 8, vocab: int = 5):
    """(draft logits, target logits, loss mask) of one packed row: [1, T, V], [1, T, V], [1, T]."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, positions, vocab, generator=g) * 2
    targets = torch.randn(1, positions, vocab, generator=g) * 2
    mask = torch.ones(1, positions)
    mask[0, 2] = mask[0, 5] = 0
    return logits, targets, mask


def by_hand(name: str, logits: torch.Tensor, targets: torch.Tensor) -> list[float]:
    """Each position's loss, from its formula: p the target's distribution, q the draft's."""
    out = []
    for z, t in zip(logits[0].double().tolist(), targets[0].double().tolist()):
        q = [math.exp(v) / sum(math.exp(w) for w in z) for v in z]
        p = [math.exp(v) / sum(math.exp(w) for w in t) for v in t]
        kl = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
        overlap = sum(min(pi, qi) for pi, qi in zip(p, q))  # the acceptance rate under sampling
        m = [(pi + qi) / 2 for pi, qi in zip(p, q)]
        value = {
            "kl_div": kl,
            "rkl": sum(qi * math.log(qi / pi) for pi, qi in zip(p, q)),
            "jsd": 0.5 * sum(pi * math.log(pi / mi) for pi, mi in zip(p, m))
            + 0.5 * sum(qi * math.log(qi / mi) for qi, mi in zip(q, m)),
            "ce": -math.log(q[t.index(max(t))]),  # hard label: the target's argmax
            "tv": 1 - overlap,
            "nla": -math.log(max(overlap, 1e-5)),
            # lambda = exp(-eta * alpha), eta = 3 (speculators' default, the paper's best)
            "lk_hybrid": math.exp(-3 * overlap) * kl + (1 - math.exp(-3 * overlap)) * (1 - overlap),
        }[name]
        out.append(value)
    return out


def masked_mean(values: list[float], weights: list[float], mask: torch.Tensor) -> float:
    """speculators' reduction: sum of weight * loss over the kept positions / their count."""
    kept = mask[0].tolist()
    return sum(v * w * m for v, w, m in zip(values, weights, kept)) / (sum(kept) + 1e-5)


def test_the_losses_are_speculators_own():
    from speculators.losses import utils

    assert set(LOSSES) == set(utils._EAGER_LOSS_FN_MAP) == set(utils._FUSED_LOSS_FN_MAP)


@pytest.mark.parametrize("loss", [*LOSSES, MIX])
def test_each_loss_is_its_formula(loss):
    """What the builtin loop on CPU gets for train.loss is speculators' eager loss, and its value
    over a packed row is the formula: KL, cross-entropy on the argmax, sum min(p, q)..."""
    from speculators.losses import compound_loss, resolve_loss_config

    config = device_loss_config("cpu", loss)
    assert config == resolve_loss_config(loss_spec(loss), "eager")
    logits, targets, mask = small_batch()
    value, _ = compound_loss(logits, targets, mask, torch.zeros_like(mask), config)
    terms = loss if isinstance(loss, dict) else {loss: 1.0}
    positions = len(mask[0])
    expected = sum(
        weight * masked_mean(by_hand(name, logits, targets), [1.0] * positions, mask)
        for name, weight in terms.items()
    )
    assert float(value) == pytest.approx(expected, rel=1e-5)


def test_the_default_loss_is_the_one_every_draft_trained_with():
    """train.loss unset: kl_div, eager on CPU and fused on a GPU, as before it was a param."""
    from speculators.losses import resolve_loss_config

    assert TrainConfig().loss == "kl_div"
    assert device_loss_config("cpu", TrainConfig().loss) == resolve_loss_config("kl_div", "eager")
    assert device_loss_config("cuda", TrainConfig().loss) == resolve_loss_config("kl_div", "fused")
    # DFlash's weighting unset is speculators' forward default (fixed-exp-decay, gamma 4)
    kwargs = dict(Forward.for_training(TrainConfig(method="dflash")).kwargs)
    assert kwargs["per_position_loss_weight"] == "fixed-exp-decay" and kwargs["gamma"] == 4.0


def block_weights(cfg: TrainConfig, ce: list[float], mask: list[float]) -> list[float]:
    """DFlash's weight of each position of its blocks, by hand: fixed-exp-decay exp(-(d-1)/gamma)
    from the position after the anchor; dpace, the draft's confidence q = exp(-ce) smoothed to
    (1 - alpha) q + alpha, its product up to each position, summed from that position on."""
    d, size = cfg.dflash, cfg.dflash.block_size
    if d.position_weight == "fixed-exp-decay":
        return [
            0.0 if i % size == 0 else math.exp(-((i % size) - 1) / d.gamma) for i in range(len(ce))
        ]
    weights = []
    for start in range(0, len(ce), size):
        smooth = [
            (1 - d.dpace_alpha) * math.exp(-c * m) + d.dpace_alpha if m else 1.0
            for c, m in zip(ce[start : start + size], mask[start : start + size])
        ]
        prefix = [math.prod(smooth[: i + 1]) for i in range(size)]
        kept = mask[start : start + size]
        weights += [kept[i] * sum(prefix[j] * kept[j] for j in range(i, size)) for i in range(size)]
    return weights


@pytest.mark.parametrize(
    "dflash, loss",
    [
        ({"block_size": 4}, "kl_div"),
        ({"block_size": 4, "gamma": 1.5}, "ce"),
        ({"block_size": 4, "position_weight": "dpace"}, "ce"),
        ({"block_size": 4, "position_weight": "dpace", "dpace_alpha": 0.2}, "ce"),
    ],
)
def test_dflash_position_weights_are_their_formula(dflash, loss):
    """The DFlash forward's weighting arguments (what train.dflash gives the builtin loop) into
    speculators' DFlash metrics: the loss is each position's loss times its weight by hand."""
    from speculators.models.dflash.metrics import compute_metrics

    cfg = TrainConfig(method="dflash", dflash=dflash, loss=loss)
    kwargs = {k: v for k, v in Forward.for_training(cfg).kwargs if k != "max_anchors"}
    logits, targets, _ = small_batch(1, positions=8, vocab=6)
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 1]], dtype=torch.float32)  # anchors 0 and 4 unscored
    value, _ = compute_metrics(
        logits,
        targets,
        mask,
        cfg.dflash.block_size,
        loss_config=device_loss_config("cpu", loss),
        **kwargs,
    )
    losses = by_hand(loss, logits, targets)
    ce = [c * m for c, m in zip(by_hand("ce", logits, targets), mask[0].tolist())]
    weights = block_weights(cfg, ce, mask[0].tolist())
    assert float(value) == pytest.approx(masked_mean(losses, weights, mask), rel=1e-5)


def test_eagle3_step_decay_weighs_step_s_by_decay_to_the_s(random_target, vocab_dir):
    """train.ttt_step_loss_decay through the draft's own forward: step s's loss is decay**s times
    the undecayed one (the same draft, the same packed row)."""
    torch.manual_seed(0)
    draft = draft_model.build_draft(random_target, vocab_dir, TrainConfig()).eval()
    g = torch.Generator().manual_seed(1)
    length, hidden = 24, random_target.hidden_size
    sample = {
        "hidden_states": torch.randn(length, 3 * hidden, generator=g),
        "input_ids": torch.randint(3, random_target.vocab_size, (length,), generator=g),
        "verifier_last_hidden_states": torch.randn(length, hidden, generator=g),
        "loss_mask": torch.ones(length, dtype=torch.long),
        "lengths": torch.tensor([length]),
        "position_ids": torch.arange(length),
    }
    batch = pack_collate(PackLayout(length - 1, hidden), torch.float32)([sample])

    def step_losses(decay: float, loss="ce") -> list[float]:
        cfg = TrainConfig(ttt_step_loss_decay=decay, loss=loss)
        with torch.no_grad():
            _, _, metrics = run_batch(
                draft, batch, "cpu", Forward.for_training(cfg), device_loss_config("cpu", cfg.loss)
            )
        return [float(metrics[f"loss_{s}_sum"]) for s in range(cfg.ttt_steps)]

    flat, decayed = step_losses(1.0), step_losses(0.8)
    assert all(v > 0 for v in flat)
    assert decayed == pytest.approx([0.8**s * v for s, v in enumerate(flat)], rel=1e-5)
    # and the loss is the one named: another loss, other values on the same forward
    assert step_losses(1.0, "kl_div") != pytest.approx(flat)


# ---- the speculators backend: flags its own parser and schema accept -------------------------


@pytest.mark.parametrize(
    "train, expected",
    [
        ({}, {"loss_fn": "kl_div", "ttt_step_loss_decay": 1.0}),
        *[({"loss": name}, {"loss_fn": name}) for name in LOSSES],
        ({"loss": MIX}, {"loss_fn": json.dumps(MIX)}),
        (
            {"loss": "nla", "ttt_step_loss_decay": 0.8},
            {"loss_fn": "nla", "ttt_step_loss_decay": 0.8},
        ),
        (
            {"method": "dflash"},
            {
                "loss_fn": "kl_div",
                "per_position_loss_weight": "fixed-exp-decay",
                "dflash_decay_gamma": 4.0,
            },
        ),
        (
            {"method": "dflash", "loss": "lk_hybrid", "dflash": {"gamma": 2.0}},
            {
                "loss_fn": "lk_hybrid",
                "per_position_loss_weight": "fixed-exp-decay",
                "dflash_decay_gamma": 2.0,
            },
        ),
        (
            {
                "method": "dflash",
                "loss": "ce",
                "dflash": {"position_weight": "dpace", "dpace_alpha": 0.3},
            },
            {"loss_fn": "ce", "per_position_loss_weight": "dpace", "dpace_alpha": 0.3},
        ),
        ({"method": "peagle", "loss": "tv"}, {"loss_fn": "tv"}),
    ],
)
def test_speculators_backend_passes_the_objective_as_its_own_flags(
    train, expected, random_target, vocab_dir, tmp_path
):
    """The hand-off's command, parsed by speculators' own CLI (argparse over its schema: an unknown
    flag or value exits) and resolved with its cross-checks (dpace needs ce), carries the loss and
    the weighting; the loss config speculators' model builds from it is its fused one of that
    name."""
    from speculators.losses import resolve_loss_config

    cfg = TrainConfig(backend="speculators", **train)
    run = resolved(
        handoff.speculators_train_command(cfg, random_target, launch_in(vocab_dir, tmp_path, 1))
    )
    assert {k: run[k] for k in expected} == expected
    train_kwargs, _ = handoff_model_class(cfg).get_trainer_kwargs(**run)
    assert train_kwargs["loss_config"] == resolve_loss_config(loss_spec(cfg.loss), "fused")


def handoff_model_class(cfg: TrainConfig):
    """speculators' model class of train.method (what its trainer asks get_trainer_kwargs of)."""
    from draftline.draft.methods import drafter

    return drafter(cfg.method).classes()[0]


# ---- what does not fit, refused naming the key -------------------------------------------------


@pytest.mark.parametrize(
    "train, message",
    [
        (
            {"loss": "kld"},
            r"train\.loss: .*'kld' is not one of speculators' losses \(kl_div, rkl, jsd, ce, tv, nla, lk_hybrid\)",
        ),
        (
            {"loss": {"ce": 0.5, "xent": 0.5}},
            r"train\.loss: .*'xent' in the mix: speculators' losses are kl_div",
        ),
        ({"loss": {"ce": 0.0}}, r"train\.loss: .*weights must be positive \(ce\)"),
        ({"loss": {}}, r"train\.loss: .*an empty mix"),
        (
            {"method": "dflash", "ttt_step_loss_decay": 0.8},
            r"ttt_step_loss_decay: weighs the positions of EAGLE-3 drafts \(train.method eagle3\); method dflash weighs its block positions by train.dflash.position_weight",
        ),
        (
            {"method": "peagle", "ttt_step_loss_decay": 0.8},
            r"ttt_step_loss_decay: .*EAGLE-3.*method peagle weighs its parallel depths alike",
        ),
        (
            {"dflash": {"position_weight": "dpace"}, "loss": "ce"},
            r"dflash.position_weight: weighs the positions of DFlash drafts \(train.method dflash\); method eagle3 weighs its TTT steps by train.ttt_step_loss_decay",
        ),
        ({"dflash": {"gamma": 2.0}}, r"dflash.gamma: weighs the positions of DFlash drafts"),
        (
            {"method": "dflash", "dflash": {"position_weight": "dpace"}},
            r"dflash.position_weight: dpace .* needs loss: ce .*not loss: kl_div",
        ),
        (
            {"method": "dflash", "dflash": {"position_weight": "fancy"}},
            r"train\.dflash\.position_weight: .*'fixed-exp-decay' or 'dpace'",
        ),
        (
            {"method": "dflash", "dflash": {"dpace_alpha": 0.3}},
            r"train\.dflash: .*dpace_alpha: a constant of the other weighting; position_weight fixed-exp-decay",
        ),
        (
            {
                "method": "dflash",
                "loss": "ce",
                "dflash": {"position_weight": "dpace", "gamma": 2.0},
            },
            r"gamma: a constant of the other weighting; position_weight dpace",
        ),
        (
            {
                "method": "dflash",
                "loss": "ce",
                "dflash": {"position_weight": "dpace", "dpace_alpha": 0},
            },
            r"train\.dflash\.dpace_alpha: .*greater than 0",
        ),
    ],
)
def test_an_objective_that_does_not_fit_is_refused_naming_the_key(train, message):
    from pathlib import Path

    from draftline.core.config import ParamsError
    from draftline.params import load_params, parse_params

    raw = load_params(Path(__file__).resolve().parents[2] / "params.yaml").model_dump()
    raw["train"].update(train)
    with pytest.raises(ParamsError, match=message):
        parse_params(raw)


@pytest.mark.parametrize(
    "train",
    [
        {"loss": "ce", "ttt_step_loss_decay": 0.8},
        {"loss": MIX},
        {
            "method": "dflash",
            "loss": "ce",
            "dflash": {"position_weight": "dpace", "dpace_alpha": 0.3},
        },
        {"method": "dflash", "loss": "nla", "dflash": {"gamma": 6.0}},
        {"method": "peagle", "loss": "lk_hybrid"},
    ],
)
def test_an_objective_that_fits_is_taken(train):
    cfg = TrainConfig(**train)
    assert cfg.loss == train["loss"]
