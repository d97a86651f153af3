"""The benchmark's server command lines: benchmark params in the engines' terms (EngineServe,
SpeculativeDraft); draftline/engines/commands.py spells each engine's flags. The same commands
without a port are the deployment commands."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from draftline.benchmark.engines import served_engine
from draftline.engines.commands import EngineServe, engine_serve_command

if TYPE_CHECKING:
    from draftline.benchmark.config import BenchmarkConfig
    from draftline.core.card import TargetCard
    from draftline.engines.commands import SpeculativeDraft


def _serve(
    engine: str, cfg: BenchmarkConfig, port: int | None, draft: SpeculativeDraft | None
) -> EngineServe:
    served = served_engine(engine)
    port = cfg.port if port is None else port
    return EngineServe(served.spelled_as, *served.launcher(cfg), cfg.host, port, draft)


def _draft(
    engine: str,
    cfg: BenchmarkConfig,
    draft_path: str | None,
    k: int | None,
    k_per_batch_size: list[list[int]] | None,
) -> SpeculativeDraft | None:
    k = max(cfg.k) if k is None else k
    return served_engine(engine).draft(cfg, draft_path, k, k_per_batch_size) if draft_path else None


def benchmark_serve_command(
    engine: str,
    card: TargetCard,
    cfg: BenchmarkConfig,
    draft_path: str | None,
    port: int | None = None,
    *,
    k: int | None = None,
) -> list[str]:
    """The server command line; draft_path None gives the non-speculative baseline. `port` (else
    benchmark.port); with neither, no --port: the engine's default (the deployment command).
    k: draft tokens per step (None: the largest of benchmark.k)."""
    draft = _draft(engine, cfg, draft_path, k, None)
    return engine_serve_command(card, _serve(engine, cfg, port, draft))


def free_serve_command(
    engine: str,
    card: TargetCard,
    cfg: BenchmarkConfig,
    method: str,
    k: int,
    port: int | None = None,
) -> list[str]:
    """The server command line of a benchmark.free method (draftline/draft/free.py): no draft
    model, k tokens per step from the method itself; `port` as benchmark_serve_command's."""
    draft = served_engine(engine).free_draft(cfg, method, k)
    return engine_serve_command(card, _serve(engine, cfg, port, draft))


def k_per_batch_size_command(
    card: TargetCard, cfg: BenchmarkConfig, draft_path: str, schedule: list[list[int]]
) -> list[str]:
    """vLLM's deployment command that picks k per batch size: `schedule`, [[first batch size, last,
    k], ...], as num_speculative_tokens_per_batch_size in its speculative config, at the
    schedule's largest k."""
    top = max(k for _, _, k in schedule)
    draft = _draft("vllm", cfg, draft_path, top, schedule)
    return engine_serve_command(card, _serve("vllm", cfg, None, draft))


def draft_path_for(
    engine: str, cfg: BenchmarkConfig, draft_dir: str, sglang_draft: str | None = None
) -> str:
    """The draft directory an engine serves: for one serving its own layout (SGLang) the one its
    params name (benchmark.sglang.draft_model_path), else the stage's export of the draft
    (sglang_draft), else the draft itself (refused by benchmark/preflight.py's
    check_engine_settings)."""
    served = served_engine(engine)
    if served.exports and (served.given_draft(cfg) or sglang_draft):
        return str(Path(served.given_draft(cfg) or sglang_draft).resolve())
    return str(Path(draft_dir).resolve())
