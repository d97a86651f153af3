"""EAGLE-3's facts for params: the one method the built-in decoder runs, SGLang serves and
train.init fine-tunes; the EAGLE-3 norm layouts are its decoder's (draftline/draft/methods/eagle3.py
holds what it does)."""

from __future__ import annotations

from draftline.draft.params.base import Method, register


@register
class Eagle3Method(Method):
    name = "eagle3"
    title = "EAGLE-3"
    label = "EAGLE-3 (chain)"
    builtin_decode = True
    eagle_layout = True
    fine_tunes = True
    sglang = True
    # TTT step s's loss weighted ttt_step_loss_decay**s (speculators' exp_loss_decay); 1.0: alike
    position_weights = {"ttt_step_loss_decay": 1.0}
    weighting = "weighs its TTT steps by train.ttt_step_loss_decay"
