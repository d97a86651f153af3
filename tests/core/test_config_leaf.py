"""The params schema imports nothing of the stages' work: core/config.py no project module but the
errors every phase raises (core/errors.py, itself importing only core/log.py and core/machine.py), and a
phase's config.py only core/ and its own package. So reading params pulls in no stage's code, no
import cycle runs through the configs, and an edit to one phase's config reruns only that phase's
stages (with check_params). One exception: train's config takes train.method's names and sections
from the methods' facts (draftline/draft/params/), which import only core/ and themselves when they
run; what the drafters do (draftline/draft/methods/) is only in the closure of the stages that run
them, so an edit to a drafter's forward reruns neither hidden_states nor check_params. Likewise
benchmark's config takes benchmark.free's names and defaults from the registry of the methods that
need no draft (draftline/draft/free.py), which imports nothing of the project."""

import ast
from pathlib import Path

from draftline.core.code import closure, imports, stage_names

ROOT = Path(__file__).resolve().parents[2]


def project_imports(path: Path) -> set[str]:
    imported = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add("." * node.level + (node.module or ""))
    return {n for n in imported if n.split(".")[0] in ("draftline", "stages") or n.startswith(".")}


def test_the_free_methods_registry_imports_nothing_of_the_project():
    assert not project_imports(ROOT / "draftline/draft/free.py")


def test_core_config_imports_no_project_module():
    assert project_imports(ROOT / "draftline/core/config.py") == {"draftline.core.errors"}
    assert project_imports(ROOT / "draftline/core/errors.py") == {
        "draftline.core.log",
        "draftline.core.machine",
    }
    assert not project_imports(ROOT / "draftline/core/log.py")
    assert not project_imports(ROOT / "draftline/core/machine.py")


# what a phase's config may import beyond core/ and its own package, and why: each method's facts
# module owns train.method's name, its params section and the train params it refuses
ALSO = {
    "draftline/train/config.py": ("draftline.draft.params",),
    # the registry of speculation with no draft owns benchmark.free's names and defaults; evaluate
    # replays them too, so it lives beside the drafters, not in benchmark/
    "draftline/benchmark/config.py": ("draftline.draft.free",),
}


def test_a_phase_config_imports_only_core_and_its_own_package():
    configs = sorted((ROOT / "draftline").glob("*/config.py"))
    assert len(configs) >= 9
    for path in configs:
        package = f"draftline.{path.parent.name}"
        also = ALSO.get(str(path.relative_to(ROOT)), ())
        foreign = sorted(
            name
            for name in project_imports(path)
            if not name.startswith(("draftline.core.", f"{package}.")) and name not in also
        )
        assert not foreign, f"{path.relative_to(ROOT)} imports {foreign}: only core/ and {package}"


def test_the_methods_facts_import_only_core_and_themselves_when_they_run():
    """What train's config pulls in with the methods: their own modules and core/ (a type
    annotation may name any module: it runs nothing)."""
    package = ROOT / "draftline/draft/params"
    for path in sorted(package.glob("*.py")):
        foreign = sorted(
            name
            for name, _ in imports(ROOT, path, runtime=True)
            if name.startswith("draftline.")
            and not name.startswith(("draftline.core.", "draftline.draft.params"))
        )
        assert not foreign, f"{path.relative_to(ROOT)} runs {foreign}: only core/ and its package"


def test_only_the_stages_that_run_drafters_have_their_code():
    """Reading params takes the methods' facts; the drafters' own modules are code only of the
    stages that train, read or serve a draft (probe reads train.init's checkpoint)."""
    running = {
        stage
        for stage in stage_names(ROOT)
        if any(m.startswith("draftline/draft/methods/") for m in closure(ROOT, f"stages.{stage}"))
    }
    assert running == {"benchmark", "evaluate", "probe", "train"}
