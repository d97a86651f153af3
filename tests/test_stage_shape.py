"""Every stage calls its phase through one shape: `run(params, paths)` of the phase's entry
module, with `Paths` (a NamedTuple or dataclass of the stage's command line) beside it (docs/code-map.md)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = sorted(
    # check_params and code read no phase: they check params.yaml and fingerprint the code
    p.stem
    for p in (ROOT / "stages").glob("*.py")
    if p.stem not in ("__init__", "check_params", "code")
)


def module_of(stage: str, name: str) -> str:
    """The draftline module a stage imports `name` from (run: the phase's entry module; Paths:
    there or in the phase's light paths module, which importers without the phase's weight share)."""
    tree = ast.parse((ROOT / "stages" / f"{stage}.py").read_text())
    found = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.module
        and node.module.startswith("draftline.")
        and name in {alias.name for alias in node.names}
    }
    assert len(found) == 1, f"stages/{stage}.py imports {name} from {sorted(found)}"
    return found.pop()


def top_defs(module: str) -> dict:
    source = ROOT / Path(*module.split(".")).with_suffix(".py")
    return {
        n.name: n
        for n in ast.parse(source.read_text()).body
        if isinstance(n, (ast.FunctionDef, ast.ClassDef))
    }


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
    module, paths_module = module_of(stage, "run"), module_of(stage, "Paths")
    assert paths_module.rsplit(".", 1)[0] == module.rsplit(".", 1)[0], (
        f"stages/{stage}.py: Paths from another phase ({paths_module})"
    )
    assert [a.arg for a in top_defs(module)["run"].args.args] == ["params", "paths"], (
        f"{module}.run(params, paths)"
    )
    paths = top_defs(paths_module)["Paths"]
    assert any(getattr(b, "id", None) == "NamedTuple" for b in paths.bases) or any(
        "dataclass" in ast.unparse(d) for d in paths.decorator_list
    ), f"{paths_module}.Paths: a NamedTuple or dataclass of the command line"
