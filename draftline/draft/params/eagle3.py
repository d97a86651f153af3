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
