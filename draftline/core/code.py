"""The code a stage runs, and a fingerprint of what that code does.

A stage's code is `stages/<name>.py` and every project module it imports, transitively, including
imports inside functions (read with ast; nothing is imported). `dvc.yaml` does not list those
files: each stage depends on `reports/code/<name>.json` (the `code` stage writes them), which holds
the fingerprint of every module of its closure. A fingerprint hashes the module's syntax tree with
its docstrings left out (comments never reach the tree, nor does layout), so an edit to prose
leaves every fingerprint, and so every stage, as it was; an edit to what the code does changes the
fingerprint of exactly the stages that import it.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

PACKAGES = ("draftline", "stages")  # the project's own code; scripts/ and overhead/ are no stages


class MissingModule(ImportError):
    """A project import names a module that does not exist (the walk would stop short of it)."""


def module_file(root: Path, name: str) -> Path | None:
    """The project file of a dotted module name under `root`, or None (not ours, or not a module)."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = root.joinpath(*name.split("."))
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


def imports(root: Path, path: Path, runtime: bool = False, text: str | None = None):
    """(module, names) of every import in `path` (or `text` as if it were at `path`), anywhere in
    it (`runtime`: leaving out those under `if TYPE_CHECKING:`): `import a.b` is ("a.b", []),
    `from .x import y` is ("<package>.x", ["y"])."""
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    tree = ast.parse(path.read_text() if text is None else text, filename=str(path))
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


def imported_modules(root: Path, path: Path) -> set[str]:
    """Dotted names of every module `path` imports when it runs, anywhere in it (`from a import
    b`: a, and a.b when b is a module); an import for type checkers only runs nothing."""
    return {
        name
        for base, names in imports(root, path, runtime=True)
        for name in [base, *(f"{base}.{n}" for n in names)]
    }


def required_modules(root: Path, path: Path, text: str | None = None) -> set[str]:
    """Dotted names `path` (or `text`) imports that must be modules: `import a.b` (a and a.b), and
    the `a` of `from a import b` (b may be a name in a)."""
    parts = [base.split(".") for base, _ in imports(root, path, text=text)]
    return {".".join(p[:i]) for p in parts for i in range(1, len(p) + 1)}


def without_prose(source: str, filename: str = "<code>") -> str:
    """The syntax tree of `source` as text, docstrings dropped: what the code does, not what it
    says (comments, blank lines and line numbers never reach it)."""
    tree = ast.parse(source, filename=filename)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            if isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def code_sha256(path: Path) -> str:
    """The fingerprint of one module: sha256 of its syntax tree without prose."""
    return hashlib.sha256(without_prose(path.read_text(), str(path)).encode()).hexdigest()


def runs_code(path: Path) -> bool:
    """False for an __init__.py holding only a docstring (importing it runs nothing)."""
    body = ast.parse(path.read_text()).body
    return not all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body)


def closure(root: Path, module: str) -> list[str]:
    """Repository-relative paths, sorted, of the project files a `python -m <module>` can execute.
    Raises MissingModule for an import of a project module that does not exist."""
    start = module_file(root, module)
    if start is None:
        raise MissingModule(f"{module} is not a module of this repository")
    todo, seen = [start], set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in sorted(required_modules(root, path)):
            if name.split(".")[0] in PACKAGES and module_file(root, name) is None:
                raise MissingModule(
                    f"{path.relative_to(root)} imports {name}, which does not exist"
                )
        for name in imported_modules(root, path):
            parts = name.split(".")
            # importing a.b.c runs a/__init__.py and a/b/__init__.py first
            found = (module_file(root, ".".join(parts[:i])) for i in range(1, len(parts) + 1))
            todo.extend(p for p in found if p is not None)
    return sorted(str(p.relative_to(root)) for p in seen if p.name != "__init__.py" or runs_code(p))


def stage_fingerprint(root: Path, stage: str) -> dict:
    """What `reports/code/<stage>.json` holds: each module of `python -m stages.<stage>`'s
    closure with its fingerprint."""
    modules = closure(root, f"stages.{stage}")
    return {"stage": stage, "modules": {m: code_sha256(root / m) for m in modules}}


def stage_names(root: Path) -> list[str]:
    """Every stage module in stages/ (each `python -m stages.<name>`) but `code`, which writes
    the fingerprints and depends on all of the code itself."""
    return sorted(
        p.stem for p in (root / "stages").glob("*.py") if p.stem not in ("__init__", "code")
    )
