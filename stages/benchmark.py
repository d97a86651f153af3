"""Stage `benchmark`: does the draft pay off? (draftline/benchmark/run.py)

    python -m stages.benchmark models/target/card.json models/draft datasets/prompts/eval.jsonl reports/benchmark.json reports/deploy.json reports/benchmark reports/evaluate/acceptance_vs_samples.json --context reports/evaluate/context.json

The report goes to reports/benchmark.json, the verdict's headline and each load's speedup first;
the stage fails on the lossless gate only after every report is written. The last argument is
optional; --context (the evaluate stage's acceptance by context length and the draft's trained
length) adds what they say to the verdict's words and deploy.json.
"""

import argparse
import sys
from pathlib import Path

from draftline.benchmark.config import BenchmarkConfig
from draftline.core.config import stage_sections
from draftline.core.errors import entry_point
from draftline.core.threads import apply_thread_policy

ARGS = argparse.ArgumentParser(prog="python -m stages.benchmark")
ARGS.add_argument("card", help="models/target/card.json")
ARGS.add_argument("draft", help="models/draft")
ARGS.add_argument("prompts", help="datasets/prompts/eval.jsonl")
ARGS.add_argument("report", help="reports/benchmark.json")
ARGS.add_argument("deploy", help="reports/deploy.json: each engine's deployment command")
ARGS.add_argument("plots", help="reports/benchmark: speedup against load, baseline tokens/s")
ARGS.add_argument(
    "points", nargs="?", help="acceptance vs samples (evaluate), the verdict's forecast of samples"
)
ARGS.add_argument("--context", help="reports/evaluate/context.json: acceptance by context length")


@entry_point
def main(*argv: str) -> None:
    args = ARGS.parse_args(argv)
    params = stage_sections(benchmark=BenchmarkConfig)
    apply_thread_policy("benchmark")  # before torch loads: draftline/core/threads.py
    from draftline.benchmark.lossless import check_gate
    from draftline.benchmark.run import HEADLINE, Paths, run
    from draftline.core.io import write_metrics

    paths = Paths(
        Path(args.card),
        Path(args.draft),
        Path(args.prompts),
        Path(args.deploy),
        Path(args.plots),
        Path(args.points) if args.points else None,
        Path(args.context) if args.context else None,
    )
    report = run(params, paths)
    concurrency = [f"speedup_c{c}" for c in report["concurrency"]]
    write_metrics(args.report, report, HEADLINE + concurrency)
    check_gate(report["lossless"], args.report)


if __name__ == "__main__":
    main(*sys.argv[1:])
