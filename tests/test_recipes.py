"""Every `dvc exp run -S key=value` recipe under scripts/ applies to params.yaml and validates, so
a typo in a recipe fails here rather than after an hour of pipeline."""

import re
from pathlib import Path

import pytest
import yaml

from draftline.config import parse_params

ROOT = Path(__file__).resolve().parents[1]
SET_PARAM = re.compile(r"-S\s+'([^'=]+)=([^']*)'")


def apply_set_params(params: dict, script: str) -> tuple[dict, int]:
    """params with every -S 'dotted.key=yaml value' of the script applied, as `dvc exp run -S` does."""
    count = 0
    for key, value in SET_PARAM.findall(script):
        node = params
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
        count += 1
    return params, count


RECIPES = sorted((ROOT / "scripts").glob("*.sh"))


@pytest.mark.parametrize(
    "script", [p for p in RECIPES if "dvc exp run" in p.read_text()], ids=lambda p: p.name
)
def test_recipe_params_validate(script):
    params, count = apply_set_params(
        yaml.safe_load((ROOT / "params.yaml").read_text()), script.read_text()
    )
    assert count > 0, f"{script.name}: no -S 'key=value' found"
    parse_params(params)


def test_smollm2_recipe_selects_the_real_target():
    params, _ = apply_set_params(
        yaml.safe_load((ROOT / "params.yaml").read_text()),
        (ROOT / "scripts" / "smollm2.sh").read_text(),
    )
    config = parse_params(params)
    assert config.target.model == "smollm2" and config.target.aux_layer_ids is None


def test_a_typo_in_a_recipe_is_caught():
    from draftline.config import ParamsError

    params, _ = apply_set_params(
        yaml.safe_load((ROOT / "params.yaml").read_text()), "-S 'train.epocs=3'"
    )
    with pytest.raises(ParamsError, match="train.epocs"):
        parse_params(params)
