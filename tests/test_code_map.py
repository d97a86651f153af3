"""docs/code-map.md names every module of draftline/, and no module that is gone."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_code_map_names_every_module():
    text = (ROOT / "docs" / "code-map.md").read_text()
    named = set(re.findall(r"`([a-z_]+\.py)`", text))
    modules = {p.name for p in (ROOT / "draftline").glob("*.py") if p.name != "__init__.py"}
    assert not modules - named, f"docs/code-map.md does not place {sorted(modules - named)}"
    assert not named - modules, (
        f"docs/code-map.md names modules that do not exist: {sorted(named - modules)}"
    )
