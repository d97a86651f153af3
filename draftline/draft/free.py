"""Speculation that needs no trained draft (benchmark.free): the bar a trained draft must clear.

Each method is one registered class: its name, the engines that serve it, vLLM's speculative_config
for it at k draft tokens (no `model`: there is no draft to load), the fields of that config it
takes with the project's defaults, and the Python package the serving interpreter must import for
it. The benchmark serves each beside the draft's servers against the same baseline
(draftline/benchmark/server.py) and the verdict compares the draft with it, paired, per load
(draftline/benchmark/verdict.py `free_comparisons`). Callers ask `free_method(name)` and never
compare a method's name.

- `ngram` (prompt lookup, vLLM's own n-gram proposer; its CPU build runs it too): the longest n in
  [prompt_lookup_min, prompt_lookup_max] whose last n tokens of the context occurred earlier in it,
  and the (up to) k tokens that followed that n-gram's earliest occurrence (vLLM's rule,
  vllm/v1/spec_decode/ngram_proposer.py). It proposes from the context alone, so evaluate replays
  it over the target's greedy outputs (`propose`; draftline/evaluate/lookup.py).
- `suffix` (suffix decoding): Arctic Inference's suffix trees over the prompt and past responses;
  vLLM imports `arctic_inference` for it (`pip install arctic-inference`), not installable here:
  the params check refuses it, naming the package, where the serving interpreter lacks it. Its
  trees grow over the responses the server has given, so it has no offline replay.

Light on purpose: it imports nothing of draftline, so the params schema validates benchmark.free
without the engines' code.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import ClassVar, Protocol


class UnknownFreeMethod(ValueError):
    """benchmark.free names a method not registered (the message lists the registered ones)."""


class FreeMethod(Protocol):
    """A speculation method that serves with no trained draft."""

    name: ClassVar[str]
    title: ClassVar[str]  # as the verdict's words name it
    engines: ClassVar[tuple[str, ...]]  # the benchmark engines that serve it (benchmark.engine)
    # the module the serving interpreter must import for it (None: the engine's own code)
    package: ClassVar[str | None]
    install: ClassVar[str]  # how to get that module
    # the fields of vLLM's speculative_config it takes beyond method and k, with the defaults the
    # benchmark serves it with (benchmark.free.<name>.speculative_config overrides them)
    defaults: ClassVar[dict[str, int | float]]

    def problems(self, settings: dict) -> list[str]:
        """Its settings that vLLM would refuse, each naming the field."""

    def vllm_speculative(self, k: int, settings: dict) -> dict:
        """vLLM's speculative_config at k draft tokens per step: no draft model."""

    def propose(self, context: Sequence[int], k: int, settings: dict) -> list[int] | None:
        """The draft tokens (at most k) it proposes after `context`, from the context alone; None
        where proposing takes the serving engine's state (no offline replay)."""


def _vllm(method: str, k: int, defaults: dict, settings: dict) -> dict:
    return {"method": method, "num_speculative_tokens": k, **defaults, **settings}


def _unknown_fields(name: str, settings: dict, defaults: dict) -> list[str]:
    return [
        f"speculative_config.{field}: not a field of {name} (its fields: {', '.join(defaults)})"
        for field in settings
        if field not in defaults
    ]


