"""Stage `evaluate`: real and simulated acceptance of the draft on the held-out eval prompts.

    python -m stages.evaluate models/target/card.json models/draft datasets/prompts/eval.jsonl reports/acceptance.json reports/evaluate
    python -m stages.evaluate models/target/card.json models/draft datasets/prompts/dev.jsonl reports/acceptance_dev.json reports/evaluate_dev --dev

The second is stage `evaluate_dev`: the same measurement on the dev split (`mix.dev_samples`), the
one to choose recipes and experiments by, so that the eval split stays a test nobody tuned to.
`--dev`: an empty prompts file (dev_samples: 0) gives a report of 0 prompts, and where the built-in
engine can measure (evaluate.vllm.parity on), it alone measures: vLLM's cross-check of the
checkpoint runs once, on the eval split, and the dev figures are the built-in engine's, which that
check holds equal to vLLM's (a vLLM run saved: the eval split's takes
reports/acceptance.detail.json engines.vllm.wall_s; a figure of this stage's own report is not
quoted here, as its file is a dependency of the stage).

reports/evaluate/ holds the plot data: acceptance length against the train prompts `mix` drew (one
point per run, so `dvc plots diff` over experiments draws the scaling curve; it reads their count
from the mix's meta.json beside the eval prompts, which is `samples` unless mix.allow_shortfall let
fewer through) and acceptance per draft position.

Real: chain speculative decoding (greedy, k draft tokens per round) with the built-in engine, each
output checked against plain greedy decoding of the target (the engine is lossless, so a mismatch
fails the stage). Simulated: tau_sim = 1 + sum of teacher-forced accuracies, from speculators' own
TTT forward over the target's hidden states of prompt + its greedy completion (the same tokens the
real decoder verified; the eval prompts have no stored hidden states). Both per source dataset, and
per row source inside a dataset (`source_detail`, e.g. open-perfectblend's subsets) when rows have one.
Acceptance length counts every verification step whole (a+1 tokens, vLLM's definition); tokens
per step counts what each step added to the output, the last step of a prompt cut at eos or
max_new_tokens (below the acceptance length when a prompt stops mid-step). The metrics file holds
the three headline figures; the whole report (per position, per source, histograms, prompts) is in
acceptance.detail.json beside it.

evaluate.engine vllm: vLLM's offline engine measures the same prompts with the draft
(draftline/evaluate/vllm_engine.py), its acceptance the headline; with evaluate.vllm.parity (default)
the built-in engine measures too, both go in the report side by side (`engines`, `parity`), and a
gap beyond the tolerance fails the stage after writing the report, with what vLLM read. Without
parity (a target the built-in engine cannot hold) vLLM alone measures: no tau_sim, no lossless
check against transformers.
"""

import sys
from pathlib import Path

from draftline.core.config import stage_sections
from draftline.core.threads import apply_thread_policy
from draftline.engines.config import EnginesConfig
from draftline.evaluate.config import EvaluateConfig
from draftline.train.config import TrainConfig


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
    # train: train.init and its conversion flags, the draft fine-tuning started from (compared)
    params = stage_sections(
        samples=int, evaluate=EvaluateConfig, engines=EnginesConfig, train=TrainConfig
    )
    apply_thread_policy("evaluate")  # before torch loads: draftline/core/threads.py
    from draftline.core.io import write_metrics
    from draftline.evaluate.compare import CompareError
    from draftline.evaluate.run import Paths, run

    paths = Paths(*map(Path, (card_path, draft_dir, eval_path, plots_dir)), dev="--dev" in flags)
    try:
        done, failure = run(params, paths)
    except CompareError as err:  # an eval set or a draft to compare that cannot be measured
        raise SystemExit(f"error: {err}") from None
    if done.report == {"prompts": 0}:
        print(f"evaluate: {eval_path} holds no prompts (mix.dev_samples: 0): nothing to measure")
        write_metrics(report_path, done.report, ["prompts"])
        return
    # the engine that measured the headline beside it (hf: the built-in one; vllm)
    headline = ["acceptance_length", "tau_sim", "tokens_per_step", "engine"]
    write_metrics(report_path, done.report, headline)
    if failure:  # the report shows both engines; the stage fails (DVC keeps nothing of it)
        raise SystemExit(f"error: {failure}")


if __name__ == "__main__":
    main(*sys.argv[1:])
