"""The benchmark's preflight: every engine's settings and the draft it would serve, checked before
any server starts (`preflight_engines`). A configuration that would run but silently feed the
draft the wrong inputs is refused: an EAGLE-3 draft served with another algorithm (plain EAGLE
passes one hidden state where the draft's fc expects three; acceptance collapses to about one token per step with no
error, SGLang PR #21272), or SGLang given a checkpoint layout it does not load as EAGLE-3; the
draft's own checks against the card are draftline/draft/preflight.py's `check_draft`.
"""

from __future__ import annotations

import logging
import shlex
from typing import TYPE_CHECKING

from draftline.benchmark.commands import benchmark_serve_command, draft_path_for
from draftline.benchmark.config import BenchmarkError
from draftline.benchmark.engines import engine_named, served_engine, served_engines
from draftline.draft.checkpoint import DraftFacts, read_draft_facts
from draftline.draft.methods import names
from draftline.draft.preflight import check_draft

if TYPE_CHECKING:
    from draftline.benchmark.config import BenchmarkConfig
    from draftline.core.card import TargetCard

log = logging.getLogger(__name__)


def check_engine_settings(engine: str, cfg: BenchmarkConfig, facts: DraftFacts) -> list[str]:
    """The engine's speculative algorithm and checkpoint layout must suit the draft's method."""
    if facts.algorithm not in names():
        return []  # check_draft refuses the draft (UnknownDrafter's words): no method to suit
    return served_engine(engine).check_settings(cfg, facts)


def preflight_engines(
    card: TargetCard, cfg: BenchmarkConfig, draft_dir: str, sglang_draft: str | None = None
) -> dict:
    """Checks and deployment commands for every benchmark server engine.

    Returns {engine: {"command": str, "problems": [...]}}; the selected engine's problems are
    fatal for the stage, the others' are reported so the deployment command is known to be safe.
    """
    out = {}
    for engine in (e.name for e in served_engines()):
        path = draft_path_for(engine, cfg, draft_dir, sglang_draft)
        facts = read_draft_facts(path)
        problems = check_draft(card, facts, engine) + check_engine_settings(engine, cfg, facts)
        out[engine] = {
            "command": shlex.join(benchmark_serve_command(engine, card, cfg, path)),
            "problems": problems,
        }
    return out


def preflight_deploy(
    cfg: BenchmarkConfig, card: TargetCard, draft_dir: str, sglang_draft: str | None
) -> dict:
    """Every engine's deployment command and preflight findings, logged; raises BenchmarkError
    on a finding that concerns the selected engine."""
    deploy = preflight_engines(card, cfg, draft_dir, sglang_draft)
    for engine, info in deploy.items():
        log.info(f"benchmark: deploy with {engine}:\n  {info['command']}")
        for problem in info["problems"] if engine == cfg.engine else []:
            log.info(f"  error: {problem}")
    # what would stop the engines not in use is for whoever deploys with them, not a warning here
    if later := sorted(
        engine for engine, info in deploy.items() if engine != cfg.engine and info["problems"]
    ):
        log.info(f"benchmark: deploy.json notes what deploying with {' / '.join(later)} needs")
    if cfg.engine in deploy and deploy[cfg.engine]["problems"]:
        raise BenchmarkError(
            f"error: preflight for benchmark.engine {cfg.engine}:\n  "
            + "\n  ".join(deploy[cfg.engine]["problems"])
        )
    if not engine_named(cfg.engine).served:
        problems = check_draft(card, read_draft_facts(draft_dir), cfg.engine)
        if problems:
            raise BenchmarkError("error: preflight for the draft:\n  " + "\n  ".join(problems))
    return deploy
