"""The server a launched `regenerate.backend` runs: regenerate params in the engines' terms
(ServeSettings, BatchSettings); draftline/engines/commands.py spells each engine's flags."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from draftline.engines.commands import (
    BatchSettings,
    ServeSettings,
    hf_batch_serve_command,
    sglang_regenerate_command,
    transformers_serve_command,
    vllm_regenerate_command,
)
from draftline.engines.config import vllm_engine
from draftline.engines.servers import has_cuda

# The module regenerate.backend hf launches. Named, not imported, and named here, where only the
# regenerate stage reads it: an edit to it (which changes the answers) reruns that stage and no
# other (draftline/core/code.py follows a module named in a string into the closure that names it).
HF_BATCH_SERVER = "draftline.engines.batch_server"

if TYPE_CHECKING:
    from draftline.core.card import TargetCard
    from draftline.regenerate.config import RegenerateConfig


def serve_settings(
    cfg: RegenerateConfig, card: TargetCard, model_name: str, port: int | None
) -> ServeSettings:
    """The launch of the plain target that regenerate params ask for, on `port`."""
    return ServeSettings(
        model=card.model,
        host=cfg.host,
        port=port,
        served_name=model_name,
        revision=card.revision,
        trust_remote_code=card.trust_remote_code,
        tensor_parallel_size=cfg.tensor_parallel_size,
        data_parallel_size=cfg.data_parallel_size,
        max_model_len=cfg.max_model_len,
        reasoning_parser=cfg.reasoning_parser,
        tool_call_parser=cfg.tool_call_parser,
        extra_args=list(cfg.extra_args),
    )


def regenerate_command(
    cfg: RegenerateConfig,
    card: TargetCard,
    model_name: str,
    out: Path | None = None,
    port: int | None = None,
) -> list[str]:
    """The server command of a launched regenerate.backend on `port` (else regenerate.port; with
    neither, no --port: a command to show); `out` (the stage's output dir) takes backend hf's stats."""
    s = serve_settings(cfg, card, model_name, port if port is not None else cfg.port)
    if cfg.backend == "hf":
        batch = BatchSettings(
            cfg.hf.max_batch, cfg.hf.gather_ms, cfg.hf.tie_tolerance, cfg.hf.threads
        )
        stats = out / "server_stats.json" if out else None
        return hf_batch_serve_command(s, batch, stats, HF_BATCH_SERVER)
    if cfg.backend == "transformers":
        return transformers_serve_command(
            s,
            "cuda" if has_cuda() else "cpu",
            cfg.cb_num_blocks if cfg.continuous_batching else None,
            cfg.chat_template_kwargs,
        )
    if cfg.backend == "vllm":
        return vllm_regenerate_command(s, vllm_engine())
    return sglang_regenerate_command(s)
