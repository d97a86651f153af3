"""The benchmark stage's work: preflight of every engine, then baseline vs speculative decoding.

Preflight runs first for every engine (draftline/benchmark/preflight.py): a non-EAGLE3 algorithm,
aux layer ids or a hidden size that differ from the target card, or a draft vocabulary that does
not fit the target stops the run when it concerns the selected engine; the deployment command of
each engine is printed and returned with the findings. Engine `hf` then runs the built-in decoders
(draftline/benchmark/hf.py); engines `vllm` / `sglang` a baseline and a speculative server
(draftline/benchmark/server.py), with the draft exported to SGLang's layout when SGLang serves it.
"""

from __future__ import annotations

import json
import logging
import shlex
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from draftline.benchmark import lossless, verdict
from draftline.benchmark.commands import (
    benchmark_serve_command,
    draft_path_for,
    free_serve_command,
    k_per_batch_size_command,
)
from draftline.benchmark.config import BenchmarkError
from draftline.benchmark.engines import engine_named, served_engines
from draftline.benchmark.forecast import read_points as read_forecast_points
from draftline.benchmark.preflight import preflight_deploy
from draftline.core.card import TargetCard
from draftline.core.io import read_json, read_jsonl, write_json
from draftline.draft.free import free_method
from draftline.draft.sglang_export import SglangExportError, export_sglang
from draftline.engines.preflight import PreflightError
from draftline.evaluate.context import deploy_context, served_context_limit
from draftline.targets.model import card_tokenizer
from draftline.tokens.chat import first_turn_ids

if TYPE_CHECKING:
    from draftline.benchmark.config import BenchmarkConfig
    from draftline.benchmark.sweep import Level, Sweep

log = logging.getLogger(__name__)


def export_for_sglang(
    cfg: BenchmarkConfig, card: TargetCard, draft_dir: str, log_dir: Path | None
) -> str | None:
    """The draft in SGLang's own layout, made under log_dir when SGLang serves it and
    benchmark.sglang.draft_model_path names none; else None."""
    engine = engine_named(cfg.engine)
    if not engine.served or not engine.exports or engine.given_draft(cfg) is not None:
        return None
    try:
        sglang_draft = str(export_sglang(draft_dir, card, log_dir / "draft_sglang"))
    except SglangExportError as err:
        raise BenchmarkError(
            f"error: benchmark.engine sglang: {draft_dir} cannot be served by SGLang: {err}"
        ) from None
    log.info(f"benchmark: exported the draft for SGLang to {sglang_draft}")
    return sglang_draft


def compare_drafts(cfg: BenchmarkConfig, card: TargetCard, log_dir: Path) -> dict[str, str]:
    """{name: the directory its engine serves} of benchmark.compare, each checked to be a draft."""
    engine, out = engine_named(cfg.engine), {}
    for name, path in sorted(cfg.compare.items()):
        if not (Path(path) / "config.json").is_file():
            raise BenchmarkError(
                f"error: benchmark.compare {name}: {path} is not a draft directory (no config.json)"
            )
        if engine.served and engine.exports:
            try:
                path = str(export_sglang(path, card, log_dir / f"compare_{name}_sglang"))
            except SglangExportError as err:
                raise BenchmarkError(
                    f"error: benchmark.compare {name}: {path} cannot be served by SGLang: {err}"
                ) from None
        out[name] = path
    return out


def benchmark_with_servers(
    cfg: BenchmarkConfig, card: TargetCard, draft_path: str, rows: list, deploy: dict, log_dir: Path
) -> Sweep:
    """Engines vllm / sglang: the sweep of draftline/benchmark/server.py, its commands, warnings
    and logs in deploy["benchmark"]."""
    from draftline.benchmark.server import ServerBench, benchmark_server

    # Only the tokenizer here: the target itself may need a whole GPU host.
    tokenizer = card_tokenizer(card)
    prompts = [first_turn_ids(tokenizer, row) for row in rows]
    compare = compare_drafts(cfg, card, log_dir)
    try:
        sweep = benchmark_server(
            ServerBench(cfg.engine, cfg, card, prompts, log_dir), draft_path, compare
        )
    except PreflightError as err:
        raise BenchmarkError(f"error: benchmark.endpoints: {err}") from None
    deploy["benchmark"] = {
        "engine": cfg.engine,
        "design": sweep.design["layout"],
        "serve_commands": sweep.serve_commands,
        "warnings": sweep.warnings,
        "server_logs": str(log_dir),
    }
    for warning in sweep.warnings:
        log.warning(f"benchmark: warning: {warning}")
    return sweep


