"""The errors a user acts on, and how an entry point turns them into an exit.

Library code raises a `DraftlineError` (or a subclass) whose text is the whole message a user
reads; it never exits. A stage's `main()` (stages/) and the `draftline` commands are wrapped in
`entry_point`, which sets up logging and turns such an error into exit status 1 with that message;
a stage run by DVC that succeeded leaves its machine facts beside its outputs (core/machine.py).
Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from draftline.core.log import setup_logging
from draftline.core.machine import write_machine_facts

P = ParamSpec("P")
R = TypeVar("R")


class DraftlineError(Exception):
    """Something the user must fix or know (a param, an input, a server, a refused draft)."""


def entry_point(main: Callable[P, R]) -> Callable[P, R]:
    """`main` with logging set up and a DraftlineError turned into SystemExit(its message)."""

    @functools.wraps(main)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        setup_logging()
        try:
            result = main(*args, **kwargs)
        except DraftlineError as err:
            raise SystemExit(str(err)) from None
        write_machine_facts()  # beside the outputs, never in them (draftline/core/machine.py)
        return result

    return run
