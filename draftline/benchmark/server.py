"""Benchmark engines `vllm` and `sglang`: a baseline server, then a speculative server per k, same load.

Each server is started from the same command (the speculative ones add the draft and their k),
warmed up, then driven at every concurrency level with the same prompts and max_new_tokens. Acceptance comes
from the server itself: vLLM's spec-decode counters on /metrics (difference across each level),
SGLang's per-request meta_info. The servers run one after the other on the same GPUs, on
benchmark.port or, by default, a free port chosen at each start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shlex
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from draftline.benchmark import lossless
from draftline.benchmark.commands import benchmark_serve_command
from draftline.benchmark.loadgen import Load, LoadTarget, run_load, summarize_load
from draftline.benchmark.spec_metrics import sglang_acceptance, vllm_acceptance, vllm_spec_counters
from draftline.engines.preflight import preflight_benchmark
from draftline.engines.servers import ManagedServer, launch_env, server_url, startup_timeout_s

if TYPE_CHECKING:
    from draftline.benchmark.config import BenchmarkConfig
    from draftline.core.card import TargetCard

log = logging.getLogger(__name__)


def http_get(url: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()


def engine_endpoint(engine: str, base_url: str, top_logprobs: int = 0) -> LoadTarget:
    if engine == "sglang":
        return LoadTarget(base_url, "sglang-generate", top_logprobs=top_logprobs)
    models = json.loads(http_get(f"{base_url}/v1/models"))["data"]
    return LoadTarget(
        base_url,
        "openai-completions",
        model=models[0]["id"],
        stream_options=True,
        token_ids=True,
        top_logprobs=top_logprobs,
    )


def metrics_snapshot(engine: str, base_url: str) -> dict | None:
    return vllm_spec_counters(http_get(f"{base_url}/metrics")) if engine == "vllm" else None


REFERENCE_LOGPROBS = 5  # top logprobs per token of the baseline's reference outputs (near-ties)


@dataclass(frozen=True)
class ServerBench:
    """What every server of one benchmark shares: the engine, its params, the target, the prompts'
    token ids and where the servers' logs go."""

    engine: str
    cfg: BenchmarkConfig
    card: TargetCard
    prompts: list
    log_dir: Path


@dataclass
class Level:
    """One load level against one server: the load summary, the server's acceptance (None for
    the baseline) and every request's result."""

    summary: dict
    acceptance: dict | None
    results: list
    counters: tuple  # (before, after): vLLM's spec-decode counters around the level


@dataclass
class ModeRun:
    command: str
    levels: dict[int, Level]
    reference: list | None = None  # the baseline's untimed outputs with their top logprobs


def mode_server(
    bench: ServerBench,
    draft_path: str | None,
    k: int | None,
    commands: list[list[str]],
    log_path: Path,
):
    """The server of one mode, as a context manager giving its base URL: benchmark.endpoints'
    running one (preflight-checked), else a launched one whose commands are appended to `commands`."""
    engine, cfg, card = bench.engine, bench.cfg, bench.card
    mode = "speculative" if draft_path else "baseline"
    if mode in cfg.endpoints:  # already running: checked, not started
        base_url = cfg.endpoints[mode].rstrip("/")
        algorithm = cfg.vllm.method if engine == "vllm" else cfg.sglang.algorithm
        seen = preflight_benchmark(engine, base_url, card, draft_path, algorithm)
        log.info(
            f"benchmark: {mode} server at {base_url} (preflight: {seen}); the same server is benchmarked as "
            f"`{shlex.join(commands[0])}` would be"
        )
        return contextlib.nullcontext(base_url)
    limit, why = startup_timeout_s(cfg.startup_timeout_s, card.model, card.revision)

    def command(port: int) -> list[str]:  # benchmark.port, else a free port chosen at start
        commands.append(benchmark_serve_command(engine, card, cfg, draft_path, port, k=k))
        log.info(
            f"benchmark: starting {shlex.join(commands[-1])}  (log: {log_path}, start-up limit {limit:.0f}s: {why})"
        )
        return commands[-1]

    return ManagedServer(
        command,
        launch_env(engine, card.model, log_path.parent / ".hf_cache"),
        server_url(cfg.host, cfg.port),
        log_path,
        limit,
    )


