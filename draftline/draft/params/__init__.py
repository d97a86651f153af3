"""What train.method may name, and each method's params section: the light half of a drafter
(draftline/draft/methods/ holds what it does), so the params schema validates a method without
the drafters' code. One module each (eagle3, peagle, dflash), registered on import; base.py is
their contract and registry; objective.py names the losses train.loss may take. Imports only core/
and itself."""

# isort: off
# each module registers its method when imported, in this order, the order names() lists them in
from draftline.draft.params.eagle3 import Eagle3Method
from draftline.draft.params.peagle import PEagleMethod, PEagleParams
from draftline.draft.params.dflash import DFlashMethod, DFlashParams

# isort: on
from draftline.draft.params.base import (
    Method,
    UnknownDrafter,
    fine_tuning,
    method_named,
    names,
    register,
    serving,
    titles,
)
from draftline.draft.params.objective import LOSSES, check_loss

__all__ = [
    "DFlashMethod",
    "DFlashParams",
    "LOSSES",
    "Eagle3Method",
    "Method",
    "PEagleMethod",
    "PEagleParams",
    "UnknownDrafter",
    "check_loss",
    "fine_tuning",
    "method_named",
    "names",
    "register",
    "serving",
    "titles",
]
