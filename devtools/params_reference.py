"""docs/params.md, the reference of every params.yaml key, generated from the config classes.

    python -m devtools.params_reference            # rewrite docs/params.md
    python -m devtools.params_reference --check    # fail when docs/params.md is not what it generates

Each section is a pydantic model (draftline/params.py `Params` and each phase's config.py); a key's
type, constraints, default and kind (`shaping` / `operational`, draftline/core/config.py) come from
the model, and its description from the field's `description` when it has one, else from the
comments written at the field in the source: the comment lines right above it and any comment on
its own lines. Nothing is written by hand, so the reference cannot drift from the code
(tests/devtools/test_params_reference.py runs --check).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import io
import json
import sys
import tokenize
import types
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import annotated_types
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from draftline.core.config import Section, kind_of
from draftline.params import Params

ROOT = Path(__file__).resolve().parents[1]
OUT = "docs/params.md"

HEADER = """\
# params.yaml reference

Generated from the config classes by `python -m devtools.params_reference`
(devtools/params_reference.py); do not edit. Every key of every section, with its type and
constraints, its default ("required": no default), its kind and its description: the comments
written at the field in its config class.

Kind (draftline/core/config.py): `shaping` keys shape a stage's output, so a change makes a
different output and old outputs are not reused; `operational` keys say where, how fast or by which
engine the work runs, and a change never redoes work.
"""


@dataclass(frozen=True)
class Key:
    name: str
    type: str
    default: str
    kind: str
    description: str
    section: str | None  # the dotted key of its own table, for a key that holds sections


@dataclass(frozen=True)
class Table:
    path: str  # the section's dotted key ("" for the top level)
    model: type[BaseModel]
    doc: str
    keys: list[Key]


# ---- reading the source ---------------------------------------------------------------------------


@cache
def _module_source(path: str) -> tuple[str, ast.Module, dict[int, str], set[int]]:
    """(source, syntax tree, comment text by line, lines holding nothing but a comment)."""
    text = Path(path).read_text()
    comments, alone = {}, set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            row = tok.start[0]
            comments[row] = tok.string.lstrip("#").strip()
            if not tok.line[: tok.start[1]].strip():
                alone.add(row)
    return text, ast.parse(text), comments, alone


def _class_node(cls: type) -> tuple[str, ast.ClassDef, dict[int, str], set[int]]:
    text, tree, comments, alone = _module_source(inspect.getsourcefile(cls))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            return text, node, comments, alone
    raise LookupError(f"{cls.__qualname__}: no class statement in {inspect.getsourcefile(cls)}")


def _declaring_class(model: type[BaseModel], name: str) -> type:
    """The class of model's MRO whose own body declares field `name`."""
    for cls in model.__mro__:
        if name in cls.__dict__.get("__annotations__", {}):
            return cls
    raise LookupError(f"{model.__qualname__}.{name}: declared nowhere")


def field_source(model: type[BaseModel], name: str) -> tuple[str, str]:
    """(the annotation as written, the comments at the field: those right above it, then those on
    its own lines)."""
    text, node, comments, alone = _class_node(_declaring_class(model, name))
    for stmt in node.body:
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and stmt.target.id == name
        ):
            break
    else:
        raise LookupError(f"{model.__qualname__}.{name}: no annotated assignment")
    annotation = " ".join(ast.get_source_segment(text, stmt.annotation).split())
    above, row = [], stmt.lineno - 1
    while row in alone:
        above.insert(0, comments[row])
        row -= 1
    inline = [comments[r] for r in range(stmt.lineno, stmt.end_lineno + 1) if r in comments]
    return annotation, " — ".join(part for part in (" ".join(above), " ".join(inline)) if part)


# ---- the tables ----------------------------------------------------------------------------------


def _constraints(metadata: list) -> list[str]:
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    found = []
    for item in metadata:
        if isinstance(item, annotated_types.Interval | annotated_types.BaseMetadata):
            for attr, sign in signs.items():
                if getattr(item, attr, None) is not None:
                    found.append(f"{sign} {getattr(item, attr)!r}")
    return found


