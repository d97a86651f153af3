"""Stage `evaluate`: the draft measured by the engine params.evaluate names, the built-in one
(draftline/evaluate/acceptance.py) and vLLM's (draftline/evaluate/vllm_engine.py) side by side;
then every eval set and every draft to compare with (draftline/evaluate/compare.py).

The dev split (stage `evaluate_dev`) is measured by the built-in engine alone where it can
measure (evaluate.vllm.parity on): vLLM's cross-check of the checkpoint runs once, on the eval
split, and the dev figures are the built-in engine's, which that check holds equal to vLLM's (a
vLLM run saved). Nor are the eval sets and other drafts measured again there.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from pathlib import Path
from typing import NamedTuple

from draftline.core.card import TargetCard
from draftline.core.io import read_jsonl, write_json
from draftline.draft.checkpoint import draft_method
from draftline.evaluate.acceptance import EvaluationRun, context_summary, evaluate_draft
from draftline.evaluate.compare import (
    HELD_OUT,
    TRAINED,
    Comparison,
    compare_builtin,
    compare_vllm,
    gains,
    resolve_drafts,
    set_rows,
    sets_table,
)
from draftline.evaluate.lookup import free_acceptance
from draftline.evaluate.paired import paired_report, paired_table
from draftline.evaluate.vllm_engine import vllm_only_run, with_vllm

SET_PLOT_KEYS = ("acceptance_length", "tokens_per_step", "tau_sim", "prompts")

log = logging.getLogger(__name__)
# the report's figures of this run only (the engine's start-up and generation times): they go to
# the run's record, out of the hashed report (draftline/core/machine.py)
RUN_FACTS = ("load_s", "generate_s", "wall_s")


class Paths(NamedTuple):
    card: Path  # models/target/card.json
    draft: Path  # models/draft
    prompts: Path  # datasets/prompts/eval.jsonl (or dev.jsonl)
    plots: Path  # reports/evaluate: the plots' data
    dev: bool = False  # the dev split (evaluate_dev): measured with the built-in engine alone

    @property
    def sets(self) -> Path:
        """The eval sets `mix` held out beside the prompts (datasets/prompts/sets/<name>.jsonl)."""
        return self.prompts.parent / "sets"


def run(params, paths: Paths) -> tuple[EvaluationRun, str | None]:
    """Stage `evaluate`: the draft measured on the prompts by params.evaluate's engine (vLLM's
    parity gate beside the built-in one), the plots written; (the run, why the stage fails or
    None). An empty dev split is an empty run (EvaluationRun.empty)."""
    cfg = params.evaluate
    if paths.dev and not any(True for _ in read_jsonl(paths.prompts)):
        paths.plots.mkdir(parents=True, exist_ok=True)
        return EvaluationRun.empty(), None
    card = TargetCard.load(paths.card)
    if paths.dev:
        return measure(params, card, paths, {}, {})
    # the eval sets read and the drafts to compare checked against the target before anything
    # is measured
    sets = set_rows(paths.sets, cfg.sets, cfg.prompts)
    with tempfile.TemporaryDirectory(prefix="draftline-compare-") as work:
        init, convert = params.train.init, params.train.init_convert
        others = resolve_drafts(cfg, card, init, convert, Path(work))
        return measure(params, card, paths, others, sets)


def measure(params, card: TargetCard, paths: Paths, others: dict[str, Path], sets: dict):
    """run()'s measurement: the headline, then every set x draft (`others`: the drafts to compare,
    resolved; `sets`: each eval set's rows)."""
    cfg, failure = params.evaluate, None
    draft, prompts = str(paths.draft), str(paths.prompts)
    method = draft_method(draft)
    if not method.builtin_decode:
        # check_params refuses evaluate.engine hf for such a draft: vLLM alone measures it
        measured = vllm_only_run(cfg, card, draft, prompts, params.samples, params.engines.vllm)
        measured.report["parity"] = {
            "skipped": f"the built-in engine decodes EAGLE-3 drafts only, not {method.name}"
        }
    elif cfg.engine == "vllm" and not cfg.vllm.parity:
        measured = vllm_only_run(cfg, card, draft, prompts, params.samples, params.engines.vllm)
    else:
        measured = evaluate_draft(cfg, card, draft, prompts, params.samples)
        if cfg.engine == "vllm" and not paths.dev:
            measured, failure = with_vllm(measured, cfg, card, draft, params.engines.vllm)
    if measured.greedy:  # speculation with no draft replayed over the same greedy outputs
        measured.report["free"] = free_acceptance(
            params.benchmark.free, measured.prompt_ids, measured.greedy, cfg.k
        )
    if not paths.dev and failure is None:
        measured = with_comparison(measured, params, card, paths, Comparison(sets, others))
    plots = dict(measured.plots)
    if "by_context" in measured.report:  # what the verdict says of context (benchmark reads it)
        plots["context.json"] = context_summary(measured.report, cfg.collapse_share)
    for name, rows in plots.items():
        write_json(paths.plots / name, rows)
    if "sets" in measured.report:
        (paths.plots / "sets.md").write_text(measured.report["sets"]["table"])
    return measured, failure


