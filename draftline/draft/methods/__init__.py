"""The drafters train.method names, one module each (eagle3, peagle, dflash), registered on
import; base.py is their contract and registry. Callers ask a drafter, never compare names."""

# isort: off
# each module registers its drafter when imported, in this order, the order names() lists them in
from draftline.draft.methods.eagle3 import chain
from draftline.draft.methods.peagle import PEagleParams
from draftline.draft.methods.dflash import DFlashParams

# isort: on
from draftline.draft.methods.base import (
    Drafter,
    Forward,
    UnknownDrafter,
    drafter,
    fine_tuning,
    names,
    of_config,
    register,
    serving,
    summarize,
    titles,
)

__all__ = [
    "DFlashParams",
    "Drafter",
    "Forward",
    "PEagleParams",
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