ENGINE_BOUND = (
    "The built-in tiny target's step costs are the engine's own per-step overhead, not the "
    "target's compute (its baseline step at {c} requests in flight takes {growth:.2f}x its step at "
    "1 while emitting {c} times the tokens): these speedups show the pipeline at work, not what a "
    "real target gains."
)


def engine_bound(card: TargetCard, levels: dict[int, Level]) -> dict | None:
    """For the built-in tiny target, what bounds its steps, from the baseline's passes: the step
    time at the largest load over the step time at one request in flight."""
    if card.source != "tiny" or len(levels) < 2:
        return None
    lo, hi = min(levels), max(levels)
    tps_lo, tps_hi = (levels[c].baseline["output_tokens_per_s"] for c in (lo, hi))
    if not (tps_lo and tps_hi):
        return None
    growth = (hi / lo) * tps_lo / tps_hi  # step time at hi over step time at lo
    return {
        "concurrency": hi,
        "baseline_step_growth": round(growth, 3),
        "words": ENGINE_BOUND.format(c=hi, growth=growth),
    }


def benchmark_report(cfg: BenchmarkConfig, sweep: Sweep, points, bound=None) -> dict:
    """The report: the verdict's headline first, then every level, the acceptance per k, the
    lossless gate and the whole verdict."""
    levels = sweep.levels
    v = verdict.decide(levels, cfg, cfg.engine, points, sweep.design, bound)
    gate = lossless.gate(
        {c: level.verdicts for c, level in levels.items()},
        cfg.max_output_mismatch_share,
        cfg.resolved_tie_tolerance(),
    )
    decided = {int(c): d for c, d in v["decisions"].items()}
    return {
        "engine": cfg.engine,
        "serve_concurrency": v["serve_concurrency"],
        "decision": v["decision"],
        "k": v["k"],
        "speedup": v["speedup"],
        "speedup_low": v["speedup_low"],
        "speedup_high": v["speedup_high"],
        "pays_off": v["pays_off"],
        "baseline_tokens_per_s": v["baseline_tokens_per_s"],
        "speculative_tokens_per_s": v["speculative_tokens_per_s"],
        "acceptance_length": v["acceptance_length"],
        "lossless_share": gate["lossless_share"],
        "break_even_concurrency": v["break_even"]["break_even_concurrency"],
        "cost_model_held_out_error": (v["cost_model"] or {}).get("held_out_mean_abs_error"),
        **{
            f"{name}_c{c}": decided[c][key]
            for c in sorted(levels)
            for name, key in (("speedup", "speedup"), ("low", "low"), ("high", "high"))
        },
        "ks": cfg.ks,
        "concurrency": sorted(levels),
        "max_new_tokens": cfg.max_new_tokens,
        **sweep.to_json(decided),
        "lossless": gate,
        "verdict": v,
    }


HEADLINE = [
    "engine",
    "serve_concurrency",
    "decision",
    "k",
    "speedup",
    "speedup_low",
    "speedup_high",
    "pays_off",
    "baseline_tokens_per_s",
    "speculative_tokens_per_s",
    "acceptance_length",
    "lossless_share",
    "break_even_concurrency",
    "cost_model_held_out_error",
]


def benchmark_plots(report: dict) -> dict[str, list[dict]]:
    """The plot files' rows: speedup against load, one line per k, and the baseline's tokens/s."""
    speedup_rows, baseline_rows = [], []
    for name, level in report["levels"].items():
        c = int(name[1:])
        baseline_rows.append(
            {"concurrency": c, "tokens_per_s": level["baseline"]["output_tokens_per_s"]}
        )
        for key, spec in level.items():
            if key.startswith("k"):
                speedup_rows.append(
                    {
                        "concurrency": c,
                        "k": key[1:],
                        "speedup": spec["speedup"],
                        "low": spec["speedup_low"],
                        "high": spec["speedup_high"],
                    }
                )
    return {"speedup_vs_load.json": speedup_rows, "baseline_tokens_per_s.json": baseline_rows}


