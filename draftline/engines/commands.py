"""Every engine's server command line, side by side (argv lists, never run through a shell).

Regeneration serves the plain target with one of (flags as each engine's argument parser defines them):

- `transformers serve MODEL` (transformers 5.x): naming the model preloads it (the port opens once
  it is loaded) and pins the server to it: a request naming another model gets HTTP 400.
- the built-in batch server (draftline/engines/batch_server.py): greedy batches of the requests in flight.
- `vllm serve MODEL`: `--served-model-name`, `--tensor-parallel-size`, `--data-parallel-size`,
  `--max-model-len`, `--reasoning-parser`, `--enable-auto-tool-choice --tool-call-parser`
  (vllm/engine/arg_utils.py, vllm/entrypoints/openai/cli_args.py).
- `python -m sglang.launch_server --model-path MODEL`: `--served-model-name`, `--tp-size`,
  `--dp-size`, `--context-length`, `--reasoning-parser`, `--tool-call-parser`
  (python/sglang/srt/server_args.py).

Hidden-state extraction launches `vllm serve` with the `extract_hidden_states` speculative method
and an hs-connectors kv-transfer config, driven by speculators' `generate-offline-data` client.
The benchmark launches vLLM or SGLang as the baseline (no draft) or with the EAGLE-3 draft; the
same commands, without a port, are the deployment commands.

Each builder takes one settings object in the engines' terms (ServeSettings, ExtractServe,
EngineServe...); the stages build it from their own params (draftline/regenerate/launch.py,
draftline/benchmark/commands.py, draftline/hidden_states/), so this module knows no phase's config.

Longer than a module here usually is, on purpose: every engine's flags side by side is the point (a flag renamed
in one engine is fixed next to its counterparts in the others).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from draftline.core.errors import DraftlineError
from draftline.engines.config import VllmEngineConfig, vllm_engine

if TYPE_CHECKING:
    from draftline.core.card import TargetCard


class CommandError(DraftlineError, ValueError):
    """A server command that cannot be built as asked (the message names the setting)."""


# ---- regeneration: the plain target ----------------------------------------------------------


@dataclass(frozen=True)
class ServeSettings:
    """A launch of the plain target: what the regeneration commands take of it (the caller's params
    turned into the engines' terms)."""

    model: str
    host: str
    port: int | None  # None: no --port, the engine's default (a command shown, not launched)
    served_name: str | None = None  # vLLM / SGLang --served-model-name; None = the model string
    revision: str | None = None
    trust_remote_code: bool = False
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    max_model_len: int | None = None  # vLLM --max-model-len, SGLang --context-length
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    extra_args: tuple[str, ...] | list[str] = ()  # appended to the command as given


@dataclass(frozen=True)
class BatchSettings:
    """The built-in batch server's own flags (draftline/engines/batch_server.py)."""

    max_batch: int
    gather_ms: float
    tie_tolerance: float
    threads: int | None = None  # torch intra-op threads; None = torch's


def _port_flag(port: int | None) -> list[str]:
    """--port PORT; none for None (the engine's default: a command shown, not launched)."""
    return ["--port", str(port)] if port else []


def transformers_serve_command(
    s: ServeSettings,
    device: str,
    cb_num_blocks: int | None = None,
    chat_template_kwargs: dict | None = None,
) -> list[str]:
    """`transformers serve` pinned to the target; cb_num_blocks turns continuous batching on.

    Continuous batching is off by default: on CPU it was slower than the plain server, sized its KV
    cache from total RAM (one server took 88% of 24 GB), and kept the sampling settings of the
    first request for all later ones. When on, the cache is bounded by --cb-num-blocks.
    chat_template_kwargs become the server's defaults too (every request also carries them).
    """
    exe = Path(sys.executable).with_name("transformers")
    cmd = [str(exe), "serve", s.model, "--device", device, "--host", s.host, *_port_flag(s.port)]
    if s.trust_remote_code:
        cmd.append("--trust-remote-code")
    if chat_template_kwargs:
        cmd += ["--chat-template-kwargs", json.dumps(chat_template_kwargs, sort_keys=True)]
    if cb_num_blocks is not None:
        cmd += ["--continuous-batching", "--cb-num-blocks", str(cb_num_blocks)]
    return cmd + list(s.extra_args)


def hf_batch_serve_command(
    s: ServeSettings,
    batch: BatchSettings,
    stats_file: Path | None,
    module: str,
) -> list[str]:
    """`module` (draftline/regenerate/launch.py HF_BATCH_SERVER) pinned to the target: greedy
    batches of the requests in flight; its stats (batches, near-tie tokens) in stats_file."""
    cmd = [
        sys.executable,
        "-m",
        module,
        s.model,
        "--host",
        s.host,
        *_port_flag(s.port),
        "--max-batch",
        str(batch.max_batch),
        "--gather-ms",
        str(batch.gather_ms),
        "--tie-tolerance",
        str(batch.tie_tolerance),
    ]
    cmd += ["--stats-file", str(stats_file)] if stats_file else []
    cmd += ["--threads", str(batch.threads)] if batch.threads else []
    cmd += ["--trust-remote-code"] if s.trust_remote_code else []
    return cmd + list(s.extra_args)


def transformers_serve_loads(architecture: str, config_model_type: str) -> bool:
    """Whether `transformers serve` can load this target: its model manager (transformers 5.x,
    cli/serving/model_manager.py `_load_model`) takes AutoModelForMultimodalLM for the model types
    registered there and otherwise `getattr(transformers, architectures[0])`, so an architecture
    that ships as the checkpoint's own code cannot be served by it, with or without --trust-remote-code."""
    # transformers loads on first use: command lines are built without it
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES

    return config_model_type in MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES or hasattr(
        transformers, architecture
    )


@dataclass(frozen=True)
class _PlainFlags:
    """One engine's spelling of the flags vLLM and SGLang share for a plain target."""

    tensor_parallel: str
    data_parallel: str
    context_length: str
    tool_call_parser: tuple[str, ...]


VLLM_FLAGS = _PlainFlags(
    "--tensor-parallel-size",
    "--data-parallel-size",
    "--max-model-len",
    # vLLM parses tool calls only with auto tool choice on
    ("--enable-auto-tool-choice", "--tool-call-parser"),
)
SGLANG_FLAGS = _PlainFlags("--tp-size", "--dp-size", "--context-length", ("--tool-call-parser",))


def _plain_target_args(s: ServeSettings, flags: _PlainFlags) -> list[str]:
    """Everything after the model of a plain vLLM or SGLang launch, in `flags`' spelling."""
    cmd = [
        "--host",
        s.host,
        *_port_flag(s.port),
        "--served-model-name",
        s.served_name or s.model,
        flags.tensor_parallel,
        str(s.tensor_parallel_size),
        flags.data_parallel,
        str(s.data_parallel_size),
    ]
    if s.trust_remote_code:
        cmd.append("--trust-remote-code")
    if s.revision:
        cmd += ["--revision", s.revision]
    if s.max_model_len:
        cmd += [flags.context_length, str(s.max_model_len)]
    if s.reasoning_parser:
        cmd += ["--reasoning-parser", s.reasoning_parser]
    if s.tool_call_parser:
        cmd += [*flags.tool_call_parser, s.tool_call_parser]
    return cmd + list(s.extra_args)


def vllm_regenerate_command(s: ServeSettings, engine: VllmEngineConfig | None = None) -> list[str]:
    """`vllm serve` of the plain target; `engine`: the vLLM environment that runs it
    (engines.vllm; None = its defaults)."""
    return [
        *(engine or VllmEngineConfig()).server_argv(s.model),
        *_plain_target_args(s, VLLM_FLAGS),
    ]


def sglang_regenerate_command(s: ServeSettings) -> list[str]:
    """SGLang's server of the plain target."""
    launcher = [sys.executable, "-m", "sglang.launch_server", "--model-path", s.model]
    return [*launcher, *_plain_target_args(s, SGLANG_FLAGS)]


# ---- hidden-state extraction: vLLM and speculators' client ------------------------------------


@dataclass(frozen=True)
class ExtractServe:
    """`vllm serve` set up for hidden-state extraction: the target and the layers it gives, where
    the states go (hs-connectors' `transfer` backend), the server's size."""

    model: str
    revision: str | None
    aux_layer_ids: list[int]
    num_layers: int
    staging_dir: Path | None  # where the file and fp8 connectors write (None for mooncake)
    host: str
    port: int
    dtype: str
    tensor_parallel_size: int
    max_model_len: int
    gpu_memory_utilization: float
    extra_args: list[str]
    transfer: str = "file"  # file | fp8 | mooncake
    mooncake: dict | None = None  # hidden_states.online.mooncake settings, for transfer mooncake
    trust_remote_code: bool = False


def vllm_extract_command(engine: VllmEngineConfig, s: ExtractServe) -> list[str]:
    """`vllm serve` set up for hidden-state extraction, as speculators' scripts/launch_vllm.py does:
    the `extract_hidden_states` speculative method with aux ids + [N] (N = final pre-norm output),
    and the kv-transfer config of hs-connectors' `transfer` backend: file (vLLM's
    ExampleHiddenStatesConnector) or fp8 (FP8HiddenStatesConnector) writing hs files into
    `staging_dir`, or mooncake. `engine`: the vLLM environment that runs it (engines.vllm)."""
    speculative = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {
            "hf_config": {"eagle_aux_hidden_state_layer_ids": [*s.aux_layer_ids, s.num_layers]}
        },
    }
    kv_transfer = kv_transfer_config(s.transfer, s.staging_dir, s.mooncake, engine.is_cpu_build())
    cmd = [
        *engine.server_argv(s.model),
        "--host",
        s.host,
        "--port",
        str(s.port),
        "--dtype",
        s.dtype,
        "--tensor-parallel-size",
        str(s.tensor_parallel_size),
        "--max-model-len",
        str(s.max_model_len),
        "--gpu-memory-utilization",
        str(s.gpu_memory_utilization),
        "--speculative-config",
        json.dumps(speculative),
        "--kv-transfer-config",
        json.dumps(kv_transfer),
    ]
    if s.revision:
        cmd += ["--revision", s.revision]
    if s.trust_remote_code:
        cmd.append("--trust-remote-code")
    return cmd + list(s.extra_args)


