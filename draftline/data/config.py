"""params.yaml `datasets` and `mix`: each dataset source and how its rows are read and filtered;
the weighted mix into train, dev and eval prompts."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BeforeValidator, model_validator

from draftline.core.config import Section, operational, shaping
from draftline.data.builtin_sources import BUILTINS
from draftline.data.presets import PRESETS
from draftline.data.pydoc_long import PydocLongConfig

# Dataset names become file names (datasets/prepared/<name>.jsonl), DVC stage names (prepare@<name>)
# and dotted params keys (datasets.<name>): letters, digits, _ and -, nothing that walks a path.
DATASET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")

# ---- dataset presets and the names a dataset spec may use ---------------------------------------

# Names a `fields` mapping may target: the keys the converters read (draftline/data/formats.py).
CANONICAL_FIELDS = (
    "id",
    "conversations",
    "messages",
    "instruction",
    "input",
    "output",
    "prompt",
    "system",
    "tools",
    "source",  # the row's own category or upstream set, kept as its source_detail
    "decode",  # "history": an eval prompt decoded from its whole history (pydoc_long.DECODE_HISTORY)
)

# Language filter by Unicode script of the user turns (see formats.dominant_script).
SCRIPTS = (
    "latin",
    "cyrillic",
    "greek",
    "arabic",
    "hebrew",
    "devanagari",
    "thai",
    "han",
    "kana",
    "hangul",
)


# the keys that say where a dataset's rows are read from: a built-in source generates its own
BUILTIN_REFUSES = (
    "preset",
    "path",
    "split",
    "name",
    "data_files",
    "revision",
    "streaming",
    "fields",
)


class DatasetSpec(Section):
    """One source of `datasets`; a `preset` (PRESETS) fills every key not given; a `builtin`
    generates its rows (no path)."""

    # sharegpt_vicuna, ultrachat_200k, open_perfectblend, hermes_function_calling, ...
    preset: str | None = shaping(None)
    # local .jsonl/.json/.parquet file or dataset directory, or a hub dataset id (required unless
    # `builtin`)
    path: str | None = shaping(None)
    # a source generated on the spot from text installed with Python, no path and no download:
    # pydoc_long, long-context eval prompts from the Python Language Reference (docs/datasets.md);
    # eval-only: named in evaluate.sets (build.part train: long rows to train on instead)
    builtin: str | None = shaping(None)
    # the builtin's settings (null: its defaults); a second builtin adds its model to this union
    build: PydocLongConfig | None = shaping(None)
    format: Literal["auto", "sharegpt", "openai", "alpaca", "prompt"] = shaping("auto")
    split: str = shaping("train")
    name: str | None = shaping(None)  # hub config name
    # hub data files to read, e.g. one category's file of a set stored as <category>.jsonl
    data_files: str | None = shaping(None)
    revision: str | None = shaping(
        None
    )  # hub revision pin (a commit sha reproduces; a branch moves)
    # hub / directory sources: stream rows instead of downloading every shard first
    streaming: bool = operational(False)
    fields: dict[str, str] = shaping(
        {}
    )  # canonical field -> source column, e.g. {prompt: question, id: prompt_id}
    # inline <think>/<tool_call>/<tool_response>/<tools> -> structured fields
    parse_markup: bool = shaping(False)
    max_rows: int | None = shaping(None, ge=1)  # read at most this many rows of the source
    max_prompt_tokens: int | None = shaping(
        None, ge=1
    )  # drop rows whose prompt estimate is longer ("too_long")
    # language filter by Unicode script of the user turns, e.g. [latin]
    scripts: list[str] | None = shaping(None)
    # the share of rows that may be malformed (not a JSON object: corrupt or cut lines), dropped
    # and named in the report, before prepare fails the dataset
    max_drop_share: float = operational(0.01, ge=0, le=1)

    @model_validator(mode="before")
    @classmethod
    def _builtin_source(cls, raw):
        if not isinstance(raw, dict) or raw.get("builtin") is None:
            if isinstance(raw, dict) and raw.get("build") is not None:
                raise ValueError("build: the settings of a builtin source; name one in `builtin`")
            return raw
        source = BUILTINS.get(raw["builtin"])
        if source is None:
            raise ValueError(
                f"unknown builtin {raw['builtin']!r}; builtins: {', '.join(sorted(BUILTINS))}"
            )
        if given := [key for key in BUILTIN_REFUSES if raw.get(key) not in (None, {})]:
            raise ValueError(
                f"builtin {raw['builtin']} generates its rows: {', '.join(given)} do not apply"
            )
        if raw.get("format", source.format) not in ("auto", source.format):
            raise ValueError(f"format: builtin {raw['builtin']} rows are {source.format}")
        return {**raw, "format": source.format, "build": raw.get("build") or {}}

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, raw):
        if not isinstance(raw, dict) or raw.get("preset") is None:
            return raw
        preset = PRESETS.get(raw["preset"])
        if preset is None:
            raise ValueError(f"unknown preset {raw['preset']!r}; presets: {', '.join(PRESETS)}")
        defaults = {
            "path": preset.hub_id,
            "format": preset.format,
            "split": preset.split,
            "name": preset.name,
            "data_files": preset.data_files,
            "fields": preset.fields,
            "parse_markup": preset.parse_markup,
            "streaming": preset.streaming,
        }
        return {**defaults, **raw}

    @model_validator(mode="after")
    def _a_source(self):
        if self.path is None and self.builtin is None:
            raise ValueError(
                "path: required (a local file or dataset directory, or a hub dataset id), or "
                f"builtin: a generated source ({', '.join(sorted(BUILTINS))})"
            )
        return self

    @model_validator(mode="after")
    def _known_names(self):
        if bad := sorted(set(self.fields) - set(CANONICAL_FIELDS)):
            raise ValueError(
                f"fields: unknown target {bad}; targets: {', '.join(CANONICAL_FIELDS)}"
            )
        if bad := sorted(set(self.scripts or ()) - set(SCRIPTS)):
            raise ValueError(f"scripts: unknown {bad}; supported: {', '.join(SCRIPTS)}")
        return self


class MixConfig(Section):
    # Fraction of `samples` drawn from each dataset; must name exactly the `datasets` keys.
    weights: dict[str, float] = shaping()
    # Most train prompts a dataset may give (its eval rows aside); then the others fill in. Prefix-stable.
    caps: dict[str, int] = shaping({})
    eval_samples: int = shaping(24, ge=1)  # held-out prompts for evaluate/benchmark
    # held-out prompts for choosing (recipes, experiments: `evaluate_dev`), disjoint from eval by
    # content; 0 = no dev split
    dev_samples: int = shaping(12, ge=0)
    long_threshold_tokens: int = shaping(
        1024, ge=1
    )  # prompts above this go to the `long` partition
    # false: fail when the datasets cannot supply `samples` / eval_samples at the weights (numbers per
    # dataset); true: take what there is, and record the rows drawn and the shares they came out at
    allow_shortfall: bool = shaping(False)
    # Eval is held out by first-turn content (draftline/data/holdout.py): exact twins of eval prompts never
    # reach train; "template" also skips prompts equal to an eval prompt once digits are masked
    holdout: Literal["exact", "template"] = shaping("template")
    # fail when more than this share of eval prompts keeps a template twin in train (holdout: exact)
    max_template_twin_share: float = operational(0.25, ge=0, le=1)
    # the datasets eval and dev prompts are drawn from (null: every one); the others give train
    # prompts only. A templated set whose prompts are variations of each other cannot give
    # held-out prompts without near-twins in train
    holdout_from: list[str] | None = shaping(None)
    # near-twins: prompts whose word sets (first-turn user text, digits masked) are at least this
    # alike (Jaccard), found by MinHash LSH (draftline/data/holdout.py); counted per held-out
    # split and eval set, and the mix fails when a share above max_near_twin_share has one in train
    near_twin_jaccard: float = operational(0.7, gt=0, le=1)
    max_near_twin_share: float = operational(0.05, ge=0, le=1)

    @model_validator(mode="after")
    def _caps_positive(self):
        if bad := sorted(name for name, cap in self.caps.items() if cap < 0):
            raise ValueError(f"caps must be >= 0; negative for {bad}")
        return self


def plain_names(raw):
    """The dataset names of a `datasets` mapping, refused unless plain (DATASET_NAME)."""
    for name in raw if isinstance(raw, dict) else ():
        if not isinstance(name, str) or not DATASET_NAME.fullmatch(name):
            raise ValueError(
                f"{name!r} is not a plain dataset name (letters, digits, _ and -, starting with "
                "a letter or digit, at most 64): it becomes a file name, a DVC stage name and a "
                "params key"
            )
    return raw


# params.yaml `datasets`: name -> source
Datasets = Annotated[dict[str, DatasetSpec], BeforeValidator(plain_names)]


def eval_only(spec: DatasetSpec) -> bool:
    """A benchmark preset or an eval-only builtin build: evaluated, never trained on."""
    if spec.builtin is not None:
        return BUILTINS[spec.builtin].eval_only(spec.build)
    return spec.preset in PRESETS and PRESETS[spec.preset].eval_only


def held_out_by_pieces(spec: DatasetSpec) -> bool:
    """Whether mix holds the dataset's rows out of train piece by piece (a builtin assembled from
    paragraphs: draftline/data/holdout.py `PieceIndex`), beyond the twins every eval set has."""
    return spec.builtin is not None and BUILTINS[spec.builtin].held_out_by_pieces


def train_datasets(datasets: dict[str, DatasetSpec], eval_sets=()) -> list[str]:
    """The datasets that give train prompts: all but the eval sets (evaluate.sets)."""
    return sorted(set(datasets) - set(eval_sets))


def check_eval_sets(datasets: dict[str, DatasetSpec], eval_sets: list[str]) -> None:
    """evaluate.sets against the datasets: each names one, a benchmark preset or an eval-only
    builtin (eval_only) is named there, a builtin built to train on is not, and at least one
    dataset is left to train on."""
    if unknown := sorted(set(eval_sets) - set(datasets)):
        raise ValueError(
            f"evaluate.sets: {unknown} are not datasets; an eval set is a `datasets` entry (a "
            "preset such as mt_bench, or a local file) named in evaluate.sets"
        )
    benchmarks = sorted(name for name, spec in datasets.items() if eval_only(spec))
    if untracked := sorted(set(benchmarks) - set(eval_sets)):
        raise ValueError(
            f"datasets {untracked} are benchmark sets (an eval-only preset or builtin): name "
            "them in evaluate.sets, never train on them"
        )
    built_to_train = sorted(
        name
        for name in eval_sets
        if datasets[name].builtin is not None and not eval_only(datasets[name])
    )
    if built_to_train:
        raise ValueError(
            f"evaluate.sets: {built_to_train} are built to train on (build.part: train); name "
            "an eval build of the source there instead"
        )
    if datasets and not train_datasets(datasets, eval_sets):
        raise ValueError("evaluate.sets names every dataset: none is left to train on")


def check_weights(datasets: dict[str, DatasetSpec], mix: MixConfig, eval_sets=()) -> None:
    """mix.weights against the datasets that give train prompts (all but the eval sets): exactly
    their names, non-negative, not all zero."""
    if not datasets:
        raise ValueError("datasets: at least one dataset is required")
    trained = train_datasets(datasets, eval_sets)
    missing = sorted(set(trained) - set(mix.weights))
    unknown = sorted(set(mix.weights) - set(trained))
    if missing or unknown:
        sets = f" (the eval sets {sorted(eval_sets)} take none)" if eval_sets else ""
        raise ValueError(
            f"mix.weights must name exactly the datasets{sets}; missing {missing}, unknown {unknown}"
        )
    if any(w < 0 for w in mix.weights.values()) or sum(mix.weights.values()) <= 0:
        raise ValueError("mix.weights must be non-negative and not all zero")
    if mix.holdout_from is not None:
        unknown = sorted(set(mix.holdout_from) - set(trained))
        if unknown or not mix.holdout_from:
            raise ValueError(
                f"mix.holdout_from must name datasets that give train prompts ({trained}); "
                + (f"{unknown} do not" if unknown else "it names none (null: every dataset)")
            )
