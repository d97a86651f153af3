"""`evaluate.engine: vllm`: the draft's acceptance measured by the engine users serve it with, and
the train-serve parity gate.

vLLM runs in its own environment (engines.vllm.python) as `draftline/evaluate/vllm_generate.py`: the same
prompt ids the built-in engine decodes (draftline/evaluate/prompts.py `eval_prompt_ids`), greedy,
`evaluate.max_new_tokens`, the draft at k = evaluate.k, vLLM's parallelism from
evaluate.vllm.engine_args (tensor_parallel_size: 8 on an 8-GPU host). Acceptance comes from vLLM's
own spec-decode counters: acceptance length = 1 + accepted / drafts, per position accepted at
position i / drafts (vllm/v1/spec_decode/metrics.py), the built-in engine's definitions.
Those counters are per engine, not per request, so acceptance by context length (`by_context`,
draftline/evaluate/context.py counted_buckets) comes from running each bucket of
evaluate.context_buckets, the prompts bucketed by their length, as a call of its own and reading
the counters after each.

Parity (evaluate.vllm.parity, on by default when the target fits the built-in engine): both
engines evaluate the draft, the report shows both side by side, per position; a gap above the
tolerance fails the stage with what vLLM read (aux layer ids, draft vocabulary, norms, dtype,
whether it decoded the prompt ids it was given) next to what the checkpoint and the target card
say, so a checkpoint that loads in vLLM but is read differently from training shows up here, not
after deployment. Tolerance (evaluate.vllm.parity_tolerance, null = by dtype): in float32 both
engines verify the same greedy chain, so their counts agree but for a rare kernel-rounding flip at
a near-tie (the default run: identical); 0.02 lets about one flip in fifty steps through, while a
checkpoint naming the wrong aux layers trips it (tests/evaluate/test_vllm.py). 16-bit targets round the k+1-token
verification differently from one-token steps, so 0.1.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from draftline.core.errors import DraftlineError
from draftline.core.io import read_jsonl
from draftline.draft.checkpoint import draft_method
from draftline.engines.servers import log_tail
from draftline.evaluate import vllm_generate
from draftline.evaluate.acceptance import (
    EvalPromptsError,
    EvaluationRun,
    compare_to_greedy,
    mixed_train_count,
)
from draftline.evaluate.context import (
    bucket_index,
    bucket_labels,
    check_edges,
    collapse,
    counted_buckets,
)
from draftline.evaluate.prompts import eval_prompt_ids

if TYPE_CHECKING:
    from draftline.core.card import TargetCard
    from draftline.engines.config import VllmEngineConfig
    from draftline.evaluate.config import EvaluateConfig

# the script vLLM's interpreter runs; imported (stdlib only at its top) so that an edit to it reruns
# the evaluate stages
GENERATE_SCRIPT = Path(vllm_generate.__file__)
PARITY_TOLERANCE = {"float32": 0.02, "float16": 0.1, "bfloat16": 0.1}

log = logging.getLogger(__name__)


class VllmRunError(RuntimeError):
    pass


class VllmEvaluationFailed(DraftlineError):
    """vLLM could not measure the draft (it exited, or never used the draft); the message has what
    it said."""


PARALLEL_ARGS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")


def generate_env(job: dict, engine: VllmEngineConfig, base) -> dict[str, str]:
    """The environment of draftline/evaluate/vllm_generate.py. Without parallelism (every *_parallel_size
    1) the engine core runs in the script's own process (VLLM_ENABLE_V1_MULTIPROCESSING=0), not in
    a process of its own, which on the CPU build spawns a third for its worker: each of them
    imports vLLM and torch again, which is most of the start-up on a small target. The outputs and
    spec-decode counters are the same either way (compared on the default run's draft). With
    tensor, pipeline or data parallelism vLLM's defaults stay; the environment may set it."""
    args = job.get("engine_args") or {}
    alone = all(int(args.get(name) or 1) <= 1 for name in PARALLEL_ARGS)
    env = engine.env(dict(base), one_process=alone)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def run_vllm_generate(job: dict, engine: VllmEngineConfig, workdir: Path) -> dict:
    """draftline/evaluate/vllm_generate.py on `job` in the vLLM environment; its result, with the wall time
    (engine start-up included). Fails with the tail of its log."""
    workdir.mkdir(parents=True, exist_ok=True)
    job_path, result_path, log_path = (
        workdir / "vllm_job.json",
        workdir / "vllm_result.json",
        workdir / "vllm.log",
    )
    job_path.write_text(json.dumps(job))
    result_path.unlink(missing_ok=True)
    python = engine.resolved_python()
    cmd = [python, str(GENERATE_SCRIPT), str(job_path), str(result_path)]
    log.info(f"evaluate: vLLM ({python}) on {len(job['prompts'])} prompts; log {log_path}")
    env = generate_env(job, engine, os.environ)
    started = time.perf_counter()
    with open(log_path, "w") as vllm_log:
        code = subprocess.run(cmd, stdout=vllm_log, stderr=subprocess.STDOUT, env=env).returncode
    if code != 0 or not result_path.is_file():
        raise VllmRunError(
            f"vLLM exited with {code} ({' '.join(cmd)}; engines.vllm.python {python}: `make "
            f"setup-vllm` builds the project's vLLM environment); the end of {log_path}:\n"
            f"{log_tail(log_path)}"
        )
    result = json.loads(result_path.read_text())
    result["wall_s"] = round(time.perf_counter() - started, 2)
    return result


def counter_acceptance(counters: dict | None, k: int) -> dict:
    """Acceptance length and per-position acceptance from vLLM's summed counters."""
    if not counters or not counters.get("drafts"):
        raise VllmRunError(
            "vLLM reported no spec-decode drafts: the draft was not used (no "
            "vllm:spec_decode_num_drafts counter)"
        )
    drafts = counters["drafts"]
    per_pos = list(counters.get("accepted_per_pos") or [])[:k]
    return {
        "acceptance_length": round(1 + counters["accepted_tokens"] / drafts, 4),
        "rounds": int(drafts),
        "draft_acceptance_rate": round(counters["accepted_tokens"] / counters["draft_tokens"], 4)
        if counters.get("draft_tokens")
        else None,
        "position_acceptance": {str(i + 1): round(n / drafts, 4) for i, n in enumerate(per_pos)},
    }


def context_groups(prompts: list[list[int]], edges: list[int]) -> list[list[int]]:
    """The indices of `prompts` in each bucket of `edges` by prompt length (one list per bucket,
    empty ones kept): the job's groups, so that each bucket's counters are its own."""
    edges = check_edges(edges)
    groups: list[list[int]] = [[] for _ in bucket_labels(edges)]
    for n, ids in enumerate(prompts):
        groups[bucket_index(len(ids), edges)].append(n)
    return groups


def vllm_by_context(result: dict, prompts: list[list[int]], cfg: EvaluateConfig) -> dict:
    """by_context from a run of vllm_job's groups: each bucket's requests and counters
    (counted_buckets), with its collapse test. The buckets' drafts must sum to the run's:
    anything else is a bug in the group bookkeeping (vllm_generate.py), not something a user
    can fix."""
    groups = result["group_counters"]
    bucketed = sum(int((c or {}).get("drafts") or 0) for c in groups)
    total = int((result["counters"] or {}).get("drafts") or 0)
    if bucketed != total:
        raise RuntimeError(
            f"vLLM's context buckets count {bucketed} drafts, its whole run {total}: the "
            f"per-bucket counters ({groups}) do not add up to the run's"
        )
    contexts = counted_buckets(
        list(zip(prompts, result["outputs"])), groups, cfg.context_buckets, cfg.confidence
    )
    # the built-in engine's test on its by_context (acceptance.py), here without intervals
    contexts["collapse"] = collapse(contexts, cfg.collapse_share)
    return contexts


def vllm_job(card: TargetCard, draft_dir: str | Path, cfg: EvaluateConfig, prompts: list) -> dict:
    model = str(Path(card.model).resolve()) if Path(card.model).exists() else card.model
    engine_args = dict(cfg.vllm.engine_args)
    if card.revision:
        engine_args.setdefault("revision", card.revision)
    if card.trust_remote_code:
        engine_args.setdefault("trust_remote_code", True)
    return {
        "model": model,
        "draft": str(Path(draft_dir).resolve()),
        "served_as": draft_method(draft_dir).vllm_speculative(),
        "k": cfg.k,
        "dtype": cfg.dtype,
        "max_tokens": cfg.max_new_tokens,
        "prompts": prompts,
        # each context bucket generated by itself: its counters are its own (vllm_by_context)
        "groups": context_groups(prompts, cfg.context_buckets),
        "engine_args": engine_args,
    }


def checkpoint_says(card: TargetCard, draft_dir: str | Path) -> dict:
    """What the draft's config.json and the target card say, to set beside what vLLM read."""
    config = json.loads(Path(draft_dir, "config.json").read_text())
    eagle = config.get("transformer_layer_config") or {}
    return {
        "card_aux_layer_ids": list(card.aux_ids),
        "eagle_aux_hidden_state_layer_ids": config.get("eagle_aux_hidden_state_layer_ids"),
        "draft_vocab_size": config.get("draft_vocab_size"),
        "norm_before_residual": config.get("norm_before_residual"),
        "architectures": config.get("architectures") or eagle.get("architectures"),
        "speculators_model_type": config.get("speculators_model_type"),
    }


def parity(builtin: dict, vllm: dict, tolerance: float) -> dict:
    """Side by side, and the largest gap: acceptance length, each position's acceptance."""
    positions = sorted(
        set(builtin["position_acceptance"]) | set(vllm["position_acceptance"]), key=int
    )
    rows = {
        "acceptance_length": (builtin["acceptance_length"], vllm["acceptance_length"]),
        **{
            f"position_{p}": (
                builtin["position_acceptance"].get(p, 0.0),
                vllm["position_acceptance"].get(p, 0.0),
            )
            for p in positions
        },
    }
    gaps = {name: round(abs(a - b), 4) for name, (a, b) in rows.items()}
    worst = max(gaps, key=gaps.get)
    return {
        "side_by_side": {name: {"builtin": a, "vllm": b} for name, (a, b) in rows.items()},
        "rounds": {"builtin": builtin["rounds"], "vllm": vllm["rounds"]},
        "gap": gaps[worst],
        "worst": worst,
        "tolerance": tolerance,
        "passed": gaps[worst] <= tolerance,
    }


def diagnosis(gate: dict, read: dict, says: dict, prompt_ids_match: list[bool], dtype: str) -> str:
    lines = [
        f"vLLM and the built-in engine disagree on this draft: {gate['worst']} differs by "
        f"{gate['gap']} (tolerance {gate['tolerance']}, evaluate.vllm.parity_tolerance)",
        "  side by side (built-in / vLLM): "
        + ", ".join(
            f"{name} {v['builtin']} / {v['vllm']}" for name, v in gate["side_by_side"].items()
        ),
        f"  aux layer ids: vLLM read {read.get('eagle_aux_hidden_state_layer_ids')}, the "
        f"checkpoint says {says['eagle_aux_hidden_state_layer_ids']}, the target card (training) "
        f"{says['card_aux_layer_ids']}",
        f"  draft vocabulary: vLLM read {read.get('draft_vocab_size')}, checkpoint "
        f"{says['draft_vocab_size']} (d2t/t2d in its weights)",
        f"  norm_before_residual: vLLM read {read.get('norm_before_residual')}, checkpoint "
        f"{says['norm_before_residual']}",
        f"  dtype: vLLM ran {read.get('dtype')} (draft {read.get('draft_dtype')}), evaluate.dtype {dtype}",
        f"  prompt ids: vLLM decoded {sum(prompt_ids_match)} of {len(prompt_ids_match)} prompts "
        "from exactly the ids it was given",
    ]
    mismatch = says["eagle_aux_hidden_state_layer_ids"] not in (None, says["card_aux_layer_ids"])
    if mismatch:
        lines.append(
            "  likely cause: the checkpoint names aux layers the draft was not trained on; "
            "train it again, or fix eagle_aux_hidden_state_layer_ids in its config.json"
        )
    return "\n".join(lines)


def evaluate_with_vllm(
    cfg: EvaluateConfig,
    card: TargetCard,
    draft_dir: str | Path,
    prompts: dict[str, list[int]],
    reference: EvaluationRun | None,
    engine: VllmEngineConfig,
) -> dict:
    """vLLM's acceptance on `prompts` (id -> first-turn ids); with the built-in engine's run
    (`reference`), each of vLLM's speculative outputs judged against its greedy output by the
    lossless rule (`outputs`: output_verdicts), and acceptance by the prompts' context length
    (`by_context`: vllm_by_context). Its job, result and log go to a temporary directory, kept
    when vLLM fails."""
    import shutil
    import tempfile

    ids = list(prompts)
    ordered = [prompts[i] for i in ids]
    workdir = Path(tempfile.mkdtemp(prefix="draftline-evaluate-vllm-"))
    try:
        result = run_vllm_generate(vllm_job(card, draft_dir, cfg, ordered), engine, workdir)
        acceptance = counter_acceptance(result["counters"], cfg.k)
    except VllmRunError as err:
        raise VllmEvaluationFailed(f"error: evaluate.engine vllm: {err}") from None
    try:
        contexts = vllm_by_context(result, ordered, cfg)
    except RuntimeError as err:
        raise RuntimeError(f"{err}; vLLM's job and result are in {workdir}") from None
    shutil.rmtree(workdir, ignore_errors=True)
    report = {
        **acceptance,
        "by_context": contexts,
        "prompts": len(ids),
        "generated_tokens": sum(len(o) for o in result["outputs"]),
        "read": result["read"],
        "prompt_ids_match": sum(result["prompt_ids_match"]),
        "vllm": result.get("vllm"),
        "load_s": result["load_s"],
        "generate_s": result["generate_s"],
        "wall_s": result["wall_s"],
    }
    report["prompt_ids_differing"] = [
        i for i, same in zip(ids, result["prompt_ids_match"]) if not same
    ][:10]
    if reference is not None:
        outputs = dict(zip(ids, result["outputs"]))
        report["outputs"] = output_verdicts(outputs, reference, cfg.resolved_tie_tolerance())
        report["outputs_equal_to_builtin_greedy"] = report["outputs"]["identical"]
    log.info(
        f"evaluate: vLLM acceptance length {report['acceptance_length']:.4f} over "
        f"{report['rounds']} drafts; per position {list(report['position_acceptance'].values())}; "
        f"engine start-up {report['load_s']} s"
    )
    return report


def first_difference(a: list[int], b: list[int]) -> int:
    """The first position where two token lists differ (the shorter one's length if one is a
    prefix of the other)."""
    return next((n for n, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def output_verdicts(
    outputs: dict[str, list[int]], reference: EvaluationRun, tolerance: float
) -> dict:
    """vLLM's output of each prompt judged against the built-in engine's greedy one by the lossless
    rule (compare_to_greedy: identical, near_tie where greedy's top two were within the tie
    tolerance, else mismatch), counted, with the first differing prompts and positions."""
    verdicts = {
        i: compare_to_greedy(out, reference.greedy_run(i), tolerance) for i, out in outputs.items()
    }
    differing = [
        {
            "id": i,
            "verdict": verdict,
            "position": first_difference(outputs[i], reference.greedy[i]),
        }
        for i, verdict in verdicts.items()
        if verdict != "identical"
    ]
    counts = Counter(verdicts.values())
    return {
        "identical": counts["identical"],
        "near_tie": counts["near_tie"],
        "mismatch": counts["mismatch"],
        "tie_tolerance": tolerance,
        "differing": differing[:10],
    }


def output_problems(vllm: dict, max_near_tie_share: float) -> list[str]:
    """Why vLLM's outputs fail the gate: a prompt it decoded from other ids than it was given, an
    output that differs from greedy beyond a near-tie, near-ties above the share; [] when none."""
    problems = []
    if vllm["prompt_ids_match"] != vllm["prompts"]:
        problems.append(
            f"vLLM decoded {vllm['prompts'] - vllm['prompt_ids_match']} of {vllm['prompts']} "
            f"prompts from other token ids than it was given (e.g. {vllm['prompt_ids_differing'][:3]})"
        )
    outputs = vllm.get("outputs")
    if outputs is None:
        return problems
    first = [d for d in outputs["differing"] if d["verdict"] == "mismatch"][:3]
    if outputs["mismatch"]:
        problems.append(
            f"{outputs['mismatch']} of {vllm['prompts']} vLLM outputs differ from the built-in "
            "engine's greedy output, not at a near-tie (tolerance "
            f"{outputs['tie_tolerance']}): "
            + ", ".join(f"{d['id']} from token {d['position']}" for d in first)
        )
    share = outputs["near_tie"] / vllm["prompts"] if vllm["prompts"] else 0.0
    if share > max_near_tie_share:
        problems.append(
            f"{outputs['near_tie']} of {vllm['prompts']} vLLM outputs ({share:.0%}) diverge from "
            f"greedy at a near-tie, above evaluate.max_near_tie_share {max_near_tie_share}"
        )
    return problems


def check_parity(
    cfg: EvaluateConfig, card: TargetCard, draft_dir, builtin: dict, vllm: dict
) -> tuple[dict, str | None]:
    """The gate: the parity block for the report, and the diagnosis when it failed (the stage
    writes the report, then fails with it)."""
    tolerance = (
        PARITY_TOLERANCE[cfg.dtype]
        if cfg.vllm.parity_tolerance is None
        else cfg.vllm.parity_tolerance
    )
    gate = parity(builtin, vllm, tolerance)
    gate["outputs"] = vllm.get("outputs")
    gate["prompt_ids_match"] = vllm["prompt_ids_match"]
    outputs_failure = None
    if problems := output_problems(vllm, cfg.max_near_tie_share):
        gate["output_problems"] = problems
        outputs_failure = "train-serve parity: vLLM's outputs are not the target's greedy ones: "
        outputs_failure += "; ".join(problems)
        if gate["passed"]:  # the counts agree, the outputs do not
            gate["passed"] = False
            return gate, outputs_failure
    if not gate["passed"]:
        matched = vllm["prompt_ids_match"]
        prefix = f"{outputs_failure}\n" if outputs_failure else ""
        return gate, prefix + "train-serve parity: " + diagnosis(
            gate,
            vllm["read"],
            checkpoint_says(card, draft_dir),
            [True] * matched + [False] * (vllm["prompts"] - matched),
            cfg.dtype,
        )
    log.info(
        f"evaluate: train-serve parity passed: largest gap {gate['gap']} ({gate['worst']}), "
        f"tolerance {tolerance}"
    )
    return gate, None


# ---- the evaluate stage's runs with vLLM ------------------------------------------------------


def with_vllm(
    run: EvaluationRun, cfg: EvaluateConfig, card: TargetCard, draft_dir, engine
) -> tuple[EvaluationRun, str | None]:
    """The built-in run with vLLM's measurement beside it: vLLM's acceptance as the headline, both
    engines side by side, the parity gate (the failure message when it fails, else None)."""
    vllm = evaluate_with_vllm(cfg, card, draft_dir, run.prompt_ids, run, engine)
    builtin = {
        key: run.report[key] for key in ("acceptance_length", "rounds", "position_acceptance")
    }
    gate, failure = check_parity(cfg, card, draft_dir, builtin, vllm)
    report = {
        **run.report,
        "engine": "vllm",
        "acceptance_length": vllm["acceptance_length"],
        "position_acceptance": vllm["position_acceptance"],
        "engines": {"builtin": builtin, "vllm": vllm},
        "parity": gate,
    }
    plots = {
        **run.plots,
        "acceptance_vs_samples.json": [
            {**point, "acceptance_length": vllm["acceptance_length"]}
            for point in run.plots["acceptance_vs_samples.json"]
        ],
        "position_acceptance.json": [
            {
                "position": int(p),
                "acceptance": rate,
                "builtin": builtin["position_acceptance"].get(p),
            }
            for p, rate in vllm["position_acceptance"].items()
        ],
    }
    return EvaluationRun(report, plots, run.prompt_ids, run.greedy, run.runner_ups), failure


def vllm_only_run(cfg: EvaluateConfig, card: TargetCard, draft_dir, eval_path, samples, engine):
    """evaluate.vllm.parity false: vLLM alone (the target is never loaded here); tau_sim and the
    lossless check need the target in transformers, so they are left out (null)."""
    # bound at call time: tests replace target.card_tokenizer
    from draftline.targets.model import card_tokenizer

    rows = list(read_jsonl(eval_path))[: cfg.prompts]
    if not rows:
        raise EvalPromptsError(f"error: {eval_path} has no eval prompts")
    tokenizer = card_tokenizer(card)
    prompts = {row["id"]: eval_prompt_ids(tokenizer, row) for row in rows}
    vllm = evaluate_with_vllm(cfg, card, draft_dir, prompts, None, engine)
    train_prompts = mixed_train_count(eval_path, samples)
    report = {
        "acceptance_length": vllm["acceptance_length"],
        "tau_sim": None,
        "tokens_per_step": None,
        "engine": "vllm",
        "k": cfg.k,
        "prompts": len(rows),
        "generated_tokens": vllm["generated_tokens"],
        "rounds": vllm["rounds"],
        "position_acceptance": vllm["position_acceptance"],
        "by_context": vllm["by_context"],
        "engines": {"vllm": vllm},
        "parity": None,
    }
    plots = {
        "acceptance_vs_samples.json": [
            {
                "samples": train_prompts,
                "samples_requested": samples,
                "k": cfg.k,
                "acceptance_length": vllm["acceptance_length"],
                "tau_sim": None,
            }
        ],
        "position_acceptance.json": [
            {"position": int(p), "acceptance": rate}
            for p, rate in vllm["position_acceptance"].items()
        ],
    }
    return EvaluationRun(report, plots, prompts)
