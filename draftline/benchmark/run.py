"""The benchmark stage's work: preflight of every engine, then baseline vs speculative decoding.

Preflight runs first for every engine (draftline/draft/preflight.py): a non-EAGLE3 algorithm,
aux layer ids or a hidden size that differ from the target card, or a draft vocabulary that does
not fit the target stops the run when it concerns the selected engine; the deployment command of
each engine is printed and returned with the findings. Engine `hf` then runs the built-in decoders
(draftline/benchmark/hf.py); engines `vllm` / `sglang` a baseline and a speculative server
(draftline/benchmark/server.py), with the draft exported to SGLang's layout when SGLang serves it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from draftline.benchmark.hf import benchmark_hf
from draftline.core.card import TargetCard
from draftline.core.io import read_jsonl, write_json
from draftline.draft.checkpoint import load_draft, read_draft_facts
from draftline.draft.preflight import check_draft, preflight_engines
from draftline.draft.sglang_export import SglangExportError, export_sglang
from draftline.engines.commands import draft_path_for
from draftline.engines.preflight import PreflightError
from draftline.evaluate.acceptance import eos_ids
from draftline.target.model import card_tokenizer, load_target
from draftline.tokens.chat import first_turn_ids

if TYPE_CHECKING:
    from draftline.benchmark.config import BenchmarkConfig


def export_for_sglang(
    cfg: BenchmarkConfig, card: TargetCard, draft_dir: str, log_dir: Path | None
) -> str | None:
    """The draft in SGLang's own layout, made under log_dir when SGLang serves it and
    benchmark.sglang.draft_model_path names none; else None."""
    if cfg.engine != "sglang" or cfg.sglang.draft_model_path is not None:
        return None
    try:
        sglang_draft = str(export_sglang(draft_dir, card, log_dir / "draft_sglang"))
    except SglangExportError as err:
        raise SystemExit(
            f"error: benchmark.engine sglang: {draft_dir} cannot be served by SGLang: {err}"
        ) from None
    print(f"benchmark: exported the draft for SGLang to {sglang_draft}")
    return sglang_draft


def preflight_deploy(
    cfg: BenchmarkConfig,
    card: TargetCard,
    draft_dir: str,
    sglang_draft: str | None,
    deploy_path: str,
) -> dict:
    """Every engine's deployment command and preflight findings, printed; stops the run
    (SystemExit) on a finding that concerns the selected engine."""
    deploy = preflight_engines(card, cfg, draft_dir, sglang_draft)
    for engine, info in deploy.items():
        print(f"benchmark: deploy with {engine}:\n  {info['command']}")
        for problem in info["problems"] if engine == cfg.engine else []:
            print(f"  error: {problem}")
    # what would stop the engines not in use is for whoever deploys with them, not a warning here
    if later := sorted(
        engine for engine, info in deploy.items() if engine != cfg.engine and info["problems"]
    ):
        print(f"benchmark: {deploy_path} notes what deploying with {' / '.join(later)} needs")
    if cfg.engine in deploy and deploy[cfg.engine]["problems"]:
        raise SystemExit(
            f"error: preflight for benchmark.engine {cfg.engine}:\n  "
            + "\n  ".join(deploy[cfg.engine]["problems"])
        )
    if cfg.engine == "hf":
        problems = check_draft(card, read_draft_facts(draft_dir), "hf")
        if problems:
            raise SystemExit("error: preflight for the draft:\n  " + "\n  ".join(problems))
    return deploy


def benchmark_with_hf(
    cfg: BenchmarkConfig, card: TargetCard, draft_dir: str, rows: list, report: dict
) -> None:
    """Engine hf: the built-in baseline and speculative decoders, their figures added to report."""
    # each engine's code loads only when it runs: torch for hf, numpy and rich for the servers
    import torch

    device = cfg.resolved_device()
    target, tokenizer = load_target(card, device, getattr(torch, cfg.dtype), cfg.device_map)
    draft = load_draft(draft_dir, card, device)
    prompts = [first_turn_ids(tokenizer, row) for row in rows]
    report.update(
        benchmark_hf(target, draft, card.aux_ids, prompts, eos_ids(tokenizer, target), cfg, device)
    )
    print(
        f"benchmark: baseline {report['baseline_tokens_per_s']:.1f} tok/s, speculative "
        f"{report['speculative_tokens_per_s']:.1f} tok/s, speedup {report['speedup']:.2f}x, "
        f"acceptance length {report['acceptance_length']:.2f}"
    )


def benchmark_with_servers(
    cfg: BenchmarkConfig,
    card: TargetCard,
    draft_dir: str,
    sglang_draft: str | None,
    rows: list,
    log_dir: Path,
    report: dict,
    deploy: dict,
) -> None:
    """Engines vllm / sglang: a baseline and a speculative server, their figures added to report
    and their commands, warnings and logs to deploy["benchmark"]."""
    from draftline.benchmark.server import benchmark_server

    # Only the tokenizer here: the target itself may need a whole GPU host.
    tokenizer = card_tokenizer(card)
    prompts = [first_turn_ids(tokenizer, row) for row in rows]
    try:
        result = benchmark_server(
            cfg.engine,
            cfg,
            card,
            draft_path_for(cfg.engine, cfg, draft_dir, sglang_draft),
            prompts,
            log_dir,
        )
    except PreflightError as err:
        raise SystemExit(f"error: benchmark.endpoints: {err}") from None
    deploy["benchmark"] = {
        "engine": cfg.engine,
        "serve_commands": result.pop("serve_commands"),
        "warnings": result.pop("warnings"),
        "server_logs": str(log_dir),
    }
    report.update(result)
    for warning in deploy["benchmark"]["warnings"]:
        print(f"benchmark: warning: {warning}")
    print(
        f"benchmark: {cfg.engine} speedup "
        + ", ".join(f"c={c}: {report[f'speedup_c{c}']}x" for c in cfg.concurrency)
        + f"; acceptance length {report['acceptance_length']} (server logs in {log_dir})"
    )


def run_benchmark(
    cfg: BenchmarkConfig, card: TargetCard, draft_dir: str, eval_path: str, deploy_path: str
) -> tuple[dict, dict]:
    """(report, deploy): the benchmark report and, per engine, its deployment command and preflight
    findings (plus the launched servers' commands and warnings for a server engine). deploy_path is
    named in the messages only."""
    log_dir = (
        Path(tempfile.mkdtemp(prefix=f"draftline-benchmark-{cfg.engine}-"))
        if cfg.engine != "hf"
        else None
    )
    sglang_draft = export_for_sglang(cfg, card, draft_dir, log_dir)
    deploy = preflight_deploy(cfg, card, draft_dir, sglang_draft, deploy_path)

    rows = list(read_jsonl(eval_path))[: cfg.prompts]
    if not rows:
        raise SystemExit(f"error: {eval_path} has no eval prompts")
    report = {
        "engine": cfg.engine,
        "k": cfg.k,
        "max_new_tokens": cfg.max_new_tokens,
        "prompts": len(rows),
    }
    if cfg.engine == "hf":
        benchmark_with_hf(cfg, card, draft_dir, rows, report)
    else:
        benchmark_with_servers(cfg, card, draft_dir, sglang_draft, rows, log_dir, report, deploy)
    return report, deploy


class Paths(NamedTuple):
    card: Path  # models/target/card.json
    draft: Path  # models/draft
    prompts: Path  # datasets/prompts/eval.jsonl
    deploy: Path  # reports/deploy.json: each engine's deployment command and findings


def run(params, paths: Paths) -> dict:
    """Stage `benchmark`: baseline against speculative decoding by params.benchmark; the
    report, with reports/deploy.json written."""
    card = TargetCard.load(paths.card)
    report, deploy = run_benchmark(
        params.benchmark, card, str(paths.draft), str(paths.prompts), str(paths.deploy)
    )
    write_json(paths.deploy, deploy)
    return report
