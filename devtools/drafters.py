"""The drafters compared on one data set. With --served REV: one benchmark run (a commit or an
experiment) whose benchmark.compare served the other methods' drafts (devtools/method_draft.py)
against the same baseline passes: each method's decision and interval at every load, from that one
run. Otherwise: a baseline run (the committed one, or an experiment by name) and the DVC
experiments that changed only train.method, read from their git refs (`dvc exp run -n NAME -S
train.method=...` keeps each as refs/exps/.../NAME): separate runs, separate baselines. Writes
reports/drafters/<name>.json: per method, the train tau_sim, the held-out acceptance length, the
serving verdict's speedup and tokens/s at the serve load, and the method's own params, with the
params they share; docs/drafters.md's figures come from it (make docs-figures).

    python -m devtools.drafters --name default method-peagle method-dflash
    python -m devtools.drafters --name smollm2 --baseline d500-emb-head-verdict \
        d500-peagle-verdict d500-dflash-verdict
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import yaml

from draftline.benchmark.intervals import above, below, inside
from draftline.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_METHOD = TrainConfig.model_fields["method"].default  # a params.yaml that names none
SHARED = ("samples", "seed")
TRAIN_SHARED = ("epochs", "lr", "num_layers", "pack_len", "ttt_steps", "backend")


def git_show(rev: str, path: str, root: Path = ROOT) -> str:
    done = subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=root, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"drafters: {rev} has no {path}: {done.stderr.strip()}")
    return done.stdout


def experiment_refs(root: Path = ROOT) -> list[str]:
    return subprocess.run(
        ["git", "for-each-ref", "--format=%(refname)", "refs/exps"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


def experiment_ref(name: str, root: Path = ROOT, fallback: str | None = None) -> str:
    """The ref of the experiment named `name`; `fallback` (e.g. `name` as a revision) when none
    is, else an error. Two experiments of one name are always an error."""
    found = [ref for ref in experiment_refs(root) if ref.rsplit("/", 1)[-1] == name]
    if not found and fallback is not None:
        return fallback
    if len(found) != 1:
        raise SystemExit(f"drafters: no single experiment named {name!r} ({len(found)} refs)")
    return found[0]


def run_of(rev: str, root: Path = ROOT) -> dict:
    """One run's params and figures at a git revision (a commit or an experiment ref)."""
    params = yaml.safe_load(git_show(rev, "params.yaml", root))
    train = json.loads(git_show(rev, "reports/train.json", root))
    acceptance = json.loads(git_show(rev, "reports/acceptance.json", root))
    bench = json.loads(git_show(rev, "reports/benchmark.json", root))
    method = params["train"].get("method", DEFAULT_METHOD)
    return {
        "method": method,
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
            # what the method was given beyond the shared budget (train.peagle / train.dflash
            # as params.yaml set them; the rest are the method's defaults)
            "method_params": params["train"].get(method) or {},
        },
    }


def compare(baseline: str, experiments: list[str], root: Path = ROOT) -> dict:
    """The runs side by side; refuses runs that differ in anything but train.method among the
    shared params (the comparison would not be on the same budget)."""
    runs = [run_of(experiment_ref(baseline, root, fallback=baseline), root)]
    runs += [run_of(experiment_ref(name, root), root) for name in experiments]
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


def served_figures(decisions: dict, level: dict, serve: int, acceptance) -> dict:
    """One method's serving figures from its decisions per load (verdict.decisions or one entry
    of verdict.compare) and its acceptance at the serve load."""
    d = decisions[str(serve)]
    k = d["k"] if d["k"] is not None else d.get("best_k")
    return {
        "serve_concurrency": serve,
        "decision": d["decision"],
        "k": k,
        "speedup": d["speedup"],
        "low": d["low"],
        "high": d["high"],
        **{
            f"{name}_c{c}": decisions[str(c)][key]
            for c in (min(map(int, decisions)), max(map(int, decisions)))
            for name, key in (("speedup", "speedup"), ("low", "low"), ("high", "high"))
        },
        "served_acceptance_length": acceptance,
        "passes": level.get("passes"),
    }


