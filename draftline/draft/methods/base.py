"""The drafter contract and its registry: what a train.method does, for the rest of the pipeline.

A drafter is one `Drafter` subclass in a module of its own beside this one, registered under its
name (`@register`), which is also the speculators_model_type of the drafts it saves. It subclasses
its method (draftline/draft/params/: the name, params section and serving facts the params schema
validates with, kept apart so that reading params runs none of this). Every caller looks a
drafter up (`drafter`, `of_config`) and asks it what it needs: its classes, batch layout, forward
and metrics, how vLLM serves it. No caller compares names, so a new method is a module here and
one in draftline/draft/params/ (each imported by its package's __init__.py) and its tests. Light at
import: no torch, no speculators.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from draftline.draft.params import Method, method_named

if TYPE_CHECKING:
    from draftline.core.card import TargetCard
    from draftline.draft.spec import DraftSpec, ServingSpec


@dataclass(frozen=True)
class Forward:
    """What a forward over a packed batch takes besides the batch: the method, the draft
    positions its metrics cover, and the method's own arguments (no loss config: that depends
    on the device, draftline/draft/forward.py)."""

    method: str
    positions: int
    kwargs: tuple[tuple[str, object], ...]

    @classmethod
    def for_training(cls, cfg: DraftSpec) -> Forward:
        return drafter(cfg.method).training_forward(cfg)

    @classmethod
    def for_draft(cls, config, k: int) -> Forward:
        """A saved draft's forward measured at k draft positions (evaluate's tau_sim), from its
        speculators config (object or dict): each method's `draft_forward`."""
        return of_config(config).draft_forward(getter(config), k)


class Drafter(Method, ABC):
    """One train.method's behaviour, on top of its method's facts (a subclass names its method
    first: `class Eagle3(Eagle3Method, Drafter)`). It states its own facts as class attributes
    and answers the abstract hooks; the base holds only what follows from the facts alike for
    every method."""

    module: ClassVar[str]  # speculators.models.<module>
    model_class: ClassVar[str]
    config_class: ClassVar[str]
    decoder: ClassVar[str]  # the draft decoder layer's model type (draft_arch)
    # speculators' shift_batch layout (the embedding of token i+1 beside the state of token i);
    # False: the rows as they are
    shifted: ClassVar[bool] = True
    # a checkpoint naming no speculators_model_type (EAGLE/SpecForge layout, a hub id) is one of
    # its drafts; one drafter at most says so
    unnamed_checkpoints: ClassVar[bool] = False
    # its masked draft positions read a mask token (train.mask_token_id)
    masked: ClassVar[bool] = False
    # it drafts all its tokens in one forward, so it drafts at most its trained positions
    parallel: ClassVar[bool] = False
    # why vLLM must serve it with its own speculative method and no other
    vllm_reason: ClassVar[str]

    def classes(self):
        """(model class, config class) from speculators."""
        module = importlib.import_module(f"speculators.models.{self.module}")
        return getattr(module, self.model_class), getattr(module, self.config_class)

    @abstractmethod
    def vllm_speculative(self) -> dict:
        """What vLLM's speculative_config needs for its drafts besides model and k (a new dict:
        callers take from it)."""

    @abstractmethod
    def speculative_tokens(self, cfg: DraftSpec) -> int:
        """Draft tokens per step written into the draft's config (vLLM's default k for it)."""

    @abstractmethod
    def config_fields(self, card: TargetCard, cfg: DraftSpec, mask: int | None) -> dict:
        """Its speculators config's fields beyond the shared ones (mask: the resolved
        train.mask_token_id of a masked method, else None)."""

    @abstractmethod
    def vllm_fields(self, config: dict) -> dict:
        """Its own fields vLLM's speculators config reader takes from a saved config.json."""

    @abstractmethod
    def speculators_args(self, cfg: DraftSpec, mask: int | None) -> list[str]:
        """Its own arguments to `speculators.train` (mask as in config_fields)."""

    @abstractmethod
    def training_forward(self, cfg: DraftSpec) -> Forward:
        """The forward training runs (and validation, best-epoch selection)."""

    @abstractmethod
    def draft_forward(self, get, k: int) -> Forward:
        """A saved draft's forward at k draft positions; `get(key)` reads its config."""

    @abstractmethod
    def accuracy(self, metric_sums: dict[str, float], positions: int) -> tuple[list[float], float]:
        """(acc_k per draft position, tau_sim) from its forward's summed metric counts."""

    def vllm_problems(self, cfg: ServingSpec) -> list[str]:
        """benchmark.vllm settings that would serve its draft other than it was trained to run."""
        return []

    def reads_flat_config(self, config: dict) -> bool:
        """Whether a config.json in the EAGLE/SpecForge layout is one of its drafts."""
        return False


REGISTRY: dict[str, Drafter] = {}


# the facts every drafter states beyond its method's (the others have a default in Drafter)
FACTS = ("module", "model_class", "config_class", "decoder", "vllm_reason")


def register(cls: type[Drafter]) -> type[Drafter]:
    """Class decorator: one instance of `cls` answers to `cls.name`, a registered method's (an
    incomplete drafter fails here, at import, not where a hook is first asked)."""
    method_named(cls.name)  # UnknownDrafter: its method is not registered (draftline/draft/params/)
    missing = [fact for fact in FACTS if not hasattr(cls, fact)]
    if missing:
        raise TypeError(f"drafter {cls.__name__}: states no {', '.join(missing)}")
    if cls.name in REGISTRY:
        raise ValueError(f"a drafter named {cls.name!r} is registered already")
    if cls.unnamed_checkpoints and any(d.unnamed_checkpoints for d in REGISTRY.values()):
        raise ValueError(f"{cls.name}: one drafter at most reads checkpoints that name none")
    REGISTRY[cls.name] = cls()
    return cls


def drafter(name: str) -> Drafter:
    """The drafter registered as `name`; UnknownDrafter, listing the known methods, for another."""
    method_named(name)
    return REGISTRY[name]


def getter(config):
    """`get(key)` over a draft config: a dict, or a speculators config object."""
    return config.get if isinstance(config, dict) else (lambda key: getattr(config, key, None))


def of_config(config) -> Drafter:
    """The drafter of a draft config (dict or object): its speculators_model_type; for one that
    names none, the drafter whose checkpoints those are (EAGLE/SpecForge layout, hub ids)."""
    name = getter(config)("speculators_model_type")
    if name:
        return drafter(name)
    return next(d for d in REGISTRY.values() if d.unnamed_checkpoints)


def ratio(metric_sums: dict[str, float], name: str) -> float:
    """A metric's mean from its summed `<name>_sum` / `<name>_total` counts (0 when none)."""
    total = metric_sums.get(f"{name}_total", 0.0)
    return metric_sums.get(f"{name}_sum", 0.0) / total if total else 0.0


def summarize(metric_sums: dict[str, float], forward: Forward) -> dict:
    """Loss, per-position accuracy acc_k = P(draft positions 0..k all correct) and the simulated
    acceptance length tau_sim = 1 + sum_k acc_k (each method's `accuracy` says how its counts
    give them), from a method's summed `*_sum` / `*_total` counts."""
    acc, tau = drafter(forward.method).accuracy(metric_sums, forward.positions)
    return {
        "loss": ratio(metric_sums, "loss"),
        "position_accuracy": [round(a, 4) for a in acc],
        "tau_sim": round(tau, 4),
    }
