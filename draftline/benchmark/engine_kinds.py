"""What benchmark.engine may name, and whether each serves over HTTP: the light half of the
benchmark's engines (draftline/benchmark/engines.py holds what each does and registers each
class here too), so the params schema validates an engine without loading their code. Imports
nothing of draftline."""

from __future__ import annotations

# name -> served: a server driven over HTTP (launched, or reached at benchmark.endpoints), else a
# decoder run in this process; in the order deploy.json lists the served ones
SERVED: dict[str, bool] = {"vllm": True, "sglang": True, "hf": False}


class UnknownEngine(ValueError):
    """benchmark.engine names no registered engine (the message lists them)."""


def engine_served(name: str) -> bool:
    """Whether engine `name` is a server (True) or the local decoder (False)."""
    if name not in SERVED:
        raise UnknownEngine(f"engine {name!r} is none of the registered {', '.join(SERVED)}")
    return SERVED[name]


def register_kind(name: str, served: bool) -> None:
    """Learn an engine's name (draftline/benchmark/engines.py `register`)."""
    SERVED[name] = served


def forget_kind(name: str) -> None:
    SERVED.pop(name, None)
