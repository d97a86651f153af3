"""The benchmark's engines, one registered class each, behind two contracts: a served engine
(vLLM, SGLang: its serve command, the endpoint the load generator drives, the acceptance counters
it reports, the settings it refuses for a draft) and the local decoder (hf, the built-in one: it
runs the sweep in this process). The benchmark asks `engine_named(benchmark.engine)`; no other
module of it compares an engine's name.
"""

from __future__ import annotations

import json
import os
import urllib.request
from typing import TYPE_CHECKING, ClassVar, Protocol

from draftline.benchmark.engine_kinds import SERVED, forget_kind, register_kind
from draftline.benchmark.hf import benchmark_hf
from draftline.benchmark.spec_metrics import (
    add_counters,
    sglang_acceptance,
    vllm_acceptance,
    vllm_spec_counters,
)
from draftline.benchmark.sweep import Sweep
from draftline.draft.checkpoint import draft_method, load_draft
from draftline.draft.free import free_method
from draftline.draft.methods import drafter, serving, titles
from draftline.engines.commands import SpeculativeDraft
from draftline.engines.probes import EngineProbe, engine_probe
from draftline.evaluate.acceptance import eos_ids
from draftline.targets.model import load_target
from draftline.tokens.chat import first_turn_ids

if TYPE_CHECKING:
    from draftline.benchmark.config import BenchmarkConfig
    from draftline.benchmark.loadgen import LoadTarget
    from draftline.benchmark.rounds import ServerRun
    from draftline.core.card import TargetCard
    from draftline.draft.checkpoint import DraftFacts


