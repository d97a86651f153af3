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
import tempfile
from pathlib import Path

from draftline.card import TargetCard
from draftline.config import stage_params
from draftline.threads import apply_thread_policy


def main(card_path: str, draft_dir: str, eval_path: str, report_path: str, deploy_path: str) -> None:
    params = stage_params()
    apply_thread_policy("benchmark")  # before torch loads: draftline/threads.py
    cfg = params.benchmark
    from draftline.checkpoint import read_draft_facts
    from draftline.engines import check_draft, preflight
    from draftline.evaluation import prompt_ids
    from draftline.io import read_json, read_jsonl, write_json, write_metrics

    card = TargetCard.load(card_path)
    log_dir = Path(tempfile.mkdtemp(prefix=f"draftline-benchmark-{cfg.engine}-")) if cfg.engine != "hf" else None
    sglang_draft = None
    if cfg.engine == "sglang" and cfg.sglang.draft_model_path is None:  # SGLang's own layout, made here
        from draftline.sglang_export import SglangExportError, export_sglang

        try:
            sglang_draft = str(export_sglang(draft_dir, card, log_dir / "draft_sglang"))
        except SglangExportError as err:
            raise SystemExit(f"error: benchmark.engine sglang: {draft_dir} cannot be served by SGLang: {err}") from None
        print(f"benchmark: exported the draft for SGLang to {sglang_draft}")
    deploy = preflight(card, cfg, draft_dir, sglang_draft)
    for engine, info in deploy.items():
        print(f"benchmark: deploy with {engine}:\n  {info['command']}")
        for problem in info["problems"] if engine == cfg.engine else []:
            print(f"  error: {problem}")
    # what would stop the engines not in use is for whoever deploys with them, not a warning here
    if later := sorted(engine for engine, info in deploy.items() if engine != cfg.engine and info["problems"]):
        print(f"benchmark: {deploy_path} notes what deploying with {' / '.join(later)} needs")
    if cfg.engine in deploy and deploy[cfg.engine]["problems"]:
        raise SystemExit(f"error: preflight for benchmark.engine {cfg.engine}:\n  " + "\n  ".join(deploy[cfg.engine]["problems"]))
    if cfg.engine == "hf":
        problems = check_draft(card, read_draft_facts(draft_dir), "hf")
        if problems:
            raise SystemExit("error: preflight for the draft:\n  " + "\n  ".join(problems))

    rows = list(read_jsonl(eval_path))[: cfg.prompts]
    if not rows:
        raise SystemExit(f"error: {eval_path} has no eval prompts")
    report = {"engine": cfg.engine, "k": cfg.k, "max_new_tokens": cfg.max_new_tokens, "prompts": len(rows)}

    if cfg.engine == "hf":
        import torch

        from draftline.benchmark_hf import benchmark_hf
        from draftline.checkpoint import load_draft
        from draftline.evaluation import eos_ids
        from draftline.target import load_target

        device = cfg.resolved_device()
        target, tokenizer = load_target(card, device, getattr(torch, cfg.dtype), cfg.device_map)
        draft = load_draft(draft_dir, card, device)
        prompts = [prompt_ids(tokenizer, row) for row in rows]
        report.update(benchmark_hf(target, draft, card["aux_layer_ids"], prompts, eos_ids(tokenizer, target), cfg, device))
        print(f"benchmark: baseline {report['baseline_tokens_per_s']:.1f} tok/s, speculative "
              f"{report['speculative_tokens_per_s']:.1f} tok/s, speedup {report['speedup']:.2f}x, "
              f"acceptance length {report['acceptance_length']:.2f}")
    else:
        from draftline.benchmark_server import benchmark_server
        from draftline.engines import draft_path_for
        from draftline.target import card_tokenizer

        # Only the tokenizer here: the target itself may need a whole GPU host.
        tokenizer = card_tokenizer(card)
        prompts = [prompt_ids(tokenizer, row) for row in rows]
        from draftline.serving import PreflightError

        try:
            result = benchmark_server(cfg.engine, cfg, card, draft_path_for(cfg.engine, cfg, draft_dir, sglang_draft), prompts, log_dir)
        except PreflightError as err:
            raise SystemExit(f"error: benchmark.endpoints: {err}") from None
        deploy["benchmark"] = {"engine": cfg.engine, "serve_commands": result.pop("serve_commands"),
                               "warnings": result.pop("warnings"), "server_logs": str(log_dir)}
        report.update(result)
        for warning in deploy["benchmark"]["warnings"]:
            print(f"benchmark: warning: {warning}")
        print(f"benchmark: {cfg.engine} speedup " + ", ".join(f"c={c}: {report[f'speedup_c{c}']}x" for c in cfg.concurrency)
              + f"; acceptance length {report['acceptance_length']} (server logs in {log_dir})")
    write_json(deploy_path, deploy)
    headline = ["speedup", "baseline_tokens_per_s", "speculative_tokens_per_s"]
    write_metrics(report_path, report, headline + [f"speedup_c{c}" for c in cfg.concurrency if cfg.engine != "hf"])


if __name__ == "__main__":
    main(*sys.argv[1:])
