"""Stage `compare_drafts`: the content of each draft benchmark.compare serves beside this run's.

    python -m stages.compare_drafts reports/compare_drafts.json

The drafts live outside the pipeline's outputs (another run's models/draft, a downloaded drafter),
so DVC cannot list them as deps of `benchmark`: this stage runs on every `dvc repro` (always
changed), hashes each directory and writes {name: {path, sha256, files}}; the file's text changes,
and `benchmark` reruns, only when a draft's content, name or path did.
"""

import hashlib
import json
import sys
from pathlib import Path

from draftline.core.config import stage_sections
from draftline.core.errors import DraftlineError, entry_point


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


@entry_point
def main(out: str) -> None:
    from draftline.benchmark.config import BenchmarkConfig

    compare = stage_sections(benchmark=BenchmarkConfig).benchmark.compare
    drafts = {}
    for name, path in sorted(compare.items()):
        where = Path(path)
        if not (where / "config.json").is_file():
            raise DraftlineError(
                f"error: benchmark.compare {name}: {path} is not a draft directory (no config.json)"
            )
        sha, files = dir_digest(where)
        drafts[name] = {"path": path, "sha256": sha, "files": files}
    text = json.dumps(drafts, indent=1, sort_keys=True) + "\n"
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.is_file() or target.read_text() != text:
        target.write_text(text)
    print(f"compare_drafts: {len(drafts)} draft(s) to serve beside this run's in {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
