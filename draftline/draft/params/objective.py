"""train.loss, the objective a draft is trained with, as the params schema validates it: one of
speculators' losses by name, or a weighted mix of them ({name: weight}). Both training backends
run speculators' own implementation of it: the builtin loop its eager one on CPU and its fused one
on a GPU (draftline/draft/forward.py device_loss_config), the speculators backend through its
`--loss-fn` (draftline/train/speculators.py). How a method weighs its positions is its own
(draftline/draft/params/base.py Method.position_weights). Imports only the standard library."""

from __future__ import annotations

# speculators 0.9.0's losses (speculators.losses.utils: its eager and fused maps name the same
# ones; tests/draft/test_objective.py holds this list equal to them). p: the target's next-token
# distribution, q: the draft's
LOSSES: dict[str, str] = {
    "kl_div": "forward KL(p || q) (the default)",
    "rkl": "reverse KL(q || p)",
    "jsd": "Jensen-Shannon divergence of p and q",
    "ce": "cross-entropy on the target's argmax (greedy verification's objective)",
    "tv": "total variation 1 - sum min(p, q) (one minus the acceptance rate under sampling)",
    "nla": "-log sum min(p, q) (negative log acceptance rate under sampling)",
    "lk_hybrid": "KL blended into TV as sum min(p, q) grows (LK losses, arXiv 2602.23881)",
}

Loss = str | dict[str, float]


def check_loss(loss: Loss) -> Loss:
    """train.loss as given, when it names speculators' losses (one, or a non-empty mix with a
    positive weight each); ValueError naming the valid ones otherwise."""
    names = ", ".join(LOSSES)
    if isinstance(loss, str):
        if loss not in LOSSES:
            raise ValueError(
                f"{loss!r} is not one of speculators' losses ({names}); or give a weighted mix, "
                "e.g. {ce: 0.1, tv: 0.9}"
            )
        return loss
    if not loss:
        raise ValueError(f"an empty mix: give {{name: weight, ...}} of {names}")
    unknown = [name for name in loss if name not in LOSSES]
    if unknown:
        raise ValueError(
            f"{', '.join(map(repr, unknown))} in the mix: speculators' losses are {names}"
        )
    bad = [name for name, weight in loss.items() if not weight > 0]
    if bad:
        raise ValueError(f"the mix's weights must be positive ({', '.join(bad)})")
    return loss
