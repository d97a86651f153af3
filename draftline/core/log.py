"""Where the library's messages go: the `logging` module, one logger per module
(`log = logging.getLogger(__name__)`), set up once by the entry point (draftline/core/errors.py).

On a terminal, rich's handler; otherwise (DVC logs, CI, tests) the bare message on stdout, as a
`print` would have written it, so logs read the same everywhere.
"""

from __future__ import annotations

import logging
import sys


class _Stdout(logging.StreamHandler):
    """The message alone, to whatever sys.stdout is when it is written (pytest swaps it)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, _value) -> None:
        pass


def setup_logging(level: int = logging.INFO) -> None:
    """Once per process: the project's loggers (draftline.*, stages.*, and a module run as __main__) at `level`, to rich on a
    terminal, else stdout."""
    for name in ("draftline", "stages", "__main__"):  # __main__: a module run with python -m
        top = logging.getLogger(name)
        top.setLevel(level)
        if top.handlers:
            continue
        if sys.stdout.isatty():
            from rich.logging import RichHandler

            handler: logging.Handler = RichHandler(show_time=False, show_path=False, markup=False)
        else:
            handler = _Stdout()
        top.addHandler(handler)
        top.propagate = False  # one line per message, whatever a library did to the root logger
