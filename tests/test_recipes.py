"""Every `dvc exp run -S key=value` recipe under scripts/ applies to params.yaml and validates, so
a typo in a recipe fails here rather than after an hour of pipeline."""

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from draftline.params import parse_params

ROOT = Path(__file__).resolve().parents[1]
SET_PARAM = re.compile(r"-S\s+'(\+{0,2})([^'=+][^'=]*)=([^']*)'")


def apply_set_params(params: dict, script: str) -> tuple[dict, int]:
    """params with every -S '[+|++]dotted.key=yaml value' of the script applied, as `dvc exp run -S`
    (Hydra's override grammar) does: a plain key must already be in params.yaml, `+key` must not be,
    `++key` is either (a key that only has a default in its phase's config.py needs `++`)."""
    count = 0
    for plus, key, value in SET_PARAM.findall(script):
        node = params
        *parents, leaf = key.split(".")
        for part in parents:
            if plus != "++" and part not in node:
                raise KeyError(
                    f"-S '{key}=...': {part!r} is not in params.yaml (use '++{key}=...')"
                )
            node = node.setdefault(part, {})
        if plus == "" and leaf not in node:
            raise KeyError(
                f"-S '{key}=...': not in params.yaml, dvc exp run refuses it (use '++{key}=...')"
            )
        if plus == "+" and leaf in node:
            raise KeyError(f"-S '+{key}=...': already in params.yaml (drop the '+')")
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
    """What bash passes to dvc (the array, sourced under set -e), not what the file's text matches."""
    done = subprocess.run(
        [
            "bash",
            "-c",
            'set -euo pipefail; source scripts/smollm2.sh; printf "%s\\n" "${SMOLLM2_PARAMS[@]}"',
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    words = done.stdout.splitlines()
    assert words[::2] == ["-S"] * (len(words) // 2)
    script = " ".join(f"-S '{value}'" for value in words[1::2])
    params, count = apply_set_params(yaml.safe_load((ROOT / "params.yaml").read_text()), script)
    assert (
        count
        == len(words) // 2
        == len(SET_PARAM.findall((ROOT / "scripts/smollm2.sh").read_text()))
    )
    config = parse_params(params)
    assert config.target.model == "smollm2" and config.target.aux_layer_ids is None


def test_a_typo_in_a_recipe_is_caught():
    from draftline.core.config import ParamsError

    base = yaml.safe_load((ROOT / "params.yaml").read_text())
    with pytest.raises(KeyError, match="train.epocs"):  # dvc exp run refuses a plain unknown key...
        apply_set_params(base, "-S 'train.epocs=3'")
    params, _ = apply_set_params(
        base, "-S '++train.epocs=3'"
    )  # ...and validation catches a forced one
    with pytest.raises(ParamsError, match="train.epocs"):
        parse_params(params)


def test_a_key_only_in_the_config_defaults_needs_plus_plus():
    base = yaml.safe_load((ROOT / "params.yaml").read_text())
    with pytest.raises(KeyError, match="evaluate.prompts"):
        apply_set_params(base, "-S 'evaluate.prompts=12'")
    params, _ = apply_set_params(base, "-S '++evaluate.prompts=12'")
    assert parse_params(params).evaluate.prompts == 12


def recipe_words(name: str) -> list[str]:
    """The words scripts/recipe_smollm2.sh gives `dvc exp run` for the experiment NAME (its
    RECIPE_PRINT mode: nothing run)."""
    done = subprocess.run(
        ["bash", "scripts/recipe_smollm2.sh", name],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "RECIPE_PRINT": "1"},
    )
    assert done.returncode == 0, done.stderr
    words = done.stdout.splitlines()
    assert words[::2] == ["-S"] * (len(words) // 2)
    return words


def test_the_long_rows_run_is_the_chosen_recipe_plus_long_rows():
    """d500-long: valid params; the verdict run's params but for the long sets, the lengths, the
    one load and the fine-tuning of the recipe's draft; the long eval set named in evaluate.sets (held out piece by piece); the long
    train set capped at its row count, on top of the 500 chats; no row cut at tokenize or a pack;
    and the datasets it adds written into the sources file dvc.yaml reads before the run."""
    from devtools.exp_sources import with_datasets

    words = recipe_words("d500-long")
    script = " ".join(f"-S '{value}'" for value in words[1::2])
    config = parse_params(
        apply_set_params(yaml.safe_load((ROOT / "params.yaml").read_text()), script)[0]
    )
    verdict = " ".join(f"-S '{v}'" for v in recipe_words("d500-emb-head-verdict")[1::2])
    base = parse_params(
        apply_set_params(yaml.safe_load((ROOT / "params.yaml").read_text()), verdict)[0]
    )
    tuned = {"init": "drafts/d500-recipe", "init_layer_from_target": None, "init_remap_vocab": True}
    tuned |= {"epochs": 2, "lr": 0.001, "pack_len": 5120}
    assert config.train == base.train.model_copy(update=tuned)
    assert config.regenerate == base.regenerate and config.vocab == base.vocab
    long_docs, long_train = config.datasets["long_docs"], config.datasets["long_train"]
    assert "long_docs" in config.evaluate.sets and "long_train" not in config.evaluate.sets
    # the eval set is the context measurement's (devtools/context_eval.py --lengths 512 1024 2048
    # 4096 --per-length 1), and the train part holds out at least that
    assert long_docs.build.lengths == [512, 1024, 2048, 4096] and long_docs.build.per_length == 1
    held = long_train.build.held_out
    assert long_train.build.part == "train" and held.per_length >= long_docs.build.per_length
    assert set(long_docs.build.lengths) <= set(held.lengths) and held.seed == long_docs.build.seed
    rows = len(long_train.build.lengths) * len(long_train.build.kinds) * long_train.build.per_length
    assert config.mix.caps["long_train"] == rows and config.samples == base.samples + rows
    assert config.mix.holdout_from == ["chitchat_sample"]
    assert config.tokenize.max_length == config.train.pack_len >= 5120
    assert config.benchmark.concurrency == [config.benchmark.serve_concurrency]
    params = with_datasets(yaml.safe_load((ROOT / "params.yaml").read_text()), words)
    assert set(params["datasets"]) == set(config.datasets)
