"""dvc.yaml lists, for each stage, exactly the project code the stage runs.

A stage's code is `stages/<name>.py` and every project module it imports, transitively, including
imports inside functions (read with ast, nothing is imported). A module missing from the stage's
deps would leave a stale output that `dvc status` calls clean after an edit; a listed module the
stage never reaches would rerun it for nothing. An import of a project module that does not
exist fails too (the walk would otherwise stop short of the files behind it).
"""

import ast
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("draftline", "stages")  # the project's own code; scripts/ and overhead/ are not stages
STAGE_CMD = re.compile(r"python -m (stages\.\w+)")


def module_file(name: str) -> Path | None:
    """The project file of a dotted module name, or None (not ours, or not a module)."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = ROOT / Path(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def type_checking_only(tree: ast.AST) -> set[ast.AST]:
    """The import nodes inside `if TYPE_CHECKING:` blocks: read by type checkers, never run."""
    return {
        node
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for stmt in block.body
        for node in ast.walk(stmt)
    }


def imports(path: Path, text: str | None = None, runtime: bool = False):
    """(module, names) of every import in `path` (or `text` as if it were at `path`), anywhere in
    it (`runtime`: leaving out those under `if TYPE_CHECKING:`): `import a.b` is ("a.b", []),
    `from .x import y` is ("<package>.x", ["y"])."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    source = path.read_text() if text is None else text
    tree = ast.parse(source, filename=str(path))
    skip = type_checking_only(tree) if runtime else set()
    for node in ast.walk(tree):
        if node in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            yield base, [alias.name for alias in node.names]


def imported_modules(path: Path) -> set[str]:
    """Dotted names of every module `path` imports when it runs, anywhere in it (`from a import
    b`: a, and a.b when b is a module); an import for type checkers only runs nothing."""
    return {
        name
        for base, names in imports(path, runtime=True)
        for name in [base, *(f"{base}.{n}" for n in names)]
    }


def required_modules(path: Path, text: str | None = None) -> set[str]:
    """Dotted names `path` (or `text`) imports that must be modules: `import a.b` (a and a.b), and
    the `a` of `from a import b` (b may be a name in a)."""
    parts = [base.split(".") for base, _ in imports(path, text)]
    return {".".join(p[:i]) for p in parts for i in range(1, len(p) + 1)}


def has_code(path: Path) -> bool:
    """False for an __init__.py holding only a docstring (importing it runs nothing)."""
    body = ast.parse(path.read_text()).body
    return not all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body)


def closure(module: str) -> set[str]:
    """Repository-relative paths of the project files a `python -m <module>` can execute."""
    todo, seen = [module_file(module)], set()
    while todo:
        path = todo.pop()
        if path is None or path in seen:
            continue
        seen.add(path)
        for name in imported_modules(path):
            parts = name.split(".")
            # importing a.b.c runs a/__init__.py and a/b/__init__.py first
            todo.extend(module_file(".".join(parts[:i])) for i in range(1, len(parts) + 1))
    return {str(p.relative_to(ROOT)) for p in seen if p.name != "__init__.py" or has_code(p)}


def stages() -> dict[str, dict]:
    """Each stage of dvc.yaml; a foreach stage by its `do` template (its deps are the same for every item)."""
    with open(ROOT / "dvc.yaml") as f:
        spec = yaml.safe_load(f)["stages"]
    return {name: stage.get("do", stage) for name, stage in spec.items()}


def code_deps(stage: dict) -> set[str]:
    return {dep if isinstance(dep, str) else next(iter(dep)) for dep in stage.get("deps", [])}


def covered(path: str, deps: set[str]) -> bool:
    return any(path == dep or path.startswith(dep.rstrip("/") + "/") for dep in deps)


@pytest.mark.parametrize("name", sorted(stages()))
def test_stage_lists_its_import_closure(name):
    stage = stages()[name]
    match = STAGE_CMD.search(stage["cmd"])
    assert match, (
        f"dvc.yaml stage {name}: cmd does not run `python -m stages.<name>`: {stage['cmd']!r}"
    )
    needed = closure(match.group(1))
    assert needed, f"dvc.yaml stage {name}: {match.group(1)} is not a module of this repository"
    deps = code_deps(stage)
    missing = sorted(p for p in needed if not covered(p, deps))
    assert not missing, (
        f"dvc.yaml stage {name}: the stage imports {missing} (directly or through the modules it "
        f"uses) but does not list them as deps; add them, or an edit to them leaves a stale output"
    )
    unused = sorted(
        d for d in deps if d.endswith(".py") and d.split("/")[0] in PACKAGES and d not in needed
    )
    assert not unused, (
        f"dvc.yaml stage {name}: lists {unused} as deps but never imports them; remove them, or an "
        f"edit to them reruns the stage for nothing"
    )


def test_closure_follows_imports_inside_functions():
    """The walk sees an import inside a function, and follows imports transitively."""
    found = imported_modules(ROOT / "stages" / "benchmark.py")
    assert "draftline.benchmark.run" in found  # imported inside main()
    assert "draftline/tokens/config.py" in closure("stages.vocab")
    assert "draftline/target/model.py" in closure("stages.benchmark")


def test_an_import_for_type_checkers_only_is_no_dep(tmp_path):
    text = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from draftline.benchmark.config import BenchmarkConfig\n"
        "import draftline.core.io\n"
    )
    path = ROOT / "stages" / "probe.py"
    assert "draftline.benchmark.config" in required_modules(path, text)  # it must still exist
    runtime = {base for base, _ in imports(path, text, runtime=True)}
    assert "draftline.core.io" in runtime and "draftline.benchmark.config" not in runtime


def test_no_import_cycle():
    """No project module imports itself back, through any chain of the imports that run (at
    module top or inside a function): each package builds on those below it."""
    graph = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            deps = {module_file(name) for name in imported_modules(path)} - {None, path}
            graph[path] = {d for d in deps if d.name != "__init__.py"}
    done, cycles = set(), []

    def visit(node, trail):
        if node in trail:
            cycles.append(" -> ".join(str(p.relative_to(ROOT)) for p in trail[trail.index(node) :]))
            return
        if node in done:
            return
        for dep in sorted(graph.get(node, ())):
            visit(dep, [*trail, node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    assert not cycles, "import cycles:\n  " + "\n  ".join(cycles)


def test_every_project_import_resolves():
    """An import of a project module that does not exist fails here, in every file of draftline/
    and stages/ (a module only a GPU host imports included), instead of leaving the closure walk
    short of a file."""
    broken = [
        f"{path.relative_to(ROOT)}: {name}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for name in sorted(required_modules(path))
        if name.split(".")[0] in PACKAGES and module_file(name) is None
    ]
    assert not broken, f"imports of project modules that do not exist: {broken}"


def test_an_unresolved_import_is_found():
    text = "from draftline.no_such_module import x\nimport draftline.tokens.chat\nfrom .sibling import y\n"
    names = required_modules(ROOT / "stages" / "probe.py", text)
    assert {
        "draftline.no_such_module",
        "draftline",
        "draftline.tokens.chat",
        "stages.sibling",
    } <= names
    assert module_file("draftline.no_such_module") is None
    assert module_file("draftline.tokens.chat") is not None
