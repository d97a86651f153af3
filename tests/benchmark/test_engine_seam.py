"""The benchmark's engines (draftline/benchmark/engines.py): a stub served engine registered there
gets a serve command, a served draft and preflight with no other file touched, and no other
benchmark module compares an engine's name."""

import ast
from pathlib import Path

import pytest

from draftline.benchmark.commands import benchmark_serve_command, draft_path_for
from draftline.benchmark.config import BenchmarkConfig
from draftline.benchmark.engines import (
    ENGINES,
    NoServer,
    Vllm,
    register,
    served_engine,
    served_engines,
    unregister,
)
from draftline.benchmark.preflight import check_engine_settings
from draftline.draft.checkpoint import read_draft_facts

ROOT = Path(__file__).resolve().parents[2]
NAMES = set(ENGINES)


class Stub(Vllm):
    """A test-only served engine: vLLM's hooks under another name."""

    name = "stub"


@pytest.fixture
def stub():
    register(Stub())
    yield ENGINES["stub"]
    unregister("stub")


def test_the_engines_in_order():
    assert list(ENGINES) == ["vllm", "sglang", "hf"]
    assert [e.name for e in served_engines()] == ["vllm", "sglang"]
    with pytest.raises(NoServer, match="no server command for engine 'hf'"):
        served_engine("hf")


def test_a_stub_engine_is_one_class(stub, random_target, eagle3_draft_dir):
    assert BenchmarkConfig(engine="stub", compare={"x": "drafts/x"}).engine == "stub"
    cfg = BenchmarkConfig()
    assert stub in served_engines()
    path = draft_path_for("stub", cfg, str(eagle3_draft_dir))
    assert path == str(Path(eagle3_draft_dir).resolve())
    assert check_engine_settings("stub", cfg, read_draft_facts(path)) == []
    command = benchmark_serve_command("stub", random_target, cfg, path)
    assert command == benchmark_serve_command("vllm", random_target, cfg, path)


# engines.py is the seam, engine_kinds.py the names it registers
OUTSIDE = ("engines.py", "engine_kinds.py")


def test_no_benchmark_module_but_the_seam_compares_engine_names():
    found = []
    for path in sorted((ROOT / "draftline/benchmark").glob("*.py")):
        if path.name in OUTSIDE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(
                isinstance(sub, ast.Constant) and sub.value in NAMES
                for part in (node.left, *node.comparators)
                for sub in ast.walk(part)
            ):
                found.append(f"{path.name}:{node.lineno}")
    assert not found, f"engine names compared outside draftline/benchmark/engines.py: {found}"


def test_the_params_name_only_registered_engines():
    with pytest.raises(
        ValueError, match="engine 'nope' is none of the registered vllm, sglang, hf"
    ):
        BenchmarkConfig(engine="nope")
    with pytest.raises(ValueError, match="compare: only for a served engine"):
        BenchmarkConfig(engine="hf", compare={"x": "drafts/x"})
    with pytest.raises(ValueError, match="endpoints: only for a served engine, not hf"):
        BenchmarkConfig(engine="hf", endpoints={"baseline": "http://h:1"})