class Ngram:
    name: ClassVar[str] = "ngram"
    title: ClassVar[str] = "n-gram prompt lookup"
    engines: ClassVar[tuple[str, ...]] = ("vllm",)
    package: ClassVar[str | None] = None
    install: ClassVar[str] = "part of vLLM"
    # vLLM's own default is 5 and 5 when neither is given; 2-4 matches the short repeated spans
    # of chat answers (tool-call JSON, quoted numbers) that the default's chats repeat
    defaults: ClassVar[dict[str, int | float]] = {"prompt_lookup_min": 2, "prompt_lookup_max": 4}

    def problems(self, settings: dict) -> list[str]:
        out = _unknown_fields(self.name, settings, self.defaults)
        merged = {**self.defaults, **settings}
        lo, hi = merged["prompt_lookup_min"], merged["prompt_lookup_max"]
        if not all(isinstance(v, int) and v >= 1 for v in (lo, hi)):
            out.append("speculative_config: prompt_lookup_min and prompt_lookup_max are ints >= 1")
        elif lo > hi:
            out.append(f"speculative_config: prompt_lookup_min {lo} > prompt_lookup_max {hi}")
        return out

    def vllm_speculative(self, k: int, settings: dict) -> dict:
        return _vllm(self.name, k, self.defaults, settings)

    def propose(self, context: Sequence[int], k: int, settings: dict) -> list[int] | None:
        merged = {**self.defaults, **settings}
        lo, hi = merged["prompt_lookup_min"], merged["prompt_lookup_max"]
        size = len(context)
        for n in range(min(hi, size - 1), lo - 1, -1):
            tail = list(context[size - n :])
            start = _earliest(context, tail, size - n)
            if start is not None:
                return list(context[start + n : start + n + k])
        return []


def _earliest(context: Sequence[int], ngram: list[int], before: int) -> int | None:
    """The first position j < before where context[j : j + len(ngram)] is the n-gram."""
    first, n = ngram[0], len(ngram)
    for j in range(before):
        if context[j] == first and list(context[j : j + n]) == ngram:
            return j
    return None


class Suffix:
    name: ClassVar[str] = "suffix"
    title: ClassVar[str] = "suffix decoding"
    engines: ClassVar[tuple[str, ...]] = ("vllm",)
    package: ClassVar[str | None] = "arctic_inference"
    install: ClassVar[str] = "pip install arctic-inference into vLLM's environment"
    # vLLM's defaults (vllm/config/speculative.py)
    defaults: ClassVar[dict[str, int | float]] = {
        "suffix_decoding_max_tree_depth": 24,
        "suffix_decoding_max_cached_requests": 10000,
        "suffix_decoding_max_spec_factor": 1.0,
        "suffix_decoding_min_token_prob": 0.1,
    }

    def problems(self, settings: dict) -> list[str]:
        out = _unknown_fields(self.name, settings, self.defaults)
        merged = {**self.defaults, **settings}
        if merged["suffix_decoding_max_tree_depth"] < 1:
            out.append("speculative_config: suffix_decoding_max_tree_depth must be >= 1")
        if not 0 <= merged["suffix_decoding_min_token_prob"] <= 1:
            out.append("speculative_config: suffix_decoding_min_token_prob must be in [0, 1]")
        return out

    def vllm_speculative(self, k: int, settings: dict) -> dict:
        return _vllm(self.name, k, self.defaults, settings)

    def propose(self, context: Sequence[int], k: int, settings: dict) -> list[int] | None:
        return None  # its suffix trees hold the server's past responses


FREE_METHODS: dict[str, FreeMethod] = {m.name: m for m in (Ngram(), Suffix())}

# benchmark.free's default (params.yaml's): n-gram at k = 2 with its n-gram sizes spelled out
DEFAULT_FREE = {Ngram.name: {"k": 2, "speculative_config": dict(Ngram.defaults)}}


def register(method: FreeMethod) -> None:
    """Add a method: benchmark.free may name it from then on."""
    FREE_METHODS[method.name] = method


def unregister(name: str) -> None:
    FREE_METHODS.pop(name, None)


def free_method(name: str) -> FreeMethod:
    """The method benchmark.free names; UnknownFreeMethod lists the registered ones."""
    if name not in FREE_METHODS:
        raise UnknownFreeMethod(
            f"{name!r} is none of the registered free methods {', '.join(FREE_METHODS)} "
            "(draftline/draft/free.py)"
        )
    return FREE_METHODS[name]


def importable(python: str, module: str) -> bool:
    """Whether the interpreter `python` finds `module` (without importing it)."""
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def unavailable(name: str, python: str) -> str | None:
    """Why the method cannot be served by the interpreter `python` (None: it can)."""
    method = free_method(name)
    if method.package is None or importable(python, method.package):
        return None
    return (
        f"{method.title} needs the Python package {method.package}, which {python} cannot "
        f"import: {method.install}, or drop {name} from benchmark.free"
    )
