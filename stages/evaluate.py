"""Stage `evaluate`: real and simulated acceptance of the draft on the held-out eval prompts
(draftline/evaluate/run.py).

    python -m stages.evaluate models/target/card.json models/draft datasets/prompts/eval.jsonl reports/acceptance.json reports/evaluate
    python -m stages.evaluate models/target/card.json models/draft datasets/prompts/dev.jsonl reports/acceptance_dev.json reports/evaluate_dev --dev

The second is stage `evaluate_dev`: the same measurement on the dev split (`mix.dev_samples`), the
one to choose recipes and experiments by, so that the eval split stays a test nobody tuned to.
`--dev`: an empty prompts file (dev_samples: 0) gives a report of 0 prompts.

The metrics file (the report path) holds the three headline figures (acceptance length, tau_sim,
tokens per step) and the engine that measured them; the whole report (per position, per source,
histograms, prompts; with evaluate.engine vllm both engines and the parity gate) is in
acceptance.detail.json beside it. A failed parity gate fails the stage after the report is
written. The plots directory holds the
plot data: acceptance length against the train prompts `mix` drew (one point per run, so `dvc
plots diff` over experiments draws the scaling curve), acceptance per draft position and per k,
and with eval sets or drafts to compare, sets.json and the table sets.md.
"""

import sys
from pathlib import Path

from draftline.benchmark.config import BenchmarkConfig
from draftline.core.config import stage_sections
from draftline.core.errors import entry_point
from draftline.core.threads import apply_thread_policy
from draftline.engines.config import EnginesConfig
from draftline.evaluate.config import EvaluateConfig
from draftline.train.config import TrainConfig


@entry_point
def main(
    card_path: str,
    draft_dir: str,
    eval_path: str,
    report_path: str,
    plots_dir: str,
    *flags: str,
) -> None:
    if unknown := sorted(set(flags) - {"--dev"}):
        raise SystemExit(f"error: unknown options {unknown}; known: --dev")
    # train: train.init and its conversion flags, the draft fine-tuning started from (compared);
    # benchmark: its `free` methods, replayed over the same greedy outputs
    params = stage_sections(
        samples=int,
        evaluate=EvaluateConfig,
        engines=EnginesConfig,
        train=TrainConfig,
        benchmark=BenchmarkConfig,
    )
    apply_thread_policy("evaluate")  # before torch loads: draftline/core/threads.py
    from draftline.core.io import write_metrics
    from draftline.evaluate.compare import CompareError
    from draftline.evaluate.run import RUN_FACTS, Paths, run

    paths = Paths(*map(Path, (card_path, draft_dir, eval_path, plots_dir)), dev="--dev" in flags)
    try:
        done, failure = run(params, paths)
    except CompareError as err:  # an eval set or a draft to compare that cannot be measured
        raise SystemExit(f"error: {err}") from None
    if done.is_empty:
        print(f"evaluate: {eval_path} holds no prompts (mix.dev_samples: 0): nothing to measure")
        write_metrics(report_path, done.report, ["prompts"], RUN_FACTS)
        return
    # the engine that measured the headline beside it (hf: the built-in one; vllm)
    headline = ["acceptance_length", "tau_sim", "tokens_per_step", "engine"]
    write_metrics(report_path, done.report, headline, RUN_FACTS)
    if failure:  # the report shows both engines; the stage fails (DVC keeps nothing of it)
        raise SystemExit(f"error: {failure}")


if __name__ == "__main__":
    main(*sys.argv[1:])
