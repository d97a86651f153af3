"""params.yaml `benchmark`: the engine, the load levels and the servers of baseline against
speculative decoding."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import field_validator, model_validator

from draftline.benchmark.engine_kinds import engine_served
from draftline.core.config import (
    TIE_TOLERANCE,
    Port,
    Section,
    TargetPlacement,
    operational,
    shaping,
)
from draftline.core.errors import DraftlineError
from draftline.draft.free import DEFAULT_FREE, UnknownFreeMethod, free_method


class BenchmarkError(DraftlineError):
    """The benchmark cannot run as configured (the draft, an endpoint, the eval prompts); the
    message, "error: " included, is what the user reads."""


class VllmBenchConfig(Section):
    # what starts the server, the target path after it (as `vllm serve`); null = engines.vllm
    launcher: list[str] | None = operational(None)
    # speculative_config.method; null = what the draft's method is served as (eagle3 for EAGLE-3,
    # eagle3 with parallel_drafting for P-EAGLE, dflash for DFlash); preflight refuses another
    method: str | None = shaping(None)
    speculative_config: dict[str, int | float | str | bool] = shaping(
        {}
    )  # merged in, e.g. draft_tensor_parallel_size
    # extra arguments of every server, e.g. ["--tensor-parallel-size", "8"]; the default is the CPU
    # default run's (float32 as evaluate; no torch.compile, which costs more than a few requests)
    args: list[str] = shaping(["--dtype", "float32", "--enforce-eager"])
    # VLLM_CPU_KVCACHE_SPACE (GiB) of each benchmark server on vLLM's CPU build, unless the
    # environment sets it: sized for the benchmark's requests, so that every server of the sweep
    # fits beside the others (engines.vllm's is for regeneration); GPU builds ignore it
    cpu_kvcache_space_gb: float = shaping(1, gt=0)


class SglangBenchConfig(Section):
    launcher: list[str] = operational(["python3", "-m", "sglang.launch_server"])
    algorithm: str = shaping(
        "EAGLE3"
    )  # --speculative-algorithm; preflight refuses anything but EAGLE3
    # SGLang loads EAGLE-3 drafts in the LlamaForCausalLMEagle3 layout, not the speculators one:
    # null = the trained draft (refused by preflight), else a copy in that layout.
    draft_model_path: str | None = shaping(None)
    num_steps: int | None = shaping(None, ge=1)  # --speculative-num-steps; null = k
    eagle_topk: int = shaping(1, ge=1)  # --speculative-eagle-topk; 1 = a chain, like the hf engine
    num_draft_tokens: int | None = shaping(None, ge=2)  # null = num_steps + 1 for a chain
    args: list[str] = shaping([])

    @model_validator(mode="after")
    def _chain_tokens(self):
        # SGLang silently resets num_draft_tokens to num_steps + 1 when topk is 1
        if (
            self.eagle_topk == 1
            and self.num_draft_tokens is not None
            and self.num_steps is not None
            and self.num_draft_tokens != self.num_steps + 1
        ):
            raise ValueError("num_draft_tokens must be num_steps + 1 when eagle_topk is 1")
        return self


class FreeBenchConfig(Section):
    """One method of benchmark.free: served with no draft at one k (draftline/draft/free.py)."""

    # draft tokens per step of its one server (vLLM num_speculative_tokens)
    k: int = shaping(2, ge=1)
    # its own fields of vLLM's speculative_config over the method's defaults (free.py lists them:
    # ngram's prompt_lookup_min / prompt_lookup_max, suffix's suffix_decoding_*)
    speculative_config: dict[str, int | float] = shaping({})


class BenchmarkConfig(TargetPlacement):
    # hf: built-in decoder, CPU or GPUs. vllm / sglang: a baseline server and a speculative
    # server, started one after the other, driven by the async load generator.
    # (the registered ones: draftline/benchmark/engine_kinds.py)
    engine: str = shaping("vllm")
    # draft tokens per step (vLLM num_speculative_tokens, SGLang num_steps): one speculative
    # server per k (a single int is a list of one); the verdict picks the best k at each load
    k: list[int] = shaping([1, 2, 3])
    max_new_tokens: int = shaping(64, ge=1)
    prompts: int = shaping(12, ge=1)  # eval prompts used
    warmup: int = shaping(
        1, ge=0
    )  # hf: untimed passes; servers: passes over the prompts before measuring
    # the budget of rounds of timed passes: in each, every server once at every load (hf: the
    # baseline and each k once); each speculative pass paired with a baseline pass gives one ratio
    # of the interval. Served engines look at the passes after min_rounds rounds, then every
    # look_every rounds, and stop at the first look where every load's decision and k are settled
    # (draftline/benchmark/intervals.py: the confidence is split over the planned looks)
    repeats: int = shaping(12, ge=1)
    min_rounds: int = shaping(8, ge=2)  # rounds before the first look (at most repeats)
    look_every: int = shaping(4, ge=1)  # rounds between looks
    # seconds of timed rounds per group of servers: no look is planned past it (null: rounds only)
    budget_s: float | None = shaping(None, gt=0)
    # servers: a timed pass lasts at least this long, cycling the prompts (0: one request per
    # prompt or 4 per request in flight, whichever is more)
    min_pass_s: float = shaping(1.0, ge=0)
    # servers side by side, each round in shuffled order (side_by_side; separate_gpus: each on its
    # share of the GPUs), or one at a time with the baseline before and after (sequential); auto:
    # side_by_side without a GPU or with servers already running, else sequential
    layout: Literal["auto", "side_by_side", "separate_gpus", "sequential"] = shaping("auto")
    # side_by_side: at most this many servers up at once (the baseline stays up; the speculative
    # servers run in groups of max_servers - 1, each group its own rounds); null: as many as the
    # host's memory holds, measured on the baseline server (draftline/benchmark/server.py)
    max_servers: int | None = shaping(None, ge=2)
    seed: int = shaping(0)  # the shuffled order of the servers in each round
    # the confidence shared by every interval of the schedule: each k and each pair of ks at every
    # load and every planned look (Bonferroni; draftline/benchmark/intervals.py)
    confidence: float = shaping(0.9, gt=0, lt=1)
    # a larger k is deployed only where it beats a smaller one by more than this (the paired
    # interval of log(k'/k) above log(1 + k_margin)); fixed before any run, at most 5%
    k_margin: float = shaping(0.05, ge=0, le=0.05)
    # a load whose every interval lies below 1 or within [1/(1+margin), 1+margin] is settled as no
    # gain worth deploying (deployed as undecided_k); at most 5%
    margin: float = shaping(0.05, gt=0, le=0.05)
    # k deployed at a load whose decision is undecided (0: no speculation there)
    undecided_k: int = shaping(0, ge=0)
    # the largest batch deploy.json's k_per_batch_size covers: past the largest load measured it
    # deploys undecided_k (vLLM would carry the last measured k on to every larger batch)
    max_batch_size: int = shaping(1024, ge=1)
    # other drafts served against the same baseline in the same run, {name: draft dir}, each at
    # compare_k (null: at k); each under drafts/, a dep of the stage (a changed draft reruns it)
    compare: dict[str, str] = shaping({})
    compare_k: list[int] | None = shaping(None)
    # speculation that needs no trained draft, {method: {k, speculative_config}}: one server each,
    # beside the draft's against the same baseline; the verdict says per load whether the draft
    # beats it (paired interval) and deploy.json names the better one. Registered methods:
    # draftline/draft/free.py (ngram; suffix where arctic-inference installs). Measured by the
    # engines that serve it (vLLM); another engine's report says it was not measured
    free: dict[str, FreeBenchConfig] = shaping(DEFAULT_FREE, validate_default=True)
    # device, device_map, dtype (TargetPlacement): hf only
    concurrency: list[int] = shaping([1, 4, 16])  # servers: requests in flight, one load level each
    # the load the draft will be served at (requests in flight): the verdict's headline is the
    # speedup there; one of `concurrency` (engine hf decodes one request at a time: its verdict is
    # for 1 request in flight and says so)
    serve_concurrency: int = shaping(4, ge=1)
    # lossless gate: the share of speculative outputs (every request at every k and load) that may
    # differ from the baseline's greedy output, other than at a near-tie, before the stage fails
    # (after writing its report)
    max_output_mismatch_share: float = shaping(0.0, ge=0, le=1)
    # logit gap under which a divergence at the baseline's top-two is a near-tie, not a mismatch;
    # null = by the servers' dtype (benchmark.dtype, core/config.TIE_TOLERANCE)
    tie_tolerance: float | None = shaping(None, ge=0)
    # the speedups the verdict says what it would take to reach (1.0 = break-even)
    speedup_goals: list[float] = shaping([1.0, 1.2])
    requests_per_level: int | None = shaping(None, ge=1)  # null = max(prompts, 4 x concurrency)
    host: str = operational("127.0.0.1")
    port: Port = operational(
        None
    )  # the first server's; side by side the i-th has port + i; null = a free port chosen at each start
    startup_timeout_s: float | None = operational(
        None, gt=0
    )  # null = from the checkpoint size (as regenerate)
    request_timeout_s: float = operational(600, gt=0)
    vllm: VllmBenchConfig = shaping(VllmBenchConfig())
    sglang: SglangBenchConfig = shaping(SglangBenchConfig())
    # vllm / sglang: servers already running, {baseline: URL, speculative: URL}, used instead of
    # launching them (each preflighted: the card's target; no draft / this draft with EAGLE3)
    endpoints: dict[Literal["baseline", "speculative"], str] = operational({})

    @field_validator("engine")
    @classmethod
    def _registered_engine(cls, engine: str) -> str:
        engine_served(engine)  # UnknownEngine names the registered ones
        return engine

    @field_validator("k", mode="before")
    @classmethod
    def _k_list(cls, value):
        return [value] if isinstance(value, int) else value

    @model_validator(mode="after")
    def _levels(self):
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError("concurrency: give at least one level, each >= 1")
        if len(set(self.concurrency)) != len(self.concurrency):
            raise ValueError(f"concurrency: {self.concurrency} repeats a level")
        if not self.k or min(self.k) < 1 or len(set(self.k)) != len(self.k):
            raise ValueError(f"k: give distinct draft token counts, each >= 1 (got {self.k})")
        served = engine_served(self.engine)
        if served and self.serve_concurrency not in self.concurrency:
            raise ValueError(
                f"serve_concurrency {self.serve_concurrency} is not one of concurrency "
                f"{self.concurrency}: the verdict's headline is measured, not interpolated; "
                "add it to concurrency"
            )
        if "speculative" in self.endpoints and len(self.k) != 1:
            raise ValueError(
                f"k: a running speculative server (endpoints.speculative) serves one k; give the "
                f"one it was started with, not {self.k}"
            )
        if not self.speedup_goals or min(self.speedup_goals) <= 0:
            raise ValueError("speedup_goals: give at least one speedup, each > 0")
        for name, path in self.compare.items():
            parts = Path(path).parts
            if Path(path).is_absolute() or not parts or parts[0] != "drafts" or ".." in parts:
                raise ValueError(
                    f"compare: {name}: {path} is not under drafts/: put (copy) the draft there, "
                    "where the benchmark stage sees it change (drafts/README.md)"
                )
        if self.compare and not served:
            raise ValueError(
                f"compare: only for a served engine (drafts served side by side), not {self.engine}"
            )
        if self.max_batch_size < max(self.concurrency):
            raise ValueError(
                f"max_batch_size {self.max_batch_size} is below the largest load measured "
                f"({max(self.concurrency)})"
            )
        for name, settings in self.free.items():
            try:
                method = free_method(name)
            except UnknownFreeMethod as err:
                raise ValueError(f"free: {err}") from None
            if problems := method.problems(settings.speculative_config):
                raise ValueError(f"free: {name}: " + "; ".join(problems))
        if both := sorted(set(self.free) & set(self.compare)):
            raise ValueError(f"compare: {', '.join(both)} also named in free: rename the draft")
        if self.undecided_k and self.undecided_k not in self.k:
            raise ValueError(f"undecided_k: {self.undecided_k} is not one of k {self.k} (or 0)")
        if self.endpoints and not served:
            raise ValueError(f"endpoints: only for a served engine, not {self.engine}")
        for url in self.endpoints.values():
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"endpoints: {url!r} is not an http(s) base URL")
        return self

    @property
    def looks(self) -> list[int]:
        """The rounds after which a served engine's sweep looks at its passes: min_rounds (at most
        repeats), then every look_every rounds, and repeats last; the engine hf runs every round
        and looks once."""
        first = min(self.min_rounds, self.repeats)
        return sorted({*range(first, self.repeats, self.look_every), self.repeats})

    @property
    def ks(self) -> list[int]:
        """The k values in increasing order."""
        return sorted(self.k)

    @property
    def measured_free(self) -> dict[str, FreeBenchConfig]:
        """The benchmark.free methods this run's engine serves (the others are reported as not
        measured); none beside servers already running (benchmark.endpoints): a server launched
        here would not share their host."""
        if self.endpoints:
            return {}
        return {
            name: settings
            for name, settings in sorted(self.free.items())
            if self.engine in free_method(name).engines
        }

    @property
    def compare_ks(self) -> list[int]:
        """The k values each benchmark.compare draft is served at."""
        return sorted(self.compare_k or self.k)

    def resolved_tie_tolerance(self) -> float:
        return TIE_TOLERANCE[self.dtype] if self.tie_tolerance is None else self.tie_tolerance