@dataclass(frozen=True)
class LevelLoad:
    """One load run against a server: the benchmark's prompts at a request count and concurrency,
    with its own task on the shared progress bar; returns run_load's (results, wall seconds)."""

    endpoint: LoadTarget
    prompts: list
    cfg: BenchmarkConfig
    bar: Progress

    def __call__(self, description: str, requests: int, concurrency: int):
        task = self.bar.add_task(description, total=requests)
        return asyncio.run(
            run_load(
                self.endpoint,
                self.prompts,
                Load(requests, concurrency, self.cfg.max_new_tokens, self.cfg.request_timeout_s),
                on_done=lambda _r: self.bar.advance(task),
            )
        )


def measure_level(bench: ServerBench, mode: str, c: int, load: LevelLoad, base_url: str) -> Level:
    """One concurrency level c, `benchmark.repeats` times: the summary of the median pass (by
    output tokens/s) with every pass's tokens/s beside it, acceptance over all passes; raises when
    every request failed."""
    engine, cfg = bench.engine, bench.cfg
    requests = cfg.requests_per_level or max(len(load.prompts), 4 * c)
    before = metrics_snapshot(engine, base_url)
    passes = [
        load(
            f"{mode} c={c}" + (f" ({i + 1}/{cfg.repeats})" if cfg.repeats > 1 else ""), requests, c
        )
        for i in range(cfg.repeats)
    ]
    if engine == "vllm":
        time.sleep(1.0)  # the frontend records a step's stats after handing its tokens out
    after = metrics_snapshot(engine, base_url)
    summaries = [summarize_load(results, wall) for results, wall in passes]
    order = sorted(range(len(summaries)), key=lambda i: summaries[i]["output_tokens_per_s"])
    summary = {
        **summaries[order[len(order) // 2]],
        "runs_tokens_per_s": [s["output_tokens_per_s"] for s in summaries],
    }
    results = [r for pass_results, _ in passes for r in pass_results]
    if engine == "vllm":
        acceptance = vllm_acceptance(before, after)
    else:
        acceptance = sglang_acceptance([r.meta_info for r in results if r.ok])
    failures = [r.error for r in results if not r.ok]
    if failures and len(failures) == len(results):
        raise RuntimeError(f"every request at concurrency {c} failed, e.g. {failures[0]}")
    log.info(
        f"benchmark: {mode} c={c}: "
        f"{summary['output_tokens_per_s']:.1f} tok/s"
        + (f" (passes {summary['runs_tokens_per_s']})" if cfg.repeats > 1 else "")
        + f", ttft p50 {summary['ttft_ms_p50']} ms, {summary['failed']} failed"
        + (f", acceptance {acceptance.get('acceptance_length')}" if acceptance else "")
    )
    return Level(summary, acceptance, results, (before, after))


def run_mode(bench: ServerBench, draft_path: str | None, k: int | None) -> ModeRun:
    """Start one server (the baseline: draft_path None), warm it up, run every level; the
    baseline then answers every prompt once more, untimed, with its top logprobs: the reference
    the speculative outputs are judged against."""
    engine, cfg = bench.engine, bench.cfg
    mode = f"k={k}" if draft_path else "baseline"
    log_path = bench.log_dir / f"{engine}_{'baseline' if draft_path is None else f'k{k}'}.log"
    # as deployed (no port: the engine's default)
    commands = [benchmark_serve_command(engine, bench.card, cfg, draft_path, k=k)]
    server = mode_server(bench, draft_path, k, commands, log_path)
    with (
        server as base_url,
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
        ) as bar,
    ):
        load = LevelLoad(engine_endpoint(engine, base_url), bench.prompts, cfg, bar)
        for i in range(cfg.warmup):
            load(f"{mode} warm-up {i + 1}", len(bench.prompts), max(cfg.concurrency))
        levels = {c: measure_level(bench, mode, c, load, base_url) for c in cfg.concurrency}
        reference = None
        if draft_path is None:
            ask = LevelLoad(
                engine_endpoint(engine, base_url, REFERENCE_LOGPROBS), bench.prompts, cfg, bar
            )
            reference, _ = ask("baseline reference", len(bench.prompts), max(cfg.concurrency))
    return ModeRun(shlex.join(commands[-1]), levels, reference)


def check_counters(engine: str, c: int, k: int, baseline: Level, spec: Level) -> None:
    """The baseline must not speculate and the speculative server must."""
    if baseline.acceptance and baseline.acceptance.get("drafts"):
        raise RuntimeError(
            f"the baseline server reported speculative decoding at concurrency {c}: "
            "it must run without a draft"
        )
    if not spec.acceptance or not spec.acceptance.get("drafts"):
        raise RuntimeError(
            f"the speculative server (k={k}) reported no speculative steps at concurrency {c} "
            f"({'no spec_decode counters on /metrics' if engine == 'vllm' else 'no spec_verify_ct in meta_info'})"
        )


def benchmark_server(bench: ServerBench, draft_path: str) -> dict:
    """The baseline server, then one speculative server per k, each at every load level.

    Returns {"levels": {c: {"baseline": summary, "speculative": {k: summary + acceptance},
    "verdicts": {k: [verdict per request]}}}, "serve_commands", "warnings"}: the shape
    draftline/benchmark/hf.py gives its one level, judged by draftline/benchmark/lossless.py."""
    cfg = bench.cfg
    baseline = run_mode(bench, None, None)
    speculative = {k: run_mode(bench, draft_path, k) for k in cfg.ks}
    references = lossless.references(baseline.reference, len(bench.prompts))
    tolerance = cfg.resolved_tie_tolerance()
    warnings, levels = [], {}
    for c in cfg.concurrency:
        base = baseline.levels[c]
        level = {
            "baseline": {
                **base.summary,
                "output_verdicts": lossless.tally(
                    lossless.judge_all(base.results, references, tolerance)
                ),
            },
            "speculative": {},
            "verdicts": {},
        }
        for k, run in speculative.items():
            spec = run.levels[c]
            check_counters(bench.engine, c, k, base, spec)
            level["speculative"][k] = {
                **spec.summary,
                **{name: v for name, v in spec.acceptance.items() if name != "drafts"},
                "drafts": spec.acceptance["drafts"],
            }
            level["verdicts"][k] = lossless.judge_all(spec.results, references, tolerance)
            if spec.acceptance.get("acceptance_length", 0) < 1.1:
                warnings.append(
                    f"c{c} k={k}: acceptance length {spec.acceptance.get('acceptance_length')} is "
                    "~1: the draft is not helping (wrong algorithm, aux layers or vocabulary in the "
                    "server?)"
                )
        levels[c] = level
    return {
        "levels": levels,
        "acceptance_by_k": {
            k: overall_acceptance(bench.engine, run.levels, cfg.concurrency)
            for k, run in speculative.items()
        },
        "serve_commands": {
            "baseline": baseline.command,
            **{f"k{k}": run.command for k, run in speculative.items()},
        },
        "warnings": warnings,
    }


def overall_acceptance(engine: str, spec_levels: dict, concurrency: list[int]) -> float | None:
    """Acceptance length over every measured request of one server (warm-up excluded)."""
    if engine == "vllm":
        first, last = (
            spec_levels[concurrency[0]].counters[0],
            spec_levels[concurrency[-1]].counters[1],
        )
        # the counters only grow; warm-up happened before the first snapshot
        acc = vllm_acceptance(first, last)
        return acc.get("acceptance_length") if acc else None
    measured = [spec_levels[c].acceptance for c in concurrency if spec_levels[c].acceptance]
    drafts = sum(a["drafts"] for a in measured)
    if not drafts:
        return None
    return round(sum(a["acceptance_length"] * a["drafts"] for a in measured) / drafts, 4)