def deploy_commands(
    cfg: BenchmarkConfig, card: TargetCard, deploy: dict, v: dict, paths: dict
) -> None:
    """Every engine's command at the verdict's k; for vLLM also the one choosing k per batch size
    from the sweep (num_speculative_tokens_per_batch_size, in vLLM's speculative config), and a
    recommendation when the draft does not pay off at the serve load."""
    for engine in served_engines():
        info = deploy[engine.name]
        info["command"] = shlex.join(
            benchmark_serve_command(engine.name, card, cfg, paths[engine.name], k=v["k"])
        )
        info["k"] = v["k"]
    schedule = v["k_per_batch_size"]
    if engine_named(cfg.engine).served and len(schedule) > 1 and any(k for _, _, k in schedule):
        deploy["vllm"]["command_k_per_batch_size"] = shlex.join(
            k_per_batch_size_command(card, cfg, paths["vllm"], schedule)
        )
        deploy["vllm"]["k_per_batch_size"] = schedule
        deploy["vllm"]["k_per_batch_size_covers"] = v["k_per_batch_size_covers"]
    be = v["break_even"]
    deploy["verdict"] = {
        "serve_concurrency": v["serve_concurrency"],
        "decision": v["decision"],
        "k": v["k"],
        "speedup": v["speedup"],
        "speedup_interval": [v["speedup_low"], v["speedup_high"]],
        "confidence": v["confidence"],
        "pays_off": v["pays_off"],
        "decided_loads": be["pays_at"] + be["loses_at"] + be["no_gain_at"],
        "no_gain_loads": be["no_gain_at"],
        "undecided_loads": be["undecided_at"],
        "settled": v["settled"],
        "rounds": (v.get("design") or {}).get("rounds"),
        "undecided_k": cfg.undecided_k,
        "recommendation": recommendation(v, cfg.undecided_k),
    }


def deploy_free(cfg: BenchmarkConfig, card: TargetCard, deploy: dict, v: dict) -> None:
    """deploy.json's `free`: which is better at the serve load, the trained draft or a method of
    benchmark.free (None: the paired interval cannot tell), each method's serve command and the
    comparison it rests on (verdict.free_comparisons)."""
    free = v.get("free")
    if not free:
        return
    c = v["serve_concurrency"]
    methods = {}
    for name, m in free["methods"].items():
        at = m["by_load"].get(str(c)) or {}
        methods[name] = {
            "k": m["k"],
            "commands": {
                engine: shlex.join(free_serve_command(engine, card, cfg, name, m["k"]))
                for engine in free_method(name).engines
            },
            "speedup": at.get("free_speedup"),
            "speedup_interval": [at.get("free_low"), at.get("free_high")],
            "draft_k": at.get("draft_k"),
            "draft_over_it": at.get("ratio"),
            "draft_over_it_interval": [at.get("low"), at.get("high")],
        }
    better = free.get("better_at_serve")
    deploy["free"] = {
        "serve_concurrency": c,
        "better": better,
        "words": free.get("words"),
        "confidence_level": free.get("level"),
        "methods": methods,
        **({"not_measured": free["not_measured"]} if free.get("not_measured") else {}),
    }


def recommendation(v: dict, undecided_k: int) -> str:
    c = v["serve_concurrency"]
    if v["decision"] == "yes":
        return f"serve with the draft at k={v['k']} at {c} requests in flight"
    if v["decision"] == "no":
        return f"serve without speculation at {c} requests in flight"
    what = f"with the draft at k={undecided_k}" if undecided_k else "without speculation"
    if v["decision"] == "no_gain":
        return (
            f"no gain worth deploying at {c} requests in flight (the interval lies within "
            f"benchmark.margin of 1): serving {what} (benchmark.undecided_k)"
        )
    return (
        f"undecided at {c} requests in flight: serving {what} (benchmark.undecided_k) until more "
        "passes decide it"
    )