def builtin_figures(report: dict) -> dict | None:
    """The built-in engine's figures of the trained draft on the held-out split, as compare's rows
    read them; None where vLLM alone measured it."""
    if report.get("tau_sim") is None:
        return None
    engines = report.get("engines") or {}
    builtin = engines.get("builtin") or report
    return {
        "acceptance_length": builtin["acceptance_length"],
        "tokens_per_step": report["tokens_per_step"],
        "position_acceptance": builtin["position_acceptance"],
        "tau_sim": report["tau_sim"],
        "prompts": report["prompts"],
        "turns": report["prompts"],
        "rounds": builtin["rounds"],
        "lossless_checked_prompts": report.get("lossless_checked_prompts"),
        # as measure_rows gives it (the collapse test is the context summary's)
        "by_context": {k: v for k, v in report["by_context"].items() if k != "collapse"},
        "per_prompt": report.get("per_prompt_acceptance"),
        "free": report.get("free"),
    }


def with_comparison(
    measured: EvaluationRun, params, card, paths: Paths, extra: Comparison
) -> EvaluationRun:
    """The run with every eval set x every draft beside its headline (report `sets`, the plot file
    sets.json, the table sets.md); the run itself when there is only the split and this draft.
    `extra`: the eval sets' rows and the drafts to compare, beside the split and this draft."""
    cfg = params.evaluate
    drafts, sets = {TRAINED: paths.draft, **extra.drafts}, extra.sets
    if not sets and len(drafts) == 1:
        return measured
    comparison = Comparison(
        {HELD_OUT: list(read_jsonl(paths.prompts))[: cfg.prompts], **sets},
        drafts,
        params.benchmark.free,
    )
    builtin = builtin_figures(measured.report)
    if builtin is None:  # the target does not fit the built-in engine: vLLM measures each pair
        results, engine = compare_vllm(cfg, card, comparison, params.engines.vllm), "vllm"
    else:  # the trained draft on the split: the headline run's own built-in measurement
        known = {HELD_OUT: {TRAINED: builtin}}
        results, engine = compare_builtin(cfg, card, comparison, known), "builtin"
    # this run's draft against each other one, prompt by prompt, and what each set can detect
    paired = paired_report(results, TRAINED, cfg.confidence)
    table = sets_table(results, engine, cfg.k) + "\n" + paired_table(paired)
    log.info(table)
    sets_report = {
        "engine": engine,
        "k": cfg.k,
        "results": results,
        "gain_over_init": gains(results),
        "paired": paired,
        "table": table,
    }
    rows = [
        {"set": set_name, "draft": draft, **{key: figures.get(key) for key in SET_PLOT_KEYS}}
        for set_name, row in results.items()
        for draft, figures in row.items()
    ]
    return dataclasses.replace(
        measured,
        report={**measured.report, "sets": sets_report},
        plots={**measured.plots, "sets.json": rows},
    )
