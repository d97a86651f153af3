"""Two SmolLM2 drafts side by side on long prompts: the recipe's draft and one trained on the same
conversations plus longer rows (scripts/recipe_smollm2.sh d500-long). Per draft: acceptance by
context length on the long-context set (reports/recipe_smollm2/context_<name>.json, written by
devtools/context_eval.py), the longest row it trained on, the held-out chat acceptance, its serving
verdict at the serve load (verdict_<name>.json), its training steps and step time (the
experiment's reports/train.detail.json, read from its git ref in the workspace) and the wall time
of its run where it was timed. Writes reports/recipe_smollm2/long_rows.json; the table of
docs/recipe_smollm2.md is generated from it (make docs-figures).

    python -m devtools.long_rows /work/smol d500-emb-head-verdict d500-long \
        --run-seconds d500-long=5400
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from devtools.drafters import experiment_ref, git_show
from draftline.core.io import read_json, write_json

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "reports" / "recipe_smollm2"
BUCKET_KEYS = ("bucket", "acceptance_length", "low", "high", "prompts", "repetition_rate")


def draft_figures(workspace: Path, name: str, out_dir: Path, run_seconds: float | None) -> dict:
    """One draft's figures (module docstring) from out_dir's records and the workspace's ref."""
    context = read_json(out_dir / f"context_{name}.json")
    experiment = read_json(out_dir / "experiments.json")[name]
    verdict = read_json(out_dir / f"verdict_{name}.json")["verdict"]
    serve = verdict["serve_concurrency"]
    decided = verdict["decisions"][str(serve)]
    rev = experiment_ref(name, workspace)
    train = json.loads(git_show(rev, "reports/train.detail.json", workspace))
    # the step time: in the train run's record (draftline/core/machine.py), or in the report of
    # an experiment made before the record held it
    step_s = train.get("step_seconds")
    if step_s is None:
        record = json.loads(git_show(rev, "reports/machine/train.json", workspace))
        step_s = record["run_facts"]["train.detail.json"]["step_seconds"]
    steps = train["steps"]
    return {
        "longest_trained_row": context["trained_rows"]["longest"],
        "pack_len": context["trained_rows"]["pack_len"],
        "prompts_beyond_trained": context["trained_length"]["count_beyond"],
        "long_acceptance_length": context["acceptance_length"],
        "by_context": [
            {key: b[key] for key in BUCKET_KEYS} for b in context["by_context"]["buckets"]
        ],
        "collapse_ratio": context["by_context"]["collapse"]["ratio"],
        "context_seconds": context["seconds"],
        "chat_acceptance_length": experiment["acceptance_length"],
        "dev_acceptance_length": experiment["dev_acceptance_length"],
        "verdict": {
            "serve_concurrency": serve,
            "decision": decided["decision"],
            "k": decided["k"] if decided["k"] is not None else decided["best_k"],
            "speedup": decided["speedup"],
            "low": decided["low"],
            "high": decided["high"],
            "rounds": decided["rounds"],
        },
        "train_epochs": train["epochs"],
        "train_steps": steps,
        "train_step_seconds": step_s,
        # steps x the median step: the training loop's time, validation and start-up aside
        "train_seconds": round(steps * step_s) if steps and step_s else None,
        "run_seconds": run_seconds,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workspace", type=Path, help="the workspace the experiments ran in")
    parser.add_argument("base", help="the recipe's draft: an experiment's name")
    parser.add_argument("long", help="the draft trained with longer rows: an experiment's name")
    parser.add_argument(
        "--run-seconds", action="append", default=[], metavar="NAME=S",
        help="an experiment's measured wall time (repeatable)",
    )  # fmt: skip
    parser.add_argument("--out-dir", type=Path, default=OUT)
    args = parser.parse_args(argv)
    seconds = {}
    for item in args.run_seconds:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"long_rows: --run-seconds {item!r}: give NAME=SECONDS")
        seconds[name] = float(value)
    report = {
        "drafts": {
            role: {
                "experiment": name,
                **draft_figures(args.workspace, name, args.out_dir, seconds.get(name)),
            }
            for role, name in (("recipe", args.base), ("long_rows", args.long))
        }
    }
    recipe, long = report["drafts"]["recipe"], report["drafts"]["long_rows"]
    # what training the long rows' run from scratch as the recipe (its epochs) would take here:
    # this run's steps per epoch at its pack, at its median step
    per_epoch = long["train_steps"] / long["train_epochs"]
    report["from_scratch"] = {
        "epochs": recipe["train_epochs"],
        "steps": round(per_epoch * recipe["train_epochs"]),
        "seconds": round(per_epoch * recipe["train_epochs"] * long["train_step_seconds"]),
    }
    buckets = [[b["bucket"] for b in d["by_context"]] for d in report["drafts"].values()]
    if buckets[0] != buckets[1]:
        raise SystemExit(f"long_rows: the two context reports bucket differently: {buckets}")
    write_json(args.out_dir / "long_rows.json", report)
    print(f"long_rows: {args.out_dir / 'long_rows.json'}")


if __name__ == "__main__":
    main()