def mooncake_args(mooncake: dict) -> argparse.Namespace:
    """hidden_states.online.mooncake as the argparse namespace hs-connectors' MooncakeBackend reads."""
    return argparse.Namespace(
        mooncake_master=mooncake["master"],
        mooncake_metadata_server=mooncake["metadata_server"],
        mooncake_protocol=mooncake["protocol"],
        mooncake_device=mooncake["device"],
        mooncake_global_segment_gib=mooncake["global_segment_gib"],
        mooncake_local_buffer_gib=mooncake["local_buffer_gib"],
        mooncake_writer_threads=mooncake["writer_threads"],
    )


# vLLM's CPU build: the connectors of draftline/hidden_states/vllm_cpu_connector.py (vLLM loads the module; the
# server's PYTHONPATH has this package: engines.vllm env), by hs-connectors transfer
CPU_CONNECTOR_MODULE = "draftline.hidden_states.vllm_cpu_connector"
CPU_CONNECTORS = {"file": "CpuHiddenStatesConnector", "fp8": "CpuFP8HiddenStatesConnector"}


def kv_transfer_config(
    transfer: str, staging_dir: Path | None, mooncake: dict | None = None, cpu_build: bool = False
) -> dict:
    """vLLM's --kv-transfer-config for an hs-connectors backend (file, fp8, mooncake), built by the
    backend itself; for vLLM's CPU build (`cpu_build`) the file and fp8 connectors are swapped for
    their host-memory versions (draftline/hidden_states/vllm_cpu_connector.py), mooncake is refused."""
    from hs_connectors import HiddenStatesBackend

    if cpu_build:
        if transfer not in CPU_CONNECTORS:
            raise CommandError(
                f"error: hidden-state transfer {transfer!r} through vLLM's CPU build (vllm-cpu): "
                "its connector copies on a device stream; use transfer file or fp8 here, or a "
                "GPU host"
            )
        config = kv_transfer_config(transfer, staging_dir)
        return {
            **config,
            "kv_connector": CPU_CONNECTORS[transfer],
            "kv_connector_module_path": CPU_CONNECTOR_MODULE,
        }

    backend = HiddenStatesBackend.registry.get(transfer)
    if backend is None:
        raise ValueError(
            f"hidden-state transfer {transfer!r}: hs-connectors has {sorted(HiddenStatesBackend.registry)}"
        )
    if transfer == "mooncake":
        if mooncake is None:
            raise ValueError("transfer mooncake needs hidden_states.online.mooncake settings")
        return backend.build_kv_transfer_config(mooncake_args(mooncake))
    return backend.build_kv_transfer_config(argparse.Namespace(hidden_states_path=str(staging_dir)))


