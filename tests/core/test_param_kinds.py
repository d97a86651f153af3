"""Every params field declares its kind where it is declared (output-shaping or operational), code
defaults agree with params.yaml, and the fingerprints follow the declaration: an output-shaping change redoes the work, an operational one
never does."""

import typing
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from pydantic_core import PydanticUndefined

from draftline.core.config import KINDS, Section, kind_of, operational, output_shaping, shaping
from draftline.params import Params
from draftline.regenerate.config import RegenerateConfig
from draftline.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]


def sections() -> dict[type[Section], str]:
    """Each section class reachable from Params, with the params key where it is first met."""
    found = {Params: ""}
    todo = [Params]
    while todo:
        cls = todo.pop()
        for name, field in cls.model_fields.items():
            stack = [field.annotation]
            while stack:
                ann = stack.pop()
                if isinstance(ann, type) and issubclass(ann, Section) and ann not in found:
                    found[ann] = f"{found[cls]}.{name}".lstrip(".")
                    todo.append(ann)
                stack.extend(typing.get_args(ann))
    return found


def operational_fields(cls: type[Section]) -> set[str]:
    return {name for name in cls.model_fields if kind_of(cls, name) == "operational"}


def classification_problems(found: dict[type[Section], str] | None = None) -> list[str]:
    problems = []
    for cls, key in (sections() if found is None else found).items():
        where = f"{cls.__name__} (params {key or 'top level'})"
        for name in cls.model_fields:
            if kind_of(cls, name) not in KINDS:
                problems.append(f"{where}: field {name!r} declares no kind")
    return problems


def test_every_field_is_classified():
    problems = classification_problems()
    assert not problems, (
        "say whether each params field changes its stage's output (`shaping(...)`) or only how "
        "the work runs (`operational(...)`), where it is declared:\n  " + "\n  ".join(problems)
    )


def test_an_unclassified_field_is_reported():
    class Section_(Section):
        kept: int = shaping(1)
        plain: int = 2
        fast: bool = operational(False)

    assert classification_problems({Section_: "x"}) == [
        "Section_ (params x): field 'plain' declares no kind"
    ]
    assert output_shaping(Section_()) == {"kept": 1, "plain": 2}


# Keys a project fills in, like `datasets` (which has no default): absent means none, and the
# file's value is the default run's own choice (its eval set, the datasets its held-out prompts
# come from), not a default of the code.
PROJECT_LISTS = {"evaluate.sets", "mix.holdout_from"}


def test_every_default_equals_params_yaml():
    """A key params.yaml sets has no code default, or the same one: the code and the file that
    documents each key never disagree on what a run uses."""
    with open(ROOT / "params.yaml") as f:
        raw = yaml.safe_load(f)
    problems = default_problems(Params, raw, "")
    assert not problems, "code defaults that differ from params.yaml:\n  " + "\n  ".join(problems)


def plain(value):
    """A default as params.yaml spells it: sections inside dicts and lists (benchmark.free's) as
    their fields."""
    if isinstance(value, Section):
        return value.model_dump()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def default_problems(cls: type[Section], raw: dict, key: str, default=None) -> list[str]:
    """Keys of `raw` whose code default differs: the field's, or that of the section instance a
    field defaults to (`long: RegeneratePartition(concurrency=4)`)."""
    problems = []
    for name, value in raw.items():
        field = cls.model_fields[name]
        dotted = f"{key}{name}"
        if default is not None:
            code = getattr(default, name)
        elif field.default is PydanticUndefined:
            code = PydanticUndefined
        else:
            code = field.default
        if isinstance(value, dict) and isinstance(field.annotation, type):
            if issubclass(field.annotation, Section):
                sub = code if isinstance(code, Section) else None
                problems += default_problems(field.annotation, value, dotted + ".", sub)
                continue
        if dotted in PROJECT_LISTS:
            continue
        if code is not PydanticUndefined and plain(code) != value:
            problems.append(f"{dotted}: code {code!r}, params.yaml {value!r}")
    return problems


