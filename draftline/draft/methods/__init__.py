"""What each train.method does, one drafter module each (eagle3, peagle, dflash), registered on
import; base.py is their contract and registry. A drafter subclasses its method's facts
(draftline/draft/params/). Callers ask a drafter, never compare names."""

# isort: off
# each module registers its drafter when imported, in this order, the order names() lists them in
from draftline.draft.methods.eagle3 import chain
from draftline.draft.methods.peagle import PEagle
from draftline.draft.methods.dflash import DFlash

# isort: on
from draftline.draft.methods.base import (
    Drafter,
    Forward,
    drafter,
    of_config,
    register,
    summarize,
)
from draftline.draft.params import UnknownDrafter, fine_tuning, names, serving, titles

__all__ = [
    "DFlash",
    "Drafter",
    "Forward",
    "PEagle",
    "UnknownDrafter",
    "chain",
    "drafter",
    "fine_tuning",
    "names",
    "of_config",
    "register",
    "serving",
    "summarize",
    "titles",
]