@dataclass(frozen=True)
class OfflineDataRun:
    """One run of speculators' generate-offline-data client against an extraction server."""

    endpoint: str  # the server's OpenAI base URL (.../v1)
    tokenized_dir: Path
    out: Path
    concurrency: int
    request_timeout_s: float
    max_retries: int
    validate: bool = True


def generate_offline_data_command(run: OfflineDataRun) -> list[str]:
    """speculators' own extraction client: sends each row's input_ids (max_tokens=1), moves the file
    vLLM wrote to out/hs_{i}.safetensors, skips files that exist; `validate` checks tokens and
    finiteness (its check cannot read fp8 files on CPU: torch has no aminmax for float8 there, so
    fp8 files are checked by the stage after it, with resume.pending_rows)."""
    return [
        sys.executable,
        "-m",
        "speculators",
        "generate-offline-data",
        "--endpoint",
        run.endpoint,
        "--preprocessed-data",
        str(run.tokenized_dir),
        "--output",
        str(run.out),
        "--concurrency",
        str(run.concurrency),
        *(["--validate-outputs"] if run.validate else []),
        "--request-timeout",
        str(run.request_timeout_s),
        "--max-retries",
        str(run.max_retries),
    ]


# ---- vLLM and SGLang with or without a draft: the benchmark's servers, the deployment commands ----


