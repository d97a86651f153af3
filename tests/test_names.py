"""A file's name says its one job: no two code files share a stem (overhead/hs_extraction.py, not a
second hidden_states.py beside the stage)."""

import subprocess
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Stems that may repeat, and why: packages; a stage and the library module of the same concern;
# a script and the shell wrapper that runs it.
SHARED = {
    "__init__": None,
    "target": {"stages/target.py", "draftline/target.py"},
    "probe": {"stages/probe.py", "draftline/probe.py"},
    "gpu_check": {"scripts/gpu_check.py", "scripts/gpu_check.sh"},
}


def test_no_two_files_share_a_stem():
    files = subprocess.run(
        ["git", "ls-files", "*.py", "*.sh"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    by_stem = defaultdict(set)
    for path in files:
        if not path.startswith("tests/"):
            by_stem[Path(path).stem].add(path)
    clashes = {
        stem: sorted(paths)
        for stem, paths in by_stem.items()
        if len(paths) > 1
        and SHARED.get(stem, set()) is not None
        and not paths <= SHARED.get(stem, set())
    }
    assert not clashes, (
        f"files sharing a name for different jobs (rename one, or list the pair in SHARED): {clashes}"
    )
