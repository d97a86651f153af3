"""Stage `benchmark`: does the draft pay off? The non-speculative baseline against speculative
decoding at each k and load, same prompts, and the verdict at the user's load.

    python -m stages.benchmark models/target/card.json models/draft datasets/prompts/eval.jsonl reports/benchmark.json reports/deploy.json reports/benchmark reports/evaluate/acceptance_vs_samples.json

Engine `vllm` (default; vLLM's CPU build here, .venv-vllm) or `sglang`: a baseline server and one
speculative server per benchmark.k, each driven at every benchmark.concurrency level
(draftline/benchmark/server.py); engine `hf`: the built-in decoders, one request at a time. The
verdict (draftline/benchmark/verdict.py) is the headline of reports/benchmark.json; the lossless
gate (draftline/benchmark/lossless.py) fails the stage after the reports are written. The last
argument (optional) is the acceptance-vs-samples points the verdict forecasts samples from.
"""

import sys
from pathlib import Path

from draftline.benchmark.config import BenchmarkConfig
from draftline.core.config import stage_sections
from draftline.core.threads import apply_thread_policy


def main(
    card_path: str,
    draft_dir: str,
    eval_path: str,
    report_path: str,
    deploy_path: str,
    plots_dir: str,
    points_path: str | None = None,
) -> None:
    params = stage_sections(benchmark=BenchmarkConfig)
    apply_thread_policy("benchmark")  # before torch loads: draftline/core/threads.py
    from draftline.benchmark.run import HEADLINE, Paths, run
    from draftline.core.io import write_metrics

    paths = Paths(
        Path(card_path),
        Path(draft_dir),
        Path(eval_path),
        Path(deploy_path),
        Path(plots_dir),
        Path(points_path) if points_path else None,
    )
    report = run(params, paths)
    concurrency = [f"speedup_c{c}" for c in report["concurrency"]]
    write_metrics(report_path, report, HEADLINE + concurrency)
    gate = report["lossless"]
    if not gate["passed"]:
        raise SystemExit(
            f"error: benchmark: {gate['mismatch']} of {gate['compared_outputs']} speculative "
            f"outputs ({gate['mismatch_share']:.1%}) differ from the baseline's greedy output, "
            f"not at a near-tie (<= {gate['tie_tolerance']}): above "
            f"benchmark.max_output_mismatch_share {gate['max_output_mismatch_share']} "
            f"({'; '.join(gate['mismatches_at'][:4])}). The draft is served wrongly (method, "
            f"aux layers, vocabulary) or the engine is not lossless here; {report_path} has the detail"
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
