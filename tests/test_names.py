"""A file's name says its one job within its package: no two code files of one directory share a
stem (overhead/hs_extraction.py, not a second hidden_states.py). Across packages the package says
the phase (draftline/regenerate/run.py and draftline/train/run.py)."""

import subprocess
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Stems that may repeat in one directory, and why: a script and the shell wrapper that runs it.
SHARED = {"scripts/gpu_check": {"scripts/gpu_check.py", "scripts/gpu_check.sh"}}


def clashes(files: list[str]) -> dict[str, list[str]]:
    by_stem = defaultdict(set)
    for path in files:
        p = Path(path)
        by_stem[str(p.parent / p.stem)].add(path)
    return {
        stem: sorted(paths)
        for stem, paths in by_stem.items()
        if len(paths) > 1 and not paths <= SHARED.get(stem, set())
    }


def test_no_two_files_of_a_package_share_a_stem():
    files = subprocess.run(
        ["git", "ls-files", "*.py", "*.sh"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    found = clashes(files)
    assert not found, (
        f"files of one package sharing a name (rename one, or list it in SHARED): {found}"
    )


def test_a_clash_is_found_within_a_package_only():
    assert clashes(["a/run.py", "b/run.py", "a/x.py"]) == {}
    assert clashes(["a/run.py", "a/run.sh"]) == {"a/run": ["a/run.py", "a/run.sh"]}


# Directory names that common global ignore files (core.excludesFile) and code tools skip as build
# output: Cargo's and Maven's target/, Python's build/ and dist/, and the like. A contributor with
# such an ignore would never commit a new file under one, so no tracked code lives in a folder so
# named (draftline/targets/ holds the target-model phase for that reason).
BUILD_OUTPUT_NAMES = {"target", "build", "dist", "out", "bin", "obj", "node_modules", "vendor"}


def test_no_code_folder_has_a_build_output_name():
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    found = sorted(
        {
            str(Path(*Path(f).parts[: i + 1]))
            for f in files
            for i, part in enumerate(Path(f).parts[:-1])
            if part in BUILD_OUTPUT_NAMES
        }
    )
    assert not found, f"folders that global ignores commonly skip: {found}"