def run_benchmark(
    cfg: BenchmarkConfig, card: TargetCard, draft_dir: str, eval_path: str, points: list
) -> tuple[dict, dict]:
    """(report, deploy): the benchmark report and, per engine, its deployment command at the
    verdict's k and preflight findings (plus the launched servers' commands and warnings for a
    server engine)."""
    engine = engine_named(cfg.engine)
    log_dir = (
        Path(tempfile.mkdtemp(prefix=f"draftline-benchmark-{cfg.engine}-"))
        if engine.served
        else None
    )
    sglang_draft = export_for_sglang(cfg, card, draft_dir, log_dir)
    deploy = preflight_deploy(cfg, card, draft_dir, sglang_draft)

    rows = list(read_jsonl(eval_path))[: cfg.prompts]
    if not rows:
        raise BenchmarkError(f"error: {eval_path} has no eval prompts")
    if not engine.served:
        sweep = engine.benchmark(cfg, card, draft_dir, rows)
    else:
        draft_path = draft_path_for(cfg.engine, cfg, draft_dir, sglang_draft)
        sweep = benchmark_with_servers(cfg, card, draft_path, rows, deploy, log_dir)
    report = {
        **benchmark_report(cfg, sweep, points, engine_bound(card, sweep.levels)),
        "prompts": len(rows),
    }
    paths = {e.name: draft_path_for(e.name, cfg, draft_dir, sglang_draft) for e in served_engines()}
    deploy_commands(cfg, card, deploy, report["verdict"], paths)
    deploy_free(cfg, card, deploy, report["verdict"])
    return report, deploy


class Paths(NamedTuple):
    card: Path  # models/target/card.json
    draft: Path  # models/draft
    prompts: Path  # datasets/prompts/eval.jsonl
    deploy: Path  # reports/deploy.json: each engine's deployment command and findings
    plots: Path  # reports/benchmark/: speedup against load per k, the baseline's tokens/s
    forecast_points: (
        Path | None
    )  # acceptance vs samples (the evaluate stage's plot), for the verdict
    # the evaluate stage's context.json: acceptance by context and the trained length, for the
    # verdict's words and deploy.json's warning (None: not measured)
    context: Path | None = None


def read_points(path: Path | None) -> list[dict]:
    """The acceptance-vs-samples points the verdict forecasts from, each with the k its acceptance
    was measured at where the file gives it (the verdict forecasts at that k); [] without a file."""
    if path is None or not path.is_file():
        return []
    points = read_forecast_points(
        [str(path)]
    )  # checked, one per row; it keeps samples and acceptance only
    rows = json.loads(path.read_text())
    for point, row in zip(points, rows if isinstance(rows, list) else [rows], strict=True):
        if row.get("k") is not None:
            point["k"] = int(row["k"])
    return points


def run(params, paths: Paths) -> dict:
    """Stage `benchmark`: baseline against speculative decoding by params.benchmark; the
    report, with reports/deploy.json and the plots written; its `lossless` gate is for the stage to
    check (lossless.check_gate) once the report itself is written."""
    cfg = params.benchmark
    card = TargetCard.load(paths.card)
    report, deploy = run_benchmark(
        cfg, card, str(paths.draft), str(paths.prompts), read_points(paths.forecast_points)
    )
    summary = read_json(paths.context) if paths.context and paths.context.is_file() else None
    notes = deploy_context(summary, served_context_limit(card.model))
    deploy["context"] = notes["deploy"]
    if notes["words"]:
        report["verdict"]["context"] = notes["words"]
        report["verdict"]["words"] += " " + " ".join(notes["words"])
    write_json(paths.deploy, deploy)
    for name, rows in benchmark_plots(report).items():
        write_json(paths.plots / name, rows)
    log.info(f"benchmark: {report['verdict']['words']}")
    log.info(f"benchmark: deploy ({paths.deploy}): {deploy['verdict']['recommendation']}")
    return report
