"""Train this run's draft with another method, beside it, for benchmark.compare: the same target,
vocabulary, tokens and hidden states, params.yaml with train.method (and train.<method>) replaced,
the `train` stage run in a scratch directory whose inputs are links to this workspace's.

    python -m devtools.method_draft peagle drafts/peagle
    python -m devtools.method_draft dflash drafts/dflash

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("method", help="train.method: eagle3, peagle or dflash")
    ap.add_argument("out", help="the draft directory to write")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["train"]["method"] = args.method
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