@dataclass(frozen=True)
class SpeculativeDraft:
    """The draft a vLLM or SGLang server attaches, in the engine's own terms; path None for a
    method that needs no draft model (vLLM's ngram, suffix: draftline/draft/free.py)."""

    path: str | None
    method: str  # vLLM speculative_config.method, SGLang --speculative-algorithm
    num_steps: (
        int  # draft tokens per step: vLLM num_speculative_tokens, SGLang --speculative-num-steps
    )
    eagle_topk: int = 1  # SGLang --speculative-eagle-topk; 1 = a chain
    # SGLang --speculative-num-draft-tokens; None = what the tree verifies: num_steps + 1 for a
    # chain, num_steps * eagle_topk + 1 otherwise
    num_draft_tokens: int | None = None
    vllm_config: dict = field(default_factory=dict)  # the rest of vLLM's speculative_config


@dataclass(frozen=True)
class EngineServe:
    """A vLLM or SGLang server of the target: the baseline (no draft) or speculative."""

    engine: str  # vllm | sglang
    launcher: list[str] | None  # the argv before the model; vLLM's None: engines.vllm's interpreter
    args: list[str]  # the engine's own flags, as given
    host: str
    port: int | None  # None: no --port, the engine's default (the deployment command)
    draft: SpeculativeDraft | None = None


def vllm_server_command(model: str, given: list[str], serve: EngineServe) -> list[str]:
    """`vllm serve` (or benchmark.vllm.launcher) of `model`, the draft as --speculative-config."""
    server = (
        [*serve.launcher, model] if serve.launcher is not None else vllm_engine().server_argv(model)
    )
    cmd = [*server, *given]
    if serve.draft:
        draft = serve.draft
        spec = {
            "method": draft.method,
            **({"model": draft.path} if draft.path is not None else {}),
            "num_speculative_tokens": draft.num_steps,
            **draft.vllm_config,
        }
        cmd += ["--speculative-config", json.dumps(spec)]
    return cmd


def sglang_server_command(model: str, given: list[str], serve: EngineServe) -> list[str]:
    """SGLang's launcher with --model-path, the draft as its --speculative-* flags (a chain's
    --speculative-num-draft-tokens is num_steps + 1, a tree's num_steps * eagle_topk + 1)."""
    cmd = [*(serve.launcher or []), "--model-path", model, *given]
    if serve.draft:
        draft = serve.draft
        if draft.path is None:
            raise CommandError(
                f"sglang: --speculative-algorithm {draft.method} without a draft model is not "
                "wired here; serve it with vLLM"
            )
        steps, topk = draft.num_steps, draft.eagle_topk
        draft_tokens = draft.num_draft_tokens or (steps + 1 if topk == 1 else steps * topk + 1)
        cmd += [
            "--speculative-algorithm",
            draft.method,
            "--speculative-draft-model-path",
            draft.path,
            "--speculative-num-steps",
            str(steps),
            "--speculative-eagle-topk",
            str(topk),
            "--speculative-num-draft-tokens",
            str(draft_tokens),
        ]
    return cmd


# each served engine's command line, by the name EngineServe.engine spells it as (the benchmark's
# engines name theirs: draftline/benchmark/engines.py `spelled_as`)
SERVER_COMMANDS = {"vllm": vllm_server_command, "sglang": sglang_server_command}


def engine_serve_command(card: TargetCard, serve: EngineServe) -> list[str]:
    """The server command line of `serve` on the card's target (a local directory by its resolved
    path, else the hub id): the target's revision and remote code, host and port, the flags given,
    then the engine's own (SERVER_COMMANDS)."""
    if serve.engine not in SERVER_COMMANDS:
        raise ValueError(f"benchmark.engine: no server command for engine {serve.engine!r}")
    revision = ["--revision", card.revision] if card.revision else []
    revision += ["--trust-remote-code"] if card.trust_remote_code else []
    model = str(Path(card.model).resolve()) if Path(card.model).exists() else card.model
    where = ["--host", serve.host] + (["--port", str(serve.port)] if serve.port else [])
    return SERVER_COMMANDS[serve.engine](model, [*revision, *where, *serve.args], serve)
