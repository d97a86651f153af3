"""A recipe experiment's results, recorded from the workspace's reports into the recipe's committed
files right after its `dvc exp run` (scripts/recipe_smollm2.sh calls it after each run):

    python -m devtools.recipe_record reports/recipe_smollm2 L27-500 --samples-point
    python -m devtools.recipe_record reports/recipe_smollm2 c125-emb --no-benchmark

- OUT/experiments.json (DVC metrics): NAME -> the headline figures of reports/acceptance.json (the
  reported test split), `dev_acceptance_length` / `dev_tau_sim` of reports/acceptance_dev.json (the
  dev split that candidates are chosen on), the eval prompts with a twin in train that
  reports/mix.json counted (`eval_twins_in_train`: exact / template), and `speedup` of
  reports/benchmark.json unless the run stopped before `benchmark` (--no-benchmark: that file is
  then an earlier run's), with the serving verdict's headline (`verdict`) where the run made one;
- OUT/verdict_NAME.json: that verdict whole (every load and k, the cost model, what a goal needs);
- OUT/acceptance_vs_samples.json (DVC plot, with --samples-point): the run's point of
  reports/evaluate/acceptance_vs_samples.json, tagged with NAME, in samples order.

A name recorded before is replaced in place; the others keep their order.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from draftline.core.io import read_json, write_json

# the serving verdict's headline kept per experiment (reports/benchmark.json)
VERDICT_KEYS = (
    "engine",
    "serve_concurrency",
    "k",
    "pays_off",
    "break_even_concurrency",
    "baseline_tokens_per_s",
    "speculative_tokens_per_s",
    "acceptance_length",
    "lossless_share",
)


def record(
    out_dir: str | Path,
    name: str,
    reports: str | Path = "reports",
    benchmark: bool = True,
    samples_point: bool = False,
) -> dict:
    """Record experiment `name` from the reports under `reports`; return its experiments.json entry."""
    out_dir, reports = Path(out_dir), Path(reports)
    entry = dict(read_json(reports / "acceptance.json"))
    dev = read_json(reports / "acceptance_dev.json")
    entry["dev_acceptance_length"] = dev["acceptance_length"]
    entry["dev_tau_sim"] = dev["tau_sim"]
    entry["eval_twins_in_train"] = read_json(reports / "mix.json")["holdout"][
        "eval_with_twin_in_train"
    ]
    if benchmark:
        bench = read_json(reports / "benchmark.json")
        entry["speedup"] = bench["speedup"]
        if "pays_off" in bench:  # a serving verdict: its headline, and the whole of it beside
            entry["verdict"] = {key: bench.get(key) for key in VERDICT_KEYS}
            detail = read_json(reports / "benchmark.detail.json")
            write_json(
                out_dir / f"verdict_{name}.json",
                {
                    "verdict": detail["verdict"],
                    "acceptance_by_k": detail["acceptance_by_k"],
                    "levels": detail["levels"],
                    "lossless": detail["lossless"],
                },
            )
    experiments_path = out_dir / "experiments.json"
    experiments = read_json(experiments_path) if experiments_path.is_file() else {}
    experiments[name] = entry  # an existing key keeps its place
    write_json(experiments_path, experiments)
    if samples_point:
        (point,) = read_json(reports / "evaluate" / "acceptance_vs_samples.json")
        points_path = out_dir / "acceptance_vs_samples.json"
        points = read_json(points_path) if points_path.is_file() else []
        points = [p for p in points if p.get("experiment") != name]
        points.append(
            {
                "samples": point["samples"],
                **({"k": point["k"]} if "k" in point else {}),
                "acceptance_length": point["acceptance_length"],
                "tau_sim": point["tau_sim"],
                "experiment": name,
            }
        )
        write_json(points_path, sorted(points, key=lambda p: p["samples"]))
    return entry


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("name")
    ap.add_argument("--reports", default="reports")
    ap.add_argument("--no-benchmark", action="store_true", help="the run stopped before benchmark")
    ap.add_argument("--samples-point", action="store_true", help="also a point of the samples plot")
    args = ap.parse_args(argv)
    entry = record(args.out_dir, args.name, args.reports, not args.no_benchmark, args.samples_point)
    print(f"recipe_record: {args.name} {entry}")


if __name__ == "__main__":
    main(sys.argv[1:])
