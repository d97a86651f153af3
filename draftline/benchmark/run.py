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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from draftline.benchmark.config import BenchmarkConfig
    from draftline.core.card import TargetCard


def run_benchmark(
    cfg: BenchmarkConfig, card: TargetCard, draft_dir: str, eval_path: str, deploy_path: str
) -> tuple[dict, dict]:
    """(report, deploy): the benchmark report and, per engine, its deployment command and preflight
    findings (plus the launched servers' commands and warnings for a server engine). deploy_path is
    named in the messages only."""
    from draftline.core.io import read_jsonl
    from draftline.draft.checkpoint import read_draft_facts
    from draftline.draft.preflight import check_draft, preflight_engines
    from draftline.tokens.chat import first_turn_ids

    log_dir = (
        Path(tempfile.mkdtemp(prefix=f"draftline-benchmark-{cfg.engine}-"))
        if cfg.engine != "hf"
        else None
    )
    sglang_draft = None
    if (
        cfg.engine == "sglang" and cfg.sglang.draft_model_path is None
    ):  # SGLang's own layout, made here
        from draftline.draft.sglang_export import SglangExportError, export_sglang

        try:
            sglang_draft = str(export_sglang(draft_dir, card, log_dir / "draft_sglang"))
        except SglangExportError as err:
            raise SystemExit(
                f"error: benchmark.engine sglang: {draft_dir} cannot be served by SGLang: {err}"
            ) from None
        print(f"benchmark: exported the draft for SGLang to {sglang_draft}")
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
        import torch

        from draftline.benchmark.hf import benchmark_hf
        from draftline.draft.checkpoint import load_draft
        from draftline.evaluate.acceptance import eos_ids
        from draftline.target.model import load_target

        device = cfg.resolved_device()
        target, tokenizer = load_target(card, device, getattr(torch, cfg.dtype), cfg.device_map)
        draft = load_draft(draft_dir, card, device)
        prompts = [first_turn_ids(tokenizer, row) for row in rows]
        report.update(
            benchmark_hf(
                target, draft, card.aux_ids, prompts, eos_ids(tokenizer, target), cfg, device
            )
        )
        print(
            f"benchmark: baseline {report['baseline_tokens_per_s']:.1f} tok/s, speculative "
            f"{report['speculative_tokens_per_s']:.1f} tok/s, speedup {report['speedup']:.2f}x, "
            f"acceptance length {report['acceptance_length']:.2f}"
        )
    else:
        from draftline.benchmark.server import benchmark_server
        from draftline.engines.commands import draft_path_for
        from draftline.engines.preflight import PreflightError
        from draftline.target.model import card_tokenizer

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
    return report, deploy
