"""Benchmark engines `vllm` and `sglang`: a baseline server, then a speculative server, same load.

Each server is started from the same command (the speculative one adds the draft), warmed up,
then driven at every concurrency level with the same prompts and max_new_tokens. Acceptance comes
from the server itself: vLLM's spec-decode counters on /metrics (difference across each level),
SGLang's per-request meta_info. The servers run one after the other on the same GPUs, on
benchmark.port or, by default, a free port chosen at each start.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from draftline.benchmark.loadgen import LoadTarget, run_load, summarize_load
from draftline.benchmark.spec_metrics import sglang_acceptance, vllm_acceptance, vllm_spec_counters
from draftline.engines.commands import benchmark_serve_command
from draftline.engines.preflight import preflight_benchmark
from draftline.engines.servers import ManagedServer, launch_env, server_url, startup_timeout_s

if TYPE_CHECKING:
    from draftline.benchmark.config import BenchmarkConfig
    from draftline.core.card import TargetCard


def http_get(url: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()


def engine_endpoint(engine: str, base_url: str) -> LoadTarget:
    if engine == "sglang":
        return LoadTarget(base_url, "sglang-generate")
    import json

    models = json.loads(http_get(f"{base_url}/v1/models"))["data"]
    return LoadTarget(base_url, "openai-completions", model=models[0]["id"], stream_options=True)


def metrics_snapshot(engine: str, base_url: str) -> dict | None:
    return vllm_spec_counters(http_get(f"{base_url}/metrics")) if engine == "vllm" else None


def first_texts(results) -> dict[int, str]:
    texts = {}
    for r in results:
        if r.ok and r.prompt_index not in texts:
            texts[r.prompt_index] = r.text
    return texts


def mode_server(
    engine: str,
    cfg: BenchmarkConfig,
    card: TargetCard,
    draft_path: str | None,
    mode: str,
    commands: list[list[str]],
    log_path: Path,
    say,
):
    """The server of one mode, as a context manager giving its base URL: benchmark.endpoints'
    running one (preflight-checked), else a launched one whose commands are appended to `commands`."""
    if mode in cfg.endpoints:  # already running: checked, not started
        base_url = cfg.endpoints[mode].rstrip("/")
        algorithm = cfg.vllm.method if engine == "vllm" else cfg.sglang.algorithm
        seen = preflight_benchmark(engine, mode, base_url, card, draft_path, algorithm, attempts=3)
        say(
            f"benchmark: {mode} server at {base_url} (preflight: {seen}); the same server is benchmarked as "
            f"`{shlex.join(commands[0])}` would be"
        )
        return contextlib.nullcontext(base_url)
    limit, why = startup_timeout_s(cfg.startup_timeout_s, card.model, card.revision)

    def command(port: int) -> list[str]:  # benchmark.port, else a free port chosen at start
        commands.append(benchmark_serve_command(engine, card, cfg, draft_path, port))
        say(
            f"benchmark: starting {shlex.join(commands[-1])}  (log: {log_path}, start-up limit {limit:.0f}s: {why})"
        )
        return commands[-1]

    return ManagedServer(
        command,
        launch_env(engine, card.model, log_path.parent / ".hf_cache"),
        server_url(cfg.host, cfg.port),
        log_path,
        limit,
        say=say,
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
                requests,
                concurrency,
                self.cfg.max_new_tokens,
                self.cfg.request_timeout_s,
                on_done=lambda _r: self.bar.advance(task),
            )
        )


def measure_level(
    engine: str, cfg: BenchmarkConfig, mode: str, c: int, load: LevelLoad, base_url: str, say
) -> tuple:
    """One concurrency level c: (load summary, acceptance or None, first text per prompt,
    (counters before, counters after)); raises when every request failed."""
    requests = cfg.requests_per_level or max(len(load.prompts), 4 * c)
    before = metrics_snapshot(engine, base_url)
    results, wall = load(f"{mode} c={c}", requests, c)
    if engine == "vllm":
        time.sleep(1.0)  # the frontend records a step's stats after handing its tokens out
    after = metrics_snapshot(engine, base_url)
    summary = summarize_load(results, wall)
    if engine == "vllm":
        acceptance = vllm_acceptance(before, after)
    else:
        acceptance = sglang_acceptance([r.meta_info for r in results if r.ok])
    failures = [r.error for r in results if not r.ok]
    if failures and len(failures) == len(results):
        raise RuntimeError(f"every request at concurrency {c} failed, e.g. {failures[0]}")
    say(
        f"benchmark: {mode} c={c}: "
        f"{summary['output_tokens_per_s']:.1f} tok/s, ttft p50 {summary['ttft_ms_p50']} ms, "
        f"{summary['failed']} failed"
        + (f", acceptance {acceptance.get('acceptance_length')}" if acceptance else "")
    )
    return (summary, acceptance, first_texts(results), (before, after))


def run_mode(
    engine: str,
    cfg: BenchmarkConfig,
    card: TargetCard,
    draft_path: str | None,
    prompts: list,
    log_path: Path,
    say,
) -> dict:
    """Start one server, warm it up, run every level.

    Returns {"command": str, "levels": {c: (load summary, acceptance or None, first text per prompt,
    (counters before, counters after))}}.
    """
    commands = [
        benchmark_serve_command(engine, card, cfg, draft_path)
    ]  # as deployed (no port: the engine's default)
    levels = {}
    mode = "speculative" if draft_path else "baseline"
    server = mode_server(engine, cfg, card, draft_path, mode, commands, log_path, say)
    with (
        server as base_url,
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
        ) as bar,
    ):
        load = LevelLoad(engine_endpoint(engine, base_url), prompts, cfg, bar)
        for i in range(cfg.warmup):
            load(f"{mode} warm-up {i + 1}", len(prompts), max(cfg.concurrency))
        for c in cfg.concurrency:
            levels[c] = measure_level(engine, cfg, mode, c, load, base_url, say)
    return {"command": shlex.join(commands[-1]), "levels": levels}


def benchmark_server(
    engine: str,
    cfg: BenchmarkConfig,
    card: TargetCard,
    draft_path: str,
    prompts: list,
    log_dir: Path,
    say=print,
) -> dict:
    baseline = run_mode(engine, cfg, card, None, prompts, log_dir / f"{engine}_baseline.log", say)
    speculative = run_mode(
        engine, cfg, card, draft_path, prompts, log_dir / f"{engine}_speculative.log", say
    )

    warnings, levels = [], {}
    for c in cfg.concurrency:
        base, base_acc, base_texts, _ = baseline["levels"][c]
        spec, spec_acc, spec_texts, _ = speculative["levels"][c]
        if base_acc and base_acc.get("drafts"):
            raise RuntimeError(
                f"the baseline server reported speculative decoding at concurrency {c}: "
                "it must run without a draft"
            )
        if not spec_acc or not spec_acc.get("drafts"):
            raise RuntimeError(
                f"the speculative server reported no speculative steps at concurrency {c} "
                f"({'no spec_decode counters on /metrics' if engine == 'vllm' else 'no spec_verify_ct in meta_info'})"
            )
        common = sorted(set(base_texts) & set(spec_texts))
        same = sum(base_texts[i] == spec_texts[i] for i in common)
        speedup = (
            round(spec["output_tokens_per_s"] / base["output_tokens_per_s"], 4)
            if base["output_tokens_per_s"]
            else None
        )
        levels[f"c{c}"] = {
            "speedup": speedup,
            "acceptance_length": spec_acc.get("acceptance_length"),
            "identical_output_share": round(same / len(common), 4) if common else None,
            "baseline": base,
            "speculative": {
                **spec,
                **{k: v for k, v in spec_acc.items() if k != "drafts"},
                "drafts": spec_acc["drafts"],
            },
        }
        if spec_acc.get("acceptance_length", 0) < 1.1:
            warnings.append(
                f"c{c}: acceptance length {spec_acc.get('acceptance_length')} is ~1: the draft is not "
                "helping (wrong algorithm, aux layers or vocabulary in the server?)"
            )

    first = levels[f"c{cfg.concurrency[0]}"]
    report = {
        "engine": engine,
        "speedup": first["speedup"],  # at the first concurrency level
        "acceptance_length": overall_acceptance(engine, speculative["levels"], cfg.concurrency),
        "baseline_tokens_per_s": first["baseline"]["output_tokens_per_s"],
        "speculative_tokens_per_s": first["speculative"]["output_tokens_per_s"],
        **{f"speedup_c{c}": levels[f"c{c}"]["speedup"] for c in cfg.concurrency},
        "levels": levels,
        "serve_commands": {"baseline": baseline["command"], "speculative": speculative["command"]},
        "warnings": warnings,
    }
    return report


def overall_acceptance(engine: str, spec_levels: dict, concurrency: list[int]) -> float | None:
    """Acceptance length over every measured request (warm-up excluded)."""
    if engine == "vllm":
        first, last = spec_levels[concurrency[0]][3][0], spec_levels[concurrency[-1]][3][1]
        # the counters only grow; warm-up happened before the first snapshot
        acc = vllm_acceptance(first, last)
        return acc.get("acceptance_length") if acc else None
    drafts = sum(spec_levels[c][1]["drafts"] for c in concurrency if spec_levels[c][1])
    if not drafts:
        return None
    weighted = sum(
        spec_levels[c][1]["acceptance_length"] * spec_levels[c][1]["drafts"]
        for c in concurrency
        if spec_levels[c][1]
    )
    return round(weighted / drafts, 4)