def http_get(url: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()


class ServedEngine(Protocol):
    """An engine the benchmark launches (or reaches at benchmark.endpoints) as an HTTP server."""

    name: str
    served: bool  # True: a server, driven over HTTP
    # the engine draftline/engines/commands.py spells its command line as (every engine's flags
    # side by side there)
    spelled_as: str
    exports: bool  # it serves a copy of the draft in its own layout (made by the stage)
    # its acceptance counters are server-wide, read between passes (else per request)
    server_counters: bool
    no_counters: str  # where its acceptance counters were looked for, when none were
    probe: EngineProbe  # how a running server of benchmark.endpoints is checked (engines/probes.py)

    def launcher(self, cfg: BenchmarkConfig) -> tuple[str, list[str]]:
        """(benchmark.<engine>.launcher, its args)."""

    def draft(
        self, cfg: BenchmarkConfig, draft_path: str, k: int, k_per_batch_size: list | None
    ) -> SpeculativeDraft:
        """The speculative part of its serve command, drafting k tokens per step."""

    def free_draft(self, cfg: BenchmarkConfig, method: str, k: int) -> SpeculativeDraft:
        """The speculative part of its serve command for a method that needs no trained draft
        (benchmark.free, draftline/draft/free.py), drafting k tokens per step; NoServer where
        it serves none."""

    def given_draft(self, cfg: BenchmarkConfig) -> str | None:
        """A draft directory its params name to serve instead of the stage's."""

    def algorithm(self, cfg: BenchmarkConfig) -> str | None:
        """The speculative algorithm a running server of benchmark.endpoints must report."""

    def launch_env(self, cfg: BenchmarkConfig) -> dict[str, str]:
        """Environment its launched servers need beyond the engines' own (launch_env)."""

    def endpoint(self, base_url: str, top_logprobs: int = 0) -> LoadTarget:
        """What the load generator sends requests to."""

    def counters(self, base_url: str) -> dict | None:
        """Its server-wide acceptance counters now (None: none on its metrics); asked only of
        an engine with server_counters."""

    def acceptance(self, run: ServerRun, c: int | None) -> dict | None:
        """A server's acceptance at load c (None: over every load)."""

    def check_settings(self, cfg: BenchmarkConfig, facts: DraftFacts) -> list[str]:
        """Its settings that would serve the draft other than its method was trained to run."""


class LocalDecoder(Protocol):
    """The engine that decodes in the benchmark's own process (no server, no deployment)."""

    name: str
    served: bool  # False

    def benchmark(
        self, cfg: BenchmarkConfig, card: TargetCard, draft_dir: str, rows: list
    ) -> Sweep:
        """One level, at one request at a time, as the served engines' sweeps give theirs."""


class Vllm:
    name: ClassVar[str] = "vllm"
    served = True
    spelled_as = "vllm"
    exports = False
    server_counters = True
    no_counters = "no spec_decode counters on /metrics"
    probe = engine_probe("vllm")

    def launcher(self, cfg: BenchmarkConfig) -> tuple[str, list[str]]:
        return cfg.vllm.launcher, cfg.vllm.args

    def draft(
        self, cfg: BenchmarkConfig, draft_path: str, k: int, k_per_batch_size: list | None
    ) -> SpeculativeDraft:
        schedule = (
            {"num_speculative_tokens_per_batch_size": k_per_batch_size} if k_per_batch_size else {}
        )
        served = draft_method(draft_path).vllm_speculative()
        method = cfg.vllm.method or served.pop("method")
        served.pop("method", None)
        extra = {**served, **schedule, **cfg.vllm.speculative_config}
        return SpeculativeDraft(draft_path, method, k, vllm_config=extra)

    def free_draft(self, cfg: BenchmarkConfig, method: str, k: int) -> SpeculativeDraft:
        """No draft model: the method's speculative_config (its defaults, then benchmark.free's)."""
        settings = cfg.free[method].speculative_config if method in cfg.free else {}
        spec = free_method(method).vllm_speculative(k, settings)
        return SpeculativeDraft(
            None, spec.pop("method"), spec.pop("num_speculative_tokens"), vllm_config=spec
        )

    def given_draft(self, cfg: BenchmarkConfig) -> str | None:
        return None

    def algorithm(self, cfg: BenchmarkConfig) -> str | None:
        return cfg.vllm.method

    def launch_env(self, cfg: BenchmarkConfig) -> dict[str, str]:
        """vLLM's CPU build sizes its KV cache from the environment (unless the caller did)."""
        if "VLLM_CPU_KVCACHE_SPACE" in os.environ:
            return {}
        return {"VLLM_CPU_KVCACHE_SPACE": f"{cfg.vllm.cpu_kvcache_space_gb:g}"}

    def endpoint(self, base_url: str, top_logprobs: int = 0) -> LoadTarget:
        from draftline.benchmark.loadgen import LoadTarget

        models = json.loads(http_get(f"{base_url}/v1/models"))["data"]
        return LoadTarget(
            base_url,
            "openai-completions",
            model=models[0]["id"],
            stream_options=True,
            token_ids=True,
            top_logprobs=top_logprobs,
        )

    def counters(self, base_url: str) -> dict | None:
        return vllm_spec_counters(http_get(f"{base_url}/metrics"))

    def acceptance(self, run: ServerRun, c: int | None) -> dict | None:
        counters = None
        for load, summed in run.counters.items():
            if c is None or load == c:
                counters = add_counters(counters, summed)
        return vllm_acceptance(None, counters)

    def check_settings(self, cfg: BenchmarkConfig, facts: DraftFacts) -> list[str]:
        """vLLM's speculative config must serve the draft as its method is served (the drafter's
        vllm_speculative, draftline/draft/methods/), with the method's own settings, and ask no
        more parallel tokens than a parallel draft was trained for."""
        method = drafter(facts.algorithm)
        served = method.vllm_speculative()
        problems = []
        if cfg.vllm.method is not None and cfg.vllm.method.lower() != served["method"]:
            problems.append(
                f"benchmark.vllm.method: {cfg.vllm.method!r} for a {method.name} draft; it must be "
                f"{served['method']!r} or null ({method.vllm_reason})"
            )
        problems += method.vllm_problems(cfg)
        if method.parallel and facts.speculative_tokens and max(cfg.k) > facts.speculative_tokens:
            problems.append(
                f"benchmark.k: {max(cfg.k)} draft tokens, but the {method.name} draft {facts.path} "
                f"drafts at most {facts.speculative_tokens} in one forward (its trained positions)"
            )
        return problems


class Sglang:
    name: ClassVar[str] = "sglang"
    served = True
    spelled_as = "sglang"
    exports = True  # from draftline export-sglang's layout (draftline/draft/sglang_export.py)
    server_counters = False  # spec_verify_ct in each request's meta_info
    no_counters = "no spec_verify_ct in meta_info"
    probe = engine_probe("sglang")

    def launcher(self, cfg: BenchmarkConfig) -> tuple[str, list[str]]:
        return cfg.sglang.launcher, cfg.sglang.args

    def draft(
        self, cfg: BenchmarkConfig, draft_path: str, k: int, k_per_batch_size: list | None
    ) -> SpeculativeDraft:
        """benchmark.sglang.num_steps, when set, wins over k."""
        sg = cfg.sglang
        return SpeculativeDraft(
            draft_path, sg.algorithm, sg.num_steps or k, sg.eagle_topk, sg.num_draft_tokens
        )

    def free_draft(self, cfg: BenchmarkConfig, method: str, k: int) -> SpeculativeDraft:
        raise NoServer(f"benchmark.engine sglang: free method {method!r} is not served here")

    def given_draft(self, cfg: BenchmarkConfig) -> str | None:
        return cfg.sglang.draft_model_path

    def algorithm(self, cfg: BenchmarkConfig) -> str | None:
        return cfg.sglang.algorithm

    def launch_env(self, cfg: BenchmarkConfig) -> dict[str, str]:
        return {}

    def endpoint(self, base_url: str, top_logprobs: int = 0) -> LoadTarget:
        from draftline.benchmark.loadgen import LoadTarget

        return LoadTarget(base_url, "sglang-generate", top_logprobs=top_logprobs)

    def acceptance(self, run: ServerRun, c: int | None) -> dict | None:
        metas = [
            r.meta_info for p in run.passes if c is None or p.c == c for r in p.results if r.ok
        ]
        return sglang_acceptance(metas)

    def check_settings(self, cfg: BenchmarkConfig, facts: DraftFacts) -> list[str]:
        """SGLang runs EAGLE-3 drafts only with its EAGLE3 algorithm, from the original layout."""
        if not drafter(facts.algorithm).sglang:
            return [
                f"benchmark.engine sglang: a {facts.algorithm} draft; this pipeline serves those "
                f"through vLLM (benchmark.engine: vllm), SGLang only {titles(serving('sglang'))} drafts"
            ]
        problems = []
        if cfg.sglang.algorithm.upper() != "EAGLE3":
            problems.append(
                f"benchmark.sglang.algorithm: {cfg.sglang.algorithm!r} for an EAGLE-3 draft; it must be "
                "'EAGLE3' (with 'EAGLE' the aux hidden states are not captured and acceptance collapses)"
            )
        if facts.layout == "speculators":
            problems.append(
                f"{facts.path} is a speculators checkpoint ({', '.join(facts.architectures) or 'no architectures'}); "
                "SGLang picks the draft class from config.json architectures (LlamaForCausalLMEagle3) and "
                "loads EAGLE-3 drafts in that layout: the benchmark stage exports a draft trained with "
                "train.architecture: eagle3 itself (draftline export-sglang makes a lasting copy), "
                "or set benchmark.sglang.draft_model_path to such a copy"
            )
        return problems


class Hf:
    name: ClassVar[str] = "hf"
    served = False

    def benchmark(
        self, cfg: BenchmarkConfig, card: TargetCard, draft_dir: str, rows: list
    ) -> Sweep:
        """The built-in baseline and speculative decoders at each k (draftline/benchmark/hf.py)."""
        # each engine's code loads only when it runs: torch for hf, numpy and rich for the servers
        import torch

        device = cfg.resolved_device()
        target, tokenizer = load_target(card, device, getattr(torch, cfg.dtype), cfg.device_map)
        draft = load_draft(draft_dir, card, device)
        prompts = [first_turn_ids(tokenizer, row) for row in rows]
        eos = eos_ids(tokenizer, target)
        level = benchmark_hf(target, draft, card.aux_ids, prompts, eos, cfg)
        acceptance = {k: s["acceptance_length"] for k, s in level.speculative.items()}
        return Sweep({1: level}, acceptance, {"layout": "one request at a time, modes interleaved"})


# every benchmark.engine, the served ones in the order deploy.json lists them
ENGINES: dict[str, ServedEngine | LocalDecoder] = {e.name: e for e in (Vllm(), Sglang(), Hf())}
if {name: e.served for name, e in ENGINES.items()} != SERVED:
    raise ImportError(f"engine_kinds.SERVED {SERVED} is not the engines registered {list(ENGINES)}")


def register(engine: ServedEngine | LocalDecoder) -> None:
    """Add an engine: benchmark.engine may name it from then on (engine_kinds learns it too)."""
    ENGINES[engine.name] = engine
    register_kind(engine.name, engine.served)


def unregister(name: str) -> None:
    ENGINES.pop(name, None)
    forget_kind(name)


class NoServer(ValueError):
    """A served engine's hook asked of one that serves nothing (the message names it)."""


def engine_named(name: str) -> ServedEngine | LocalDecoder:
    """The engine benchmark.engine names (the params schema allows only these)."""
    return ENGINES[name]


def served_engine(name: str) -> ServedEngine:
    """The served engine `name`; NoServer for one that runs no server."""
    engine = ENGINES.get(name)
    if engine is None or not engine.served:
        raise NoServer(f"benchmark.engine: no server command for engine {name!r}")
    return engine


def served_engines() -> list[ServedEngine]:
    """Every served engine, each with a deployment command in deploy.json."""
    return [e for e in ENGINES.values() if e.served]