def test_output_shaping_drops_operational_fields_at_every_depth():
    cfg = RegenerateConfig(
        backend="transformers",
        temperatures=[{"value": 0.7, "weight": 1}],
        long={"concurrency": 2, "max_context": 64},
    )
    kept = output_shaping(cfg)
    assert not set(kept) & operational_fields(RegenerateConfig)
    assert kept["long"] == {"max_context": 64} and kept["temperatures"] == [
        {"value": 0.7, "weight": 1.0}
    ]
    full = cfg.model_dump()
    assert all(
        kept[k] == full[k] for k in kept if k not in ("short", "long")
    )  # plain values as model_dump gives them


CARD = SimpleNamespace(
    model="m", revision=None, chat_template_sha256="c"
)  # what regeneration_settings reads


def regeneration_fingerprint(**changes) -> str:
    from draftline.regenerate.settings import fingerprint, regeneration_settings

    return fingerprint(
        regeneration_settings(RegenerateConfig(**{"backend": "vllm", **changes}), CARD)
    )


@pytest.mark.parametrize(
    "changes",
    [
        {"port": 9000},
        {"host": "0.0.0.0"},
        {"short": {"concurrency": 1}},
        {"first_token_timeout_s": 5},
        {"token_timeout_s": 5},
        {"progress_every_s": 1},
        {"server_slots": 4},
        {"max_retries": 0},
        {"tensor_parallel_size": 2},
        {"startup_timeout_s": 60},
        {"served_model_name": "x"},
        {"max_model_len": 4096},
        {"max_failure_rate": 0.5},
        {"max_length_share": 1.0},
        # the engine and its launch arguments are provenance (issue 24.2)
        {"backend": "sglang"},
        {"backend": "hf"},
        {"backend": "external", "endpoints": ["http://h:1"], "external_engine": "vllm"},
        {"extra_args": ["--dtype", "float16"]},
        {"extra_args": ["--max-num-seqs", "8"]},
        {"hf": {"max_batch": 2}},
    ],
)
def test_an_operational_change_keeps_the_conversations(changes):
    assert regeneration_fingerprint(**changes) == regeneration_fingerprint()


@pytest.mark.parametrize(
    "changes",
    [
        {"reasoning_parser": "qwen3"},
        {"tool_call_parser": "hermes"},
        {"extra_args": ["--override-generation-config", '{"top_k": 20}']},
        {"extra_args": ["--generation-config=vllm"]},
        {"short": {"max_context": 512}},
        {"long": {"max_context": 512}},
        {"max_tokens": 7},
        {"temperature": 0.5},
        {"top_p": 0.9},
        {"seed": 1},
        {"chat_template_kwargs": {"enable_thinking": False}},
    ],
)
def test_an_output_shaping_change_redoes_the_conversations(changes):
    assert regeneration_fingerprint(**changes) != regeneration_fingerprint()


def test_the_engine_is_recorded_not_fingerprinted():
    from draftline.regenerate.settings import ENGINE_FIELDS, engine_record

    assert set(ENGINE_FIELDS) <= operational_fields(RegenerateConfig)
    record = engine_record(
        RegenerateConfig(backend="vllm", extra_args=["--max-num-seqs", "8"]), "vllm"
    )
    assert record["engine"] == record["backend"] == "vllm"
    assert record["extra_args"] == ["--max-num-seqs", "8"] and record["hf"]["max_batch"] == 32


def test_train_resume_identity_follows_the_declaration():
    from types import SimpleNamespace

    from draftline.train.resume import NOT_IN_FINGERPRINT, run_fingerprint

    assert set(NOT_IN_FINGERPRINT) == operational_fields(TrainConfig)
    card = SimpleNamespace(
        model="m", revision=None
    )  # the two TargetCard fields the fingerprint reads

    def identity(**changes):
        return run_fingerprint(TrainConfig(**changes).model_dump(), card, "data", None, "cpu")

    assert (
        identity(checkpoint_every_steps=7, num_workers=0, torchrun_args=["--nnodes", "2"])
        == identity()
    )
    assert identity(lr=1e-4) != identity() and identity(epochs=9) != identity()