def free_decision(f: dict, margin: float) -> str:
    """A free method's speedup interval decided as a draft's is (draftline/benchmark/intervals.py)."""
    iv = {"low": f["free_low"], "high": f["free_high"]}
    if above(iv):
        return "yes"
    if below(iv):
        return "no"
    return "no_gain" if inside(iv, margin) else "undecided"


def free_rows(verdict: dict, level: dict, serve: int) -> dict:
    """The speculation served with no trained draft (benchmark.free) in the same run, a row each:
    its speedup over the same baseline passes at every load, at its one k."""
    rows = {}
    for name, free in ((verdict.get("free") or {}).get("methods") or {}).items():
        by_load = {
            c: {
                "decision": free_decision(f, verdict["margin"]),
                "k": f["free_k"],
                "speedup": f["free_speedup"],
                "low": f["free_low"],
                "high": f["free_high"],
            }
            for c, f in free["by_load"].items()
        }
        spec = (level.get("free") or {}).get(name) or {}
        rows[name] = {
            "val_tau_sim": None,
            "free": True,
            **served_figures(by_load, spec, serve, spec.get("acceptance_length")),
        }
    return rows


def served(rev: str, root: Path = ROOT) -> dict:
    """Every method of one benchmark run with benchmark.compare: {name: method} of the compared
    drafts is their benchmark.compare name; their train figures from <draft>/train.json."""
    params = yaml.safe_load(git_show(rev, "params.yaml", root))
    detail = json.loads(git_show(rev, "reports/benchmark.detail.json", root))
    train = json.loads(git_show(rev, "reports/train.json", root))
    v = detail["verdict"]
    serve = v["serve_concurrency"]
    level = detail["levels"][f"c{serve}"]
    main = params["train"].get("method", DEFAULT_METHOD)
    k_main = v["decisions"][str(serve)]["k"] or v["decisions"][str(serve)]["best_k"]
    methods = {
        main: {
            "val_tau_sim": train["val_tau_sim"],
            **served_figures(
                v["decisions"], level[f"k{k_main}"], serve,
                level[f"k{k_main}"].get("acceptance_length"),
            ),
        }
    }  # fmt: skip
    for name, by_load in (v.get("compare") or {}).items():
        d = by_load[str(serve)]
        k = d["k"] if d["k"] is not None else d.get("best_k")
        spec = level["compare"][name][f"k{k}"]
        report = root / params["benchmark"]["compare"][name] / "train.json"
        tau = json.loads(report.read_text())["val_tau_sim"] if report.is_file() else None
        methods[name] = {
            "val_tau_sim": tau,
            **served_figures(by_load, spec, serve, spec.get("acceptance_length")),
        }
    methods.update(free_rows(v, level, serve))
    return {
        "params": {key: params[key] for key in SHARED},
        "methods": methods,
        "baseline_tokens_per_s": level["baseline"]["output_tokens_per_s"],
        "design": v.get("design", {}).get("layout"),
        "rounds": v.get("design", {}).get("rounds"),
        "groups": v.get("design", {}).get("groups"),
        "confidence": v["confidence"],
        "sources": {"served": rev, "compare": params["benchmark"]["compare"]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="reports/drafters/<name>.json")
    parser.add_argument(
        "--baseline", default="HEAD", help="the baseline run: a revision or an experiment's name"
    )
    parser.add_argument("--served", help="one run whose benchmark.compare served the others")
    parser.add_argument("experiments", nargs="*", help="experiment names (dvc exp run -n)")
    args = parser.parse_args()
    out = ROOT / "reports" / "drafters" / f"{args.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.served:
        report = served(experiment_ref(args.served, ROOT, fallback=args.served))
        report["sources"]["served"] = args.served  # the name given, not the ref behind it
    elif args.experiments:
        report = compare(args.baseline, args.experiments)
    else:
        raise SystemExit("drafters: give --served REV or experiment names")
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"drafters: {out.relative_to(ROOT)}: {', '.join(report['methods'])}")


if __name__ == "__main__":
    main()
