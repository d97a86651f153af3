"""The content of each draft benchmark.compare serves beside this run's (stage `compare_drafts`).

The drafts live outside the pipeline's outputs (another run's models/draft, a downloaded drafter),
so DVC cannot list them as deps of `benchmark`: the stage runs on every `dvc repro` (always
changed), hashes each directory and writes {name: {path, sha256, files}}; the file's text changes,
and `benchmark` reruns, only when a draft's content, name or path did.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import NamedTuple

from draftline.benchmark.config import BenchmarkError


class Paths(NamedTuple):
    out: Path  # reports/compare_drafts.json


def dir_digest(path: Path) -> tuple[str, int]:
    """sha256 over every file's relative path and bytes, in sorted order; (digest, files)."""
    digest, files = hashlib.sha256(), 0
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode() + b"\0")
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        files += 1
    return digest.hexdigest(), files


def run(params, paths: Paths) -> dict:
    """Hash benchmark.compare's drafts into paths.out, rewritten only when its text changes."""
    drafts = {}
    for name, path in sorted(params.benchmark.compare.items()):
        where = Path(path)
        if not (where / "config.json").is_file():
            raise BenchmarkError(
                f"error: benchmark.compare {name}: {path} is not a draft directory (no config.json)"
            )
        sha, files = dir_digest(where)
        drafts[name] = {"path": path, "sha256": sha, "files": files}
    text = json.dumps(drafts, indent=1, sort_keys=True) + "\n"
    paths.out.parent.mkdir(parents=True, exist_ok=True)
    if not paths.out.is_file() or paths.out.read_text() != text:
        paths.out.write_text(text)
    return drafts
