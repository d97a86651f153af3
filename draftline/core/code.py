"""The code a stage runs, and a fingerprint of what that code does.

A stage's code is `stages/<name>.py` and every project module it imports, transitively, including
imports inside functions and modules it names to be loaded by name (a server started as
`python -m draftline.engines.batch_server`, vLLM's connector module), read with ast: nothing is
imported. `dvc.yaml` does not list those files: each stage depends on `reports/code/<name>.json`
(the `code` stage writes them), which holds the fingerprint of every module of its closure and of
the pinned environment it runs in (draftline/core/environment.py). A module's fingerprint hashes its
tokens with docstrings and comments left out (`without_prose`, the same text on every Python the
project allows), so an edit to prose leaves every fingerprint, and so every stage, as it was; an
edit to what the code does changes the fingerprint of exactly the stages that run it."""

from __future__ import annotations

import ast
import hashlib
import io
import re
import tokenize
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
    """The import nodes inside `if TYPE_CHECKING:` blocks (or `typing.TYPE_CHECKING`): read by type
    checkers, never run. Any other test (`if not TYPE_CHECKING:`, `if TYPE_CHECKING or X:`) runs."""
    return {
        node
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and is_type_checking(block.test)
        for stmt in block.body
        for node in ast.walk(stmt)
    }


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


# A string that is a whole dotted project module name: a module another process loads by name
# (`python -m draftline.engines.batch_server`, vLLM's connector module), part of what runs.
MODULE_NAME = re.compile(rf"(?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def named_modules(root: Path, path: Path, text: str | None = None) -> set[str]:
    """Project modules `path` names in a string constant: loaded by name by what it launches
    (servers started as `python -m`, engine plugins and connectors), so they are its code too."""
    tree = ast.parse(path.read_text() if text is None else text, filename=str(path))
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and MODULE_NAME.fullmatch(node.value)
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
    } | named_modules(root, path)


def required_modules(root: Path, path: Path, text: str | None = None) -> set[str]:
    """Dotted names `path` (or `text`) imports that must be modules: `import a.b` (a and a.b), and
    the `a` of `from a import b` (b may be a name in a), and a module named in a string to be loaded
    by name (named_modules)."""
    parts = [base.split(".") for base, _ in imports(root, path, text=text)]
    parts += [name.split(".") for name in named_modules(root, path, text)]
    return {".".join(p[:i]) for p in parts for i in range(1, len(p) + 1)}


def docstring_spans(tree: ast.AST) -> dict[tuple[int, int], tuple[tuple[int, int], bool]]:
    """{start (line, col): (end (line, col), whether it is the whole body)} of every docstring:
    the first statement of a module, class or function when it is a string literal."""
    spans = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            if isinstance(body[0].value.value, str):
                doc = body[0]
                spans[(doc.lineno, doc.col_offset)] = (
                    (doc.end_lineno, doc.end_col_offset),
                    len(body) == 1 and not isinstance(node, ast.Module),
                )
    return spans


# token kinds that carry layout or prose, never what the code does
_LAYOUT = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}
_MARKS = {tokenize.NEWLINE: "<newline>", tokenize.INDENT: "<indent>", tokenize.DEDENT: "<dedent>"}
# Python 3.12+ splits an f-string into START / MIDDLE / END tokens (PEP 701); Python 3.11 gives
# one STRING
_FSTRING_START = getattr(tokenize, "FSTRING_START", None)
_FSTRING_END = getattr(tokenize, "FSTRING_END", None)


def without_prose(source: str, filename: str = "<code>") -> str:
    """The code of `source` as its tokens, one per line, docstrings and comments dropped and layout
    reduced to newline/indent/dedent marks: what the code does, not what it says.

    Tokens are the language's own units, so the text is the same on every Python the project
    allows: a dump of the syntax tree (`ast.dump`) is not (Python 3.12 added fields to function and
    class nodes, Python 3.13 changed what it prints), and tokenize's split of f-strings since
    Python 3.12 is joined back into the literal's source text. A docstring that is a whole body
    reads as `pass`.
    """
    tree = ast.parse(source, filename=filename)  # a syntax error is named here, with the file
    docstrings = docstring_spans(tree)
    lines = source.splitlines(keepends=True)
    out: list[str] = []
    skip_to: tuple[int, int] | None = None
    fstring_from: tuple[int, int] | None = None
    depth = 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if _FSTRING_START is not None and tok.type == _FSTRING_START:
            depth += 1
            fstring_from = fstring_from or tok.start
            continue
        if depth:
            if tok.type == _FSTRING_END:
                depth -= 1
                if depth == 0:
                    text = source_between(lines, fstring_from, tok.end)
                    fstring_from = None
                    if skip_to is None:
                        out.append(text)
            continue
        if skip_to is not None:
            if tok.start < skip_to or tok.type in _LAYOUT:
                continue
            skip_to = None
            if tok.type == tokenize.NEWLINE:  # the docstring's own line end
                continue
        if tok.start in docstrings and tok.type == tokenize.STRING:
            skip_to, whole_body = docstrings[tok.start]
            if whole_body:
                out += ["pass", _MARKS[tokenize.NEWLINE]]
            continue
        if tok.type in _LAYOUT:
            continue
        out.append(_MARKS.get(tok.type, tok.string))
    return "\n".join(out)


def source_between(lines: list[str], start: tuple[int, int], end: tuple[int, int]) -> str:
    """The source text from `start` to `end`, both (line from 1, column) as tokenize gives them."""
    (l0, c0), (l1, c1) = start, end
    if l0 == l1:
        return lines[l0 - 1][c0:c1]
    return lines[l0 - 1][c0:] + "".join(lines[l0 : l1 - 1]) + lines[l1 - 1][:c1]


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
    closure with its fingerprint, and the pins of the environments it runs in."""
    from draftline.core.environment import stage_environment

    modules = closure(root, f"stages.{stage}")
    return {
        "stage": stage,
        "modules": {m: code_sha256(root / m) for m in modules},
        "environment": stage_environment(root, modules),
    }


def stage_names(root: Path) -> list[str]:
    """Every stage module in stages/ (each `python -m stages.<name>`) but `code`, which writes
    the fingerprints and depends on all of the code itself."""
    return sorted(
        p.stem for p in (root / "stages").glob("*.py") if p.stem not in ("__init__", "code")
    )
