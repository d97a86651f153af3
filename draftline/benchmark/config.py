"""params.yaml `benchmark`: the engine, the load levels and the servers of baseline against
speculative decoding."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from draftline.core.config import Port, Section, TargetPlacement, operational, shaping


class VllmBenchConfig(Section):
    # what starts the server, the target path after it (as `vllm serve`); null = engines.vllm
    launcher: list[str] | None = operational(None)
    method: str = shaping(
        "eagle3"
    )  # speculative_config.method; preflight refuses anything but eagle3
    speculative_config: dict[str, int | float | str | bool] = shaping(
        {}
    )  # merged in, e.g. draft_tensor_parallel_size
    args: list[str] = shaping(
        []
    )  # extra server arguments for both servers, e.g. ["--tensor-parallel-size", "8"]


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


class BenchmarkConfig(TargetPlacement):
    # hf: built-in decoder, CPU or GPUs. vllm / sglang: a baseline server and a speculative
    # server, started one after the other, driven by the async load generator.
    engine: Literal["hf", "vllm", "sglang"] = shaping("hf")
    k: int = shaping(3, ge=1)  # draft tokens per step (vLLM num_speculative_tokens)
    max_new_tokens: int = shaping(64, ge=1)
    prompts: int = shaping(12, ge=1)  # eval prompts used
    warmup: int = shaping(
        1, ge=0
    )  # hf: untimed passes; servers: passes over the prompts before measuring
    repeats: int = shaping(3, ge=1)  # hf only: timed passes, medians reported
    # device, device_map, dtype (TargetPlacement): hf only
    concurrency: list[int] = shaping(
        [1, 8, 32, 128]
    )  # servers: requests in flight, one load level each
    requests_per_level: int | None = shaping(None, ge=1)  # null = max(prompts, 4 x concurrency)
    host: str = operational("127.0.0.1")
    port: Port = operational(
        None
    )  # both servers, one after the other; null = a free port chosen at each start
    startup_timeout_s: float | None = operational(
        None, gt=0
    )  # null = from the checkpoint size (as regenerate)
    request_timeout_s: float = operational(600, gt=0)
    vllm: VllmBenchConfig = shaping(VllmBenchConfig())
    sglang: SglangBenchConfig = shaping(SglangBenchConfig())
    # vllm / sglang: servers already running, {baseline: URL, speculative: URL}, used instead of
    # launching them (each preflighted: the card's target; no draft / this draft with EAGLE3)
    endpoints: dict[Literal["baseline", "speculative"], str] = operational({})

    @model_validator(mode="after")
    def _levels(self):
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError("concurrency: give at least one level, each >= 1")
        if self.endpoints and self.engine == "hf":
            raise ValueError("endpoints: only for engine vllm or sglang")
        for url in self.endpoints.values():
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"endpoints: {url!r} is not an http(s) base URL")
        return self
