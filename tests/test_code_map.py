"""docs/code-map.md places every package of draftline/ and names none that is gone; every package
says what it owns in its __init__ docstring."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def packages() -> set[str]:
    return {p.parent.name for p in (ROOT / "draftline").glob("*/__init__.py")}


def test_code_map_places_every_package():
    text = (ROOT / "docs" / "code-map.md").read_text()
    named = set(re.findall(r"`([a-z_]+)/`", text)) - {
        "draftline",
        "stages",
        "tests",
        "overhead",
        "scripts",
    }
    assert not packages() - named, f"docs/code-map.md does not place {sorted(packages() - named)}"
    assert not named - packages(), (
        f"docs/code-map.md names packages that do not exist: {sorted(named - packages())}"
    )


def test_every_package_says_what_it_owns():
    for name in sorted(packages()):
        init = ROOT / "draftline" / name / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.splitlines()) <= 4, (
            f"draftline/{name}/__init__.py: a short docstring"
        )
