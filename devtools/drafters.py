"""The drafters compared on one data set: the committed run (its train.method) and the DVC
experiments that changed only train.method, read from their git refs (`dvc exp run -n NAME -S
train.method=...` keeps each as refs/exps/.../NAME). Writes reports/drafters/<name>.json: per
method, the train tau_sim, the held-out acceptance length, and the serving verdict's speedup
and tokens/s at the serve load, with the params they share; docs/drafters.md's figures come
from it (make docs-figures).

    python -m devtools.drafters --name default method-peagle method-dflash
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SHARED = ("samples", "seed")
TRAIN_SHARED = ("epochs", "lr", "num_layers", "pack_len", "ttt_steps", "backend")


def git_show(rev: str, path: str) -> str:
    done = subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"drafters: {rev} has no {path}: {done.stderr.strip()}")
    return done.stdout


def experiment_ref(name: str) -> str:
    refs = subprocess.run(
        ["git", "for-each-ref", "--format=%(refname)", "refs/exps"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    found = [ref for ref in refs if ref.rsplit("/", 1)[-1] == name]
    if len(found) != 1:
        raise SystemExit(f"drafters: no single experiment named {name!r} ({len(found)} refs)")
    return found[0]


def run_of(rev: str) -> dict:
    """One run's params and figures at a git revision (a commit or an experiment ref)."""
    params = yaml.safe_load(git_show(rev, "params.yaml"))
    train = json.loads(git_show(rev, "reports/train.json"))
    acceptance = json.loads(git_show(rev, "reports/acceptance.json"))
    bench = json.loads(git_show(rev, "reports/benchmark.json"))
    return {
        "method": params["train"].get("method", "eagle3"),
        "params": {
            **{key: params[key] for key in SHARED},
            "train": {key: params["train"].get(key) for key in TRAIN_SHARED},
        },
        "figures": {
            "val_tau_sim": train["val_tau_sim"],
            "acceptance_length": acceptance["acceptance_length"],
            "acceptance_engine": acceptance["engine"],
            "evaluate_k": params["evaluate"]["k"],
            "serve_concurrency": bench["serve_concurrency"],
            "k": bench["k"],
            "speedup": bench["speedup"],
            "speedup_c1": bench["speedup_c1"],
            "speedup_c16": bench["speedup_c16"],
            "baseline_tokens_per_s": bench["baseline_tokens_per_s"],
            "speculative_tokens_per_s": bench["speculative_tokens_per_s"],
            "served_acceptance_length": bench["acceptance_length"],
            "lossless_share": bench["lossless_share"],
            "pays_off": bench["pays_off"],
        },
    }


def compare(baseline: str, experiments: list[str]) -> dict:
    """The runs side by side; refuses runs that differ in anything but train.method among the
    shared params (the comparison would not be on the same budget)."""
    runs = [run_of(baseline)] + [run_of(experiment_ref(name)) for name in experiments]
    first = runs[0]["params"]
    for run in runs[1:]:
        if run["params"] != first:
            raise SystemExit(
                f"drafters: {run['method']} ran with {run['params']}, the baseline with {first}; "
                "compare runs that differ in train.method only"
            )
    return {
        "params": first,
        "methods": {run["method"]: run["figures"] for run in runs},
        "sources": {"baseline": baseline, "experiments": experiments},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="reports/drafters/<name>.json")
    parser.add_argument("--baseline", default="HEAD", help="the committed run's revision")
    parser.add_argument("experiments", nargs="+", help="experiment names (dvc exp run -n)")
    args = parser.parse_args()
    out = ROOT / "reports" / "drafters" / f"{args.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    report = compare(args.baseline, args.experiments)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"drafters: {out.relative_to(ROOT)}: {', '.join(report['methods'])}")


if __name__ == "__main__":
    main()
