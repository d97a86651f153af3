"""Where the target comes from: target.model resolved into a model directory and its card.

`tiny` is copied from the shipped model when its recipe matches (draftline/targets/bundled.py),
else built here (draftline/targets/tiny.py); a GGUF target such as `smollm2` converted once
(draftline/targets/gguf.py), both into the stage's output directory; a hub id or a local path is
only read. The card itself is draftline/targets/model.py's `build_card`. Only the `target` stage imports
this module, so the builders are code deps of that stage alone.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from draftline.core.errors import DraftlineError
from draftline.core.io import write_meta
from draftline.targets.bundled import bundled_for, copy_bundled
from draftline.targets.gguf import GGUF_TARGETS, convert
from draftline.targets.model import RemoteCodeRequired, build_card
from draftline.targets.tiny import build_tiny_target

if TYPE_CHECKING:
    from draftline.core.card import TargetCard
    from draftline.targets.config import TargetConfig

log = logging.getLogger(__name__)


class TargetUnavailable(DraftlineError):
    """A GGUF target that cannot be converted, or a hub / local target that cannot be read into a card."""


def resolve_target(cfg: TargetConfig, out: Path) -> TargetCard:
    """The card of target.model: `tiny` is built and `smollm2` (GGUF_TARGETS) converted into `out`
    first; a hub id or a local path is only read. TargetUnavailable says why a target cannot be had."""
    out.mkdir(parents=True, exist_ok=True)
    if cfg.model == "tiny":
        shipped = bundled_for(cfg.tiny)
        if shipped is not None:  # the same bytes on every machine (draftline/targets/bundled.py)
            copy_bundled(out)
            log.info(
                "target: the shipped tiny target (models/tiny), made by these target.tiny params"
            )
            stats = {**shipped["stats"], "shipped": True}
            return build_card(str(out), "tiny", None, cfg.aux_layer_ids, {"tiny_training": stats})
        # rich loads only to show the tiny target's training
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        with Progress(
            TextColumn("tiny target"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} loss {task.fields[loss]:.3f}"),
            TimeRemainingColumn(),
        ) as bar:
            task = bar.add_task("train", total=cfg.tiny.train_steps, loss=float("nan"))
            stats = build_tiny_target(
                cfg.tiny, out, lambda step, total, loss: bar.update(task, completed=step, loss=loss)
            )
        return build_card(str(out), "tiny", None, cfg.aux_layer_ids, {"tiny_training": stats})
    if cfg.model in GGUF_TARGETS:
        try:
            gguf = convert(cfg.model, out)
        except RuntimeError as err:
            raise TargetUnavailable(f"error: {err}") from None
        log.info(
            f"target: {cfg.model} converted; greedy check answer {gguf['check']['greedy_answer']!r}, "
            f"logits max |diff| vs the GGUF-loaded model {gguf['check']['logits_max_abs_diff']:.3g}"
        )
        return build_card(str(out), f"gguf:{cfg.model}", None, cfg.aux_layer_ids, {"gguf": gguf})
    try:
        return build_card(
            cfg.model, "hub-or-local", cfg.revision, cfg.aux_layer_ids, {}, cfg.trust_remote_code
        )
    except (RemoteCodeRequired, ValueError, FileNotFoundError) as err:
        raise TargetUnavailable(f"error: {err}") from None


class Paths(NamedTuple):
    out: Path  # models/target: the model directory, with card.json and meta.json


def run(params, paths: Paths) -> TargetCard:
    """Stage `target`: the target of params.target resolved into paths.out, its card and
    meta.json written beside it; the card. TargetUnavailable when it cannot be had."""
    card = resolve_target(params.target, paths.out)
    card.write(paths.out / "card.json")
    write_meta(paths.out, "target", params.target.model_dump())
    return card
