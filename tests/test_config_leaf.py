"""draftline/config.py is a leaf: it imports no project module, so every stage validates params.yaml
first, in about a second, and no library module can pull config into an import cycle."""

import ast
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[1] / "draftline/config.py"


def test_config_imports_no_project_module():
    imported = set()
    for node in ast.walk(ast.parse(CONFIG.read_text(), filename=str(CONFIG))):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add("." * node.level + (node.module or ""))
    project = sorted(
        name
        for name in imported
        if name.split(".")[0] in ("draftline", "stages") or name.startswith(".")
    )
    assert not project, (
        f"draftline/config.py imports project modules {project}; it must stay a leaf"
    )
