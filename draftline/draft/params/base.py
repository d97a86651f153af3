"""A method as the params schema knows it, and their registry: its name, how messages name it, its
params section, which engines run its drafts and the train params it refuses.

A method is one `Method` subclass in a module of its own beside this one, registered under its
name (`@register`); its drafter (draftline/draft/methods/) subclasses it with what the method does.
train/config.py and params.py import this package to validate train.method, so it imports only
core/: an edit to a drafter's forward reruns the stages that run drafters, not every stage that
reads params.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol

from draftline.core.errors import DraftlineError

if TYPE_CHECKING:
    from draftline.core.config import Section


class TrainChoices(Protocol):
    """The train params a method's facts check (check_train; train/config.py's TrainConfig gives
    them), named here so that this package imports nothing above core/."""

    init: str | None
    init_layer_from_target: int | str | None
    architecture: str | None
    train_embeddings: bool
    loss: str | dict[str, float]
    ttt_step_loss_decay: float


class UnknownDrafter(DraftlineError, ValueError):
    """A method name no registered method answers to; the message lists the known ones."""


class Method:
    """One train.method's facts that params validation reads. A subclass states them as class
    attributes; the base answers from them alike for every method."""

    name: ClassVar[str]  # train.method, and speculators_model_type in the draft's config.json
    title: ClassVar[str]  # how messages name its drafts ("EAGLE-3")
    label: ClassVar[str]  # how the docs' tables name it ("EAGLE-3 (chain)")
    params: ClassVar[type[Section] | None] = None  # its own section, train.<name>
    # draftline's own speculative decoder runs it (evaluate's built-in engine and parity gate,
    # benchmark engine hf)
    builtin_decode: ClassVar[bool] = False
    # whether the EAGLE-3 norm layouts (train.architecture) apply to its decoder
    eagle_layout: ClassVar[bool] = False
    # train.init and train.init_layer_from_target can start it from an existing draft / layer
    fine_tunes: ClassVar[bool] = False
    # SGLang serves it (as EAGLE3, from draftline export-sglang's layout)
    sglang: ClassVar[bool] = False
    # the train keys (dotted below train) that weigh its loss by draft position, each with the
    # value that leaves them unset: given another value, another method's drafts refuse them
    position_weights: ClassVar[dict[str, object]] = {}
    # how its loss weighs the draft positions, as a refusal's message says it
    weighting: ClassVar[str] = "weighs its draft positions alike"

    def serves(self, engine: str) -> bool:
        """Whether an engine (evaluate.engine / benchmark.engine) runs its drafts here."""
        return {"hf": self.builtin_decode, "vllm": True, "sglang": self.sglang}[engine]

    def check_train(self, cfg: TrainChoices) -> None:
        """Raise ValueError, naming the key, for train params this method cannot train with."""
        if not self.fine_tunes:
            for key in ("init", "init_layer_from_target"):
                if getattr(cfg, key) is not None:
                    raise ValueError(
                        f"{key}: {titles(fine_tuning())} drafts only (train.method "
                        f"{' / '.join(m.name for m in fine_tuning())}); method "
                        f"{self.name} trains a new draft"
                    )
        if not self.eagle_layout and cfg.architecture is not None:
            raise ValueError(
                "architecture: the EAGLE-3 norm layouts; method "
                f"{self.name} has its own decoder (null)"
            )
        self.check_position_weights(cfg)

    def check_position_weights(self, cfg: TrainChoices) -> None:
        """Refuse another method's position weighting given a value (ValueError naming the key,
        its method and how this one weighs its positions)."""
        for other in METHODS.values():
            for key, unset in other.position_weights.items():
                if key in self.position_weights or train_value(cfg, key) == unset:
                    continue
                raise ValueError(
                    f"{key}: weighs the positions of {other.title} drafts (train.method "
                    f"{other.name}); method {self.name} {self.weighting}"
                )


def train_value(cfg: TrainChoices, key: str) -> object:
    """A train param by its dotted key below train ("dflash.gamma")."""
    value: object = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


METHODS: dict[str, Method] = {}

FACTS = ("name", "title", "label")  # the facts every method states (the others have a default)


def register(cls: type[Method]) -> type[Method]:
    """Class decorator: one instance of `cls` answers to `cls.name` (an incomplete method fails
    here, at import)."""
    missing = [fact for fact in FACTS if not hasattr(cls, fact)]
    if missing:
        raise TypeError(f"method {cls.__name__}: states no {', '.join(missing)}")
    if cls.name in METHODS:
        raise ValueError(f"a method named {cls.name!r} is registered already")
    METHODS[cls.name] = cls()
    return cls


def names() -> tuple[str, ...]:
    """The registered methods, in registration order."""
    return tuple(METHODS)


def method_named(name: str) -> Method:
    """The method registered as `name`; UnknownDrafter, listing the known ones, for another."""
    if name not in METHODS:
        raise UnknownDrafter(
            f"method {name!r} is not a drafter this pipeline trains or serves "
            f"({', '.join(METHODS)})"
        )
    return METHODS[name]


def fine_tuning() -> list[Method]:
    """The methods train.init can start from an existing draft."""
    return [m for m in METHODS.values() if m.fine_tunes]


def serving(engine: str) -> list[Method]:
    """The methods an engine runs (Method.serves)."""
    return [m for m in METHODS.values() if m.serves(engine)]


def titles(methods: list[Method]) -> str:
    """How a message names them: "EAGLE-3", "EAGLE-3 / P-EAGLE"."""
    return " / ".join(m.title for m in methods)
