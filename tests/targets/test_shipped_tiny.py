"""The tiny target is shipped trained (models/tiny): the target stage copies its bytes when the
params and the builder code are the ones that made it, and trains on the spot otherwise."""

import json
import shutil
from pathlib import Path

import yaml

from draftline.core.config import Section
from draftline.targets.bundled import (
    BUILDER_MODULES,
    BUNDLED_DIR,
    RECIPE,
    bundled_for,
    copy_bundled,
    recipe,
)
from draftline.targets.config import TargetConfig

ROOT = Path(__file__).resolve().parents[2]


def default_tiny():
    return TargetConfig(**yaml.safe_load((ROOT / "params.yaml").read_text())["target"]).tiny


def test_the_shipped_tiny_target_is_the_one_the_default_params_and_code_make():
    """Fails after an edit to the builder code (BUILDER_MODULES) or to params.yaml's target.tiny
    until `make tiny-target` rebuilds models/tiny."""
    shipped = json.loads((BUNDLED_DIR / RECIPE).read_text())
    wanted = recipe(default_tiny())
    assert shipped["tiny"] == wanted["tiny"], "params.yaml target.tiny moved: make tiny-target"
    assert shipped["code"] == wanted["code"], f"{BUILDER_MODULES} changed: make tiny-target"
    assert bundled_for(default_tiny()) is not None
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= {
        p.name for p in BUNDLED_DIR.iterdir()
    }


def test_the_stage_copies_the_shipped_bytes(tmp_path):
    out = tmp_path / "target"
    copy_bundled(out)
    for f in BUNDLED_DIR.iterdir():
        if f.name != RECIPE:
            assert (out / f.name).read_bytes() == f.read_bytes()
    assert not (out / RECIPE).exists()


def test_another_recipe_is_trained_on_the_spot(tmp_path, caplog):
    caplog.set_level("INFO")
    assert bundled_for(default_tiny().model_copy(update={"seed": 7})) is None
    assert "['seed'] differ from the shipped tiny target's" in caplog.text
    copy = tmp_path / "tiny"
    shutil.copytree(BUNDLED_DIR, copy)
    recorded = json.loads((copy / RECIPE).read_text())
    recorded["code"][BUILDER_MODULES[0]] = "0" * 64  # made by other builder code
    (copy / RECIPE).write_text(json.dumps(recorded))
    assert bundled_for(default_tiny(), copy) is None
    assert "builder code changed" in caplog.text
    assert bundled_for(default_tiny(), tmp_path / "none") is None
    assert isinstance(default_tiny(), Section)
