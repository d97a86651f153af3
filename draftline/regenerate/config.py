"""params.yaml `regenerate`: the engine that answers, how it is asked and sampled, and the limits
of a run (partitions, timeouts, retries, the degenerate-run checks)."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from draftline.core.config import Port, Section, operational, shaping
from draftline.core.errors import DraftlineError


class RegenerateError(DraftlineError):
    """What stops a regenerate run or the conversations tools; the message says why and what
    to do."""


class RegeneratePartition(Section):
    """Limits for one prompt partition (`mix` tags each prompt short or long)."""

    concurrency: int = operational(32, ge=1)  # conversations in flight at once
    # prompt + answer tokens of one request, counted with the target's chat template: a turn whose
    # prompt does not fit ends the conversation, max_tokens is cut to what is left; null = no limit
    max_context: int | None = shaping(None, ge=16)


class TemperatureChoice(Section):
    value: float = shaping(ge=0)
    weight: float = shaping(gt=0)


class HfBatchConfig(Section):
    """regenerate.backend: hf — draftline.engines.batch_server: greedy batched decoding, streamed, behind
    the OpenAI-compatible API (CPU, or one GPU for a small target)."""

    max_batch: int = operational(
        32, ge=1
    )  # requests decoded together; the partitions' concurrency keeps it fed
    # with nothing decoding, how long to wait after the first request for more to prefill with it
    gather_ms: float = operational(20, ge=0)
    tie_tolerance: float = operational(
        1e-4, ge=0
    )  # top-two logit margin below which a token counts as a near-tie
    threads: int | None = operational(
        None, ge=1
    )  # torch intra-op threads of the server; null = the stage's policy


class RegenerateConfig(Section):
    # transformers | vllm | sglang | hf (draftline.engines.batch_server, greedy batches: the fast one on CPU):
    # the stage starts that server on the target and stops it after;
    # external: OpenAI-compatible servers run elsewhere, listed in `endpoints`.
    backend: Literal["transformers", "vllm", "sglang", "hf", "external"] = operational("hf")
    host: str = operational("127.0.0.1")
    port: Port = operational(None)  # null = a free port chosen at start
    endpoints: list[str] = operational(
        []
    )  # external: base URLs (http://host:port), balanced by outstanding requests
    # what serves `endpoints`; decides the non-speculative check of the preflight and what the
    # requests ask for (hf: a `draftline batch-server` run by you: token ids, usage, streaming)
    external_engine: Literal["vllm", "sglang", "transformers", "hf"] | None = operational(None)
    served_model_name: str | None = operational(
        None
    )  # model name in requests; null = the card's model string
    api_key_env: str | None = operational(
        None
    )  # environment variable holding the endpoints' API key, if any
    # launched vllm / sglang (each data-parallel replica is one engine behind the same port)
    tensor_parallel_size: int = operational(1, ge=1)
    data_parallel_size: int = operational(1, ge=1)
    max_model_len: int | None = operational(
        None, ge=16
    )  # vLLM --max-model-len, SGLang --context-length
    # the parsers shape how answers are recorded (for backend external: say what the servers run)
    reasoning_parser: str | None = shaping(
        None
    )  # e.g. qwen3, deepseek_r1: reasoning comes back separately
    tool_call_parser: str | None = shaping(
        None
    )  # e.g. hermes, qwen25: tool calls come back structured
    extra_args: list[str] = operational(
        []
    )  # appended to the launch command as given; recorded per line
    # launched transformers serve (see engines/commands.py for why continuous batching is off)
    continuous_batching: bool = operational(False)
    cb_num_blocks: int = operational(16, ge=1)  # KV-cache blocks when continuous batching is on
    hf: HfBatchConfig = operational(HfBatchConfig())  # backend hf
    short: RegeneratePartition = shaping(RegeneratePartition(concurrency=32))
    long: RegeneratePartition = shaping(RegeneratePartition(concurrency=4))
    # sampling
    max_tokens: int = shaping(96, ge=1)  # per assistant turn
    temperature: float = shaping(0.0, ge=0)
    # when given: each conversation draws its temperature from these (seeded by `seed` and its id)
    temperatures: list[TemperatureChoice] = shaping([])
    top_p: float = shaping(1.0, gt=0, le=1)
    seed: int | None = shaping(0)  # request seed = hash(seed, prompt id); null = no seed sent
    # passed to the chat template on the server and in the local token counts (enable_thinking...)
    chat_template_kwargs: dict[str, bool | int | float | str | list | dict | None] = shaping({})
    # robustness
    # server start-up limit; null = 300 s + 4 s per GB of checkpoint on disk (serving.startup_timeout_s)
    startup_timeout_s: float | None = operational(None, gt=0)
    # requests one endpoint runs at once; more in flight would only wait in its queue. null = known
    # for a launched server (transformers serve: 1; hf: hf.max_batch; vllm/sglang: --max-num-seqs /
    # --max-running-requests of extra_args, else no bound beyond the partitions' concurrency) and for
    # an external transformers serve (1); give it for continuous batching or an external vllm/sglang
    server_slots: int | None = operational(None, ge=1)
    # answers are streamed: a request is retried when its first token takes longer than this from
    # sending (prefill; the server runs it at once, see server_slots)...
    first_token_timeout_s: float = operational(120, gt=0)
    token_timeout_s: float = operational(
        30, gt=0
    )  # ...or when the next token takes longer than this
    progress_every_s: float = operational(30, gt=0)  # a progress line this often, whatever happens
    max_retries: int = operational(
        3, ge=0
    )  # retries of a request after 429, 5xx, timeout, lost connection
    retry_backoff_s: float = operational(1.0, gt=0)  # first wait; doubles each retry, with jitter
    retry_backoff_max_s: float = operational(30, gt=0)
    max_failure_rate: float = operational(
        0.05, ge=0, le=1
    )  # the stage fails above this share of sent prompts
    # the stage fails when more of the answers (assistant turns of every conversation kept, this
    # run's and earlier ones') ended at max_tokens (finish_reason "length"): the data would hold
    # beginnings of answers, no endings; 1.0 turns the check off
    max_length_share: float = operational(0.75, ge=0, le=1)

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, raw):
        if isinstance(raw, dict) and "request_timeout_s" in raw:
            raise ValueError(
                "request_timeout_s: replaced by first_token_timeout_s (from sending to the first "
                "streamed token) and token_timeout_s (between tokens); answers are streamed"
            )
        return raw

    @model_validator(mode="after")
    def _backend_options(self):
        launched = self.backend != "external"
        if launched and self.endpoints:
            raise ValueError(
                "regenerate.endpoints: only for backend external (a launched server has one endpoint)"
            )
        if not launched and not self.endpoints:
            raise ValueError("regenerate.endpoints: backend external needs at least one base URL")
        if not launched and self.external_engine is None:
            raise ValueError(
                "regenerate.external_engine: say what serves the endpoints (vllm, sglang, transformers or "
                "hf, a `draftline batch-server`), "
                "so the preflight can check it is not speculative"
            )
        for url in self.endpoints:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"regenerate.endpoints: {url!r} is not an http(s) base URL")
        if self.backend in ("transformers", "hf"):
            for key in ("reasoning_parser", "tool_call_parser", "max_model_len"):
                if getattr(self, key) is not None:
                    raise ValueError(
                        f"regenerate.{key}: a vllm/sglang launch option; transformers serve picks its parser by model type"
                    )
            if self.tensor_parallel_size != 1 or self.data_parallel_size != 1:
                raise ValueError(
                    "regenerate.tensor_parallel_size/data_parallel_size: transformers serve runs one process"
                )
            if self.served_model_name is not None:
                raise ValueError(
                    "regenerate.served_model_name: transformers serve answers only to the model string it was started with"
                )
        for arg in self.extra_args:
            if arg.startswith("--spec"):
                raise ValueError(
                    f"regenerate.extra_args: {arg!r} would attach a draft; regeneration needs the plain target"
                )
        if self.temperatures and self.temperature != 0:
            raise ValueError(
                "regenerate.temperatures: set either temperature or temperatures, not both"
            )
        if self.backend == "hf" and (self.temperature > 0 or self.temperatures):
            raise ValueError(
                "regenerate.temperature: backend hf decodes greedily; use temperature 0 (or backend "
                "transformers / vllm / sglang to sample)"
            )
        return self
