"""Stage `evaluate`: the draft measured by the engine params.evaluate names, the built-in one
(draftline/evaluate/acceptance.py) and vLLM's (draftline/evaluate/vllm_engine.py) side by side."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from draftline.core.card import TargetCard
from draftline.core.io import read_jsonl, write_json
from draftline.evaluate.acceptance import EvaluationRun, evaluate_draft
from draftline.evaluate.vllm_engine import vllm_only_run, with_vllm


class Paths(NamedTuple):
    card: Path  # models/target/card.json
    draft: Path  # models/draft
    prompts: Path  # datasets/prompts/eval.jsonl (or dev.jsonl)
    plots: Path  # reports/evaluate: the plots' data
    dev: bool = False  # the dev split (evaluate_dev): measured with the built-in engine alone


def run(params, paths: Paths) -> tuple[EvaluationRun, str | None]:
    """Stage `evaluate`: the draft measured on the prompts by params.evaluate's engine (vLLM's
    parity gate beside the built-in one), the plots written; (the run, why the stage fails or
    None). An empty dev split is a report of 0 prompts."""
    cfg = params.evaluate
    if paths.dev and not any(True for _ in read_jsonl(paths.prompts)):
        paths.plots.mkdir(parents=True, exist_ok=True)
        return EvaluationRun(report={"prompts": 0}, plots={}), None
    card = TargetCard.load(paths.card)
    failure = None
    draft, prompts = str(paths.draft), str(paths.prompts)
    if cfg.engine == "vllm" and not cfg.vllm.parity:
        measured = vllm_only_run(cfg, card, draft, prompts, params.samples, params.engines.vllm)
    else:
        measured = evaluate_draft(cfg, card, draft, prompts, params.samples)
        if cfg.engine == "vllm" and not paths.dev:
            measured, failure = with_vllm(measured, cfg, card, draft, params.engines.vllm)
    for name, rows in measured.plots.items():
        write_json(paths.plots / name, rows)
    return measured, failure
