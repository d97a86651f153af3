"""Train this run's draft with another method, beside it, for benchmark.compare: the same target,
vocabulary, tokens and hidden states, params.yaml with train.method (and train.<method>) replaced,
the `train` stage run in a scratch directory whose inputs are links to this workspace's.

    python -m devtools.method_draft peagle drafts/peagle
    python -m devtools.method_draft dflash drafts/dflash
    python -m devtools.method_draft dflash drafts/dflash --set train.dflash.max_anchors=64

--set KEY=VALUE (repeatable) changes one more params.yaml key for this draft alone (a dotted key,
a YAML value), e.g. what the method needs that this run's draft does not (scripts/recipe_smollm2.sh).

Then `dvc exp run -S 'benchmark.compare={peagle: drafts/peagle, dflash: drafts/dflash}'` serves
them against the same baseline passes (docs/drafters.md). The draft directory and its train report
(<out>/train.json) are written; nothing of the workspace is changed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
INPUTS = ("models/target", "models/vocab", "datasets/tokenized", "datasets/hidden_states")


def set_key(params: dict, assignment: str) -> None:
    """params with KEY=VALUE applied in place: a dotted key (sections created where missing), a
    YAML value."""
    key, sep, value = assignment.partition("=")
    if not sep or not key:
        raise SystemExit(f"method_draft: --set {assignment!r}: give KEY=VALUE, e.g. train.lr=0.001")
    *sections, leaf = key.split(".")
    node = params
    for name in sections:
        node = node.setdefault(name, {})
        if not isinstance(node, dict):
            raise SystemExit(f"method_draft: --set {key}: {name} is not a section of params.yaml")
    node[leaf] = yaml.safe_load(value)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("method", help="train.method: eagle3, peagle or dflash")
    ap.add_argument("out", help="the draft directory to write")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["train"]["method"] = args.method
    for assignment in args.sets:
        set_key(params, assignment)
    with tempfile.TemporaryDirectory(prefix=f"draftline-{args.method}-") as scratch:
        work = Path(scratch)
        for rel in INPUTS:
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(ROOT / rel, work / rel)
        (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        (work / "reports").mkdir()
        cmd = [
            sys.executable, "-m", "stages.train", "models/target/card.json", "models/vocab",
            "datasets/tokenized", "datasets/hidden_states", "models/draft", "reports/train.json",
            "models/draft_checkpoints",
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        subprocess.run(cmd, cwd=work, env=env, check=True)
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(work / "models/draft", out)
        shutil.copy(work / "reports/train.json", out / "train.json")
    print(f"method_draft: {args.method} draft in {out}")


if __name__ == "__main__":
    main()
