"""The tiny target's weights, shipped: `models/tiny/` holds the model `target.model: tiny` builds
with the default `target.tiny` params, and the recipe that made it.

Training the tiny target on the spot gives other bytes on every CPU whose kernels differ (AVX2,
AVX-512, AMX, arm64), and every stage after it inherits the difference: other answers, other
tokens, another vocabulary. Shipping the trained model makes regeneration, tokens and
vocabulary depend on inference alone. The target stage copies it when its recipe is the one asked
for: the same `target.tiny` params and the same builder code (the fingerprints of BUILDER_MODULES,
without prose); any other recipe is built on the spot, as before, and the log says why.
`python -m devtools.tiny_target` rebuilds the shipped one (tests/targets/test_target.py fails when
the builder code or the default params moved away from it).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from draftline.core.code import code_sha256

if TYPE_CHECKING:
    from draftline.targets.config import TinyTargetConfig

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
BUNDLED_DIR = ROOT / "models" / "tiny"
RECIPE = "recipe.json"  # beside the model files: what made them, and the training stats
# the code that decides the tiny target's bytes: the corpus and the training
BUILDER_MODULES = ("draftline/targets/tiny.py", "draftline/targets/corpus.py")


def recipe(cfg: TinyTargetConfig, root: Path = ROOT) -> dict:
    """What a tiny target's bytes follow from: its params and its builder's code."""
    return {
        "tiny": cfg.model_dump(),
        "code": {m: code_sha256(root / m) for m in BUILDER_MODULES},
    }


def bundled_for(cfg: TinyTargetConfig, bundled: Path = BUNDLED_DIR) -> dict | None:
    """The shipped model's recording (recipe + stats) when it was made by `cfg` and today's
    builder code; None (with the reason logged) when it is missing or made otherwise."""
    path = bundled / RECIPE
    if not path.is_file():
        log.info(f"target: no shipped tiny target ({path}): training it here")
        return None
    shipped = json.loads(path.read_text())
    wanted = recipe(cfg)
    if shipped["tiny"] != wanted["tiny"]:
        differ = sorted(k for k in wanted["tiny"] if shipped["tiny"].get(k) != wanted["tiny"][k])
        log.info(
            f"target: target.tiny {differ} differ from the shipped tiny target's: training it here"
        )
        return None
    if shipped["code"] != wanted["code"]:
        log.info(
            "target: the tiny target's builder code changed since it was shipped: training it here"
        )
        return None
    return shipped


def copy_bundled(out: Path, bundled: Path = BUNDLED_DIR) -> None:
    """The shipped model's files into `out` (the recipe stays behind: the card records its stats)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in sorted(bundled.iterdir()):
        if f.is_file() and f.name != RECIPE:
            shutil.copyfile(f, out / f.name)


def write_bundled(
    cfg: TinyTargetConfig, stats: dict, built: Path, bundled: Path = BUNDLED_DIR
) -> None:
    """`built` (a tiny target just trained with `cfg`) becomes the shipped one, with its recipe."""
    shutil.rmtree(bundled, ignore_errors=True)
    bundled.mkdir(parents=True)
    for f in sorted(built.iterdir()):
        if f.is_file():
            shutil.copyfile(f, bundled / f.name)
    (bundled / RECIPE).write_text(
        json.dumps({**recipe(cfg), "stats": stats}, indent=1, sort_keys=True) + "\n"
    )
