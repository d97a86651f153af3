"""Every stage calls its phase through one shape: `run(params, paths)` of the phase's entry
module, with `Paths` (a NamedTuple of the stage's command line) beside it (docs/code-map.md)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = sorted(
    p.stem for p in (ROOT / "stages").glob("*.py") if p.stem not in ("__init__", "check_params")
)


def entry_module(stage: str) -> str:
    """The module a stage imports `run` from."""
    tree = ast.parse((ROOT / "stages" / f"{stage}.py").read_text())
    found = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.module
        and node.module.startswith("draftline.")
        and {"run", "Paths"} <= {alias.name for alias in node.names}
    }
    assert len(found) == 1, f"stages/{stage}.py imports run and Paths from {sorted(found)}"
    return found.pop()


@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_calls_its_phase_by_run_params_paths(stage):
    tree = ast.parse((ROOT / "stages" / f"{stage}.py").read_text())
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "run"
    ]
    assert calls and all(
        len(c.args) == 2 and isinstance(c.args[0], ast.Name) and c.args[0].id == "params"
        for c in calls
    ), f"stages/{stage}.py: call run(params, paths)"
    module = entry_module(stage)
    source = ROOT / Path(*module.split(".")).with_suffix(".py")
    defs = {
        n.name: n
        for n in ast.parse(source.read_text()).body
        if isinstance(n, (ast.FunctionDef, ast.ClassDef))
    }
    assert [a.arg for a in defs["run"].args.args] == ["params", "paths"], (
        f"{module}.run(params, paths)"
    )
    assert any(getattr(b, "id", None) == "NamedTuple" for b in defs["Paths"].bases), (
        f"{module}.Paths"
    )
