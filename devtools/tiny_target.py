"""Rebuild the shipped tiny target (models/tiny/) from params.yaml's `target.tiny`.

    python -m devtools.tiny_target

Trains it as the target stage would (draftline/targets/tiny.py) and writes the model files with
recipe.json (the params, the builder code's fingerprints, the training stats). Run it after an edit
to the builder code or to the default `target.tiny`; tests/targets/test_target.py fails until then.
Commit models/tiny/ and rerun the pipeline (`make repro`): every stage after `target` changes.
"""

import sys
import tempfile
from pathlib import Path

import yaml

from draftline.core.errors import entry_point
from draftline.core.threads import apply_thread_policy
from draftline.targets.bundled import BUNDLED_DIR, write_bundled
from draftline.targets.config import TargetConfig
from draftline.targets.tiny import build_tiny_target

ROOT = Path(__file__).resolve().parents[1]


@entry_point
def main() -> None:
    apply_thread_policy("target")  # as the target stage trains it (draftline/core/threads.py)
    target = TargetConfig(**yaml.safe_load((ROOT / "params.yaml").read_text())["target"])
    with tempfile.TemporaryDirectory() as tmp:
        stats = build_tiny_target(target.tiny, Path(tmp))
        write_bundled(target.tiny, stats, Path(tmp))
    print(f"tiny target: {stats} -> {BUNDLED_DIR}")


if __name__ == "__main__":
    main(*sys.argv[1:])
