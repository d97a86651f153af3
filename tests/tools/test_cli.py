"""`draftline COMMAND`: the console script runs each tool's main as `python -m` does, and the docs
name the tools by it."""

import importlib
import re
import subprocess
import sys
from pathlib import Path

from draftline.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).with_name("draftline")  # what pyproject's [project.scripts] installs


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_every_command_is_a_main_and_listed():
    listing = run(str(SCRIPT), "--help")
    assert listing.returncode == 0
    for name, (module, _) in COMMANDS.items():
        assert callable(importlib.import_module(module).main)
        assert f"  {name} " in listing.stdout


def test_a_command_prints_what_its_module_prints():
    args = ["--hidden-size", "7168", "--samples", "25000", "--tokens-per-sample", "4000"]
    args += ["--free-gb", "30000"]
    ours = run(str(SCRIPT), "plan", *args)
    module = run(sys.executable, "-m", "draftline.tools.plan", *args)
    assert ours.returncode == module.returncode == 0, ours.stderr
    assert ours.stdout == module.stdout and "hidden size 7168" in ours.stdout


def test_an_unknown_command_fails_with_the_list():
    out = run(str(SCRIPT), "plans")
    assert out.returncode == 2
    assert "unknown command 'plans'" in out.stderr and "  plan " in out.stderr


def test_docs_name_the_tools_by_the_command():
    modules = "|".join(
        re.escape(module.removeprefix("draftline.")) for module, _ in COMMANDS.values()
    )
    old = re.compile(rf"python -m draftline\.({modules})\b")
    found = [
        f"{path.relative_to(ROOT)}: {m.group(0)}"
        for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for m in old.finditer(path.read_text())
    ]
    assert not found, found