def _nested(annotation) -> tuple[str, type[BaseModel]] | None:
    """("" / ".<name>" / "[]", the section model) when the field holds a section, a mapping of
    names to sections or a list of them."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return "", annotation
    if origin is typing.Annotated:
        return _nested(args[0])
    if origin in (typing.Union, types.UnionType):
        return next((found for arg in args if (found := _nested(arg))), None)
    if origin is dict and len(args) == 2 and (found := _nested(args[1])) and not found[0]:
        return ".<name>", found[1]
    if origin is list and args and (found := _nested(args[0])) and not found[0]:
        return "[]", found[1]
    return None


def _value(value) -> str:
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    # sections inside a mapping or list (benchmark.free's) as their fields
    return f"`{json.dumps(value, default=lambda section: section.model_dump())}`"


def tables(
    model: type[BaseModel] = Params, path: str = "", instance: BaseModel | None = None
) -> list[Table]:
    """The table of `model` at dotted key `path`, then those of the sections inside it, in field
    order; defaults are `instance`'s where a parent's default gives one (regenerate.long is not
    regenerate.short)."""
    keys, inner = [], []
    for name, info in model.model_fields.items():
        annotation, comments = field_source(model, name)
        key = f"{path}.{name}" if path else name
        if instance is not None:
            default = getattr(instance, name)
        elif info.default_factory is not None:
            default = info.default_factory()
        else:
            default = info.default
        nested = _nested(info.annotation)
        shown, section = _value(default), None
        if nested and nested[0] == "":
            shown, section = f"see `{key}`", key
            inner += tables(nested[1], key, default if isinstance(default, BaseModel) else None)
        elif nested:
            section = key + nested[0]
            inner += tables(nested[1], section)
        typed = ", ".join([f"`{annotation}`", *_constraints(info.metadata)])
        kind = kind_of(model, name) or "—"
        keys.append(Key(name, typed, shown, kind, info.description or comments, section))
    doc = inspect.getdoc(model) if "__doc__" in model.__dict__ and model.__doc__ else ""
    return [Table(path, model, doc or "", keys), *inner]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(all_tables: list[Table]) -> str:
    blocks = [HEADER.rstrip("\n")]
    for table in all_tables:
        source = Path(inspect.getsourcefile(table.model)).relative_to(ROOT)
        blocks.append(f"## `{table.path}`" if table.path else "## Top level")
        blocks.append(f"{source}, `{table.model.__name__}`.")
        if table.doc:
            blocks.append(" ".join(table.doc.split()))
        rows = ["| key | type | default | kind | description |", "|---|---|---|---|---|"]
        for k in table.keys:
            cells = (f"`{k.name}`", k.type, k.default, k.kind, k.description or "—")
            rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        blocks.append("\n".join(rows))
    return "\n\n".join(blocks) + "\n"


def undescribed(all_tables: list[Table]) -> list[str]:
    """The dotted keys without a description, sections aside (each has its own table)."""
    return [
        f"{t.path}.{k.name}" if t.path else k.name
        for t in all_tables
        for k in t.keys
        if not k.description and k.section is None
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help=f"change nothing; exit 1 if {OUT} differs")
    ap.add_argument("--root", default=str(ROOT), help="where docs/ is")
    args = ap.parse_args(argv)
    path = Path(args.root) / OUT
    all_tables = tables()
    text = render(all_tables)
    missing = undescribed(all_tables)
    keys = sum(len(t.keys) for t in all_tables)
    if args.check:
        if not path.is_file() or path.read_text() != text:
            raise SystemExit(f"{OUT} is stale: run `python -m devtools.params_reference`")
        return
    path.write_text(text)
    print(f"{OUT}: {keys} keys, {len(missing)} without a description")


if __name__ == "__main__":
    main(sys.argv[1:])
