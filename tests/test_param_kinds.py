"""Every params field is declared output-shaping or operational (draftline/config.py), and the
fingerprints follow the declaration: an output-shaping change redoes the work, an operational one
never does."""

import typing
from types import SimpleNamespace

import pytest

from draftline.config import (
    OPERATIONAL,
    OUTPUT_SHAPING,
    Params,
    RegenerateConfig,
    Section,
    TrainConfig,
    output_shaping,
)


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


def classification_problems() -> list[str]:
    problems = []
    for cls, key in sections().items():
        shaping, operational = (
            OUTPUT_SHAPING.get(cls, frozenset()),
            OPERATIONAL.get(cls, frozenset()),
        )
        where = f"{cls.__name__} (params {key or 'top level'})"
        for name in sorted(set(cls.model_fields) - shaping - operational):
            problems.append(
                f"{where}: field {name!r} is neither in OUTPUT_SHAPING nor in OPERATIONAL"
            )
        for name in sorted(shaping & operational):
            problems.append(f"{where}: field {name!r} is in both OUTPUT_SHAPING and OPERATIONAL")
        for name in sorted((shaping | operational) - set(cls.model_fields)):
            problems.append(f"{where}: {name!r} is classified but is no field")
    return problems


def test_every_field_is_classified():
    problems = classification_problems()
    assert not problems, (
        "draftline/config.py: say whether each params field changes its stage's output "
        "(OUTPUT_SHAPING) or only how the work runs (OPERATIONAL):\n  " + "\n  ".join(problems)
    )


def test_an_unclassified_field_is_reported(monkeypatch):
    monkeypatch.setitem(
        OUTPUT_SHAPING, RegenerateConfig, OUTPUT_SHAPING[RegenerateConfig] - {"reasoning_parser"}
    )
    monkeypatch.setitem(OPERATIONAL, TrainConfig, OPERATIONAL[TrainConfig] | {"lr"})
    assert sorted(classification_problems()) == [
        "RegenerateConfig (params regenerate): field 'reasoning_parser' is neither in OUTPUT_SHAPING nor in OPERATIONAL",
        "TrainConfig (params train): field 'lr' is in both OUTPUT_SHAPING and OPERATIONAL",
    ]


def test_output_shaping_drops_operational_fields_at_every_depth():
    cfg = RegenerateConfig(
        temperatures=[{"value": 0.7, "weight": 1}], long={"concurrency": 2, "max_context": 64}
    )
    kept = output_shaping(cfg)
    assert not set(kept) & OPERATIONAL[RegenerateConfig]
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
    from draftline.conversation_store import fingerprint, regeneration_settings

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
    from draftline.conversation_store import ENGINE_FIELDS, engine_record

    assert set(ENGINE_FIELDS) <= OPERATIONAL[RegenerateConfig]
    record = engine_record(
        RegenerateConfig(backend="vllm", extra_args=["--max-num-seqs", "8"]), "vllm"
    )
    assert record["engine"] == record["backend"] == "vllm"
    assert record["extra_args"] == ["--max-num-seqs", "8"] and record["hf"]["max_batch"] == 32


def test_train_resume_identity_follows_the_declaration():
    from types import SimpleNamespace

    from draftline.train_state import NOT_IN_FINGERPRINT, run_fingerprint

    assert set(NOT_IN_FINGERPRINT) == OPERATIONAL[TrainConfig]
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


def test_declaration_names_only_sections_of_params():
    assert set(OUTPUT_SHAPING) == set(OPERATIONAL) == set(sections()), (
        "classify each section reached from Params"
    )
