"""Stage `benchmark`: tokens/s of the non-speculative baseline vs speculative decoding, same prompts.

    python -m stages.benchmark models/target/card.json models/draft datasets/prompts/eval.jsonl reports/benchmark.json reports/deploy.json

Engine `hf` (default; CPU or one GPU): the built-in greedy and speculative decoders, warm-up and
repeats, medians. Engines `vllm` / `sglang` (GPU hosts): a baseline server and a speculative
server started from params, driven by the async load generator at every `concurrency` level:
output tokens/s, TTFT / inter-token latency percentiles, acceptance length read from the server.
A GPU variant:  dvc exp run -S benchmark.engine=vllm -S 'benchmark.concurrency=[1,8,32,128]'

Preflight runs first for every engine: a non-EAGLE3 algorithm, aux layer ids or a hidden size that
differ from the target card, or a draft vocabulary that does not fit the target stops the stage
when it concerns the selected engine. The deployment command of each engine is printed and written
to reports/deploy.json with the preflight findings. reports/benchmark.json keeps the headline
figures only, for `dvc metrics diff` / `dvc exp show`; the whole report (per repeat, per load
level, latencies, acceptance length) is in reports/benchmark.detail.json.
"""

import sys
from pathlib import Path

from draftline.benchmark.config import BenchmarkConfig
from draftline.core.config import stage_sections
from draftline.core.threads import apply_thread_policy


def main(
    card_path: str, draft_dir: str, eval_path: str, report_path: str, deploy_path: str
) -> None:
    params = stage_sections(benchmark=BenchmarkConfig)
    apply_thread_policy("benchmark")  # before torch loads: draftline/core/threads.py
    cfg = params.benchmark
    from draftline.benchmark.run import Paths, run
    from draftline.core.io import write_metrics

    paths = Paths(Path(card_path), Path(draft_dir), Path(eval_path), Path(deploy_path))
    report = run(params, paths)
    headline = ["speedup", "baseline_tokens_per_s", "speculative_tokens_per_s"]
    write_metrics(
        report_path,
        report,
        headline + [f"speedup_c{c}" for c in cfg.concurrency if cfg.engine != "hf"],
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
