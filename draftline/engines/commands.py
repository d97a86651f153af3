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
The benchmark launches vLLM or SGLang from benchmark params, as the baseline (no draft) or with
the EAGLE-3 draft; the same commands, without a port, are the deployment commands.

Longer than a module here usually is, on purpose: every engine's flags side by side is the point (a flag renamed
in one engine is fixed next to its counterparts in the others).
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from draftline.engines.config import VllmEngineConfig, vllm_engine
from draftline.engines.servers import has_cuda

if TYPE_CHECKING:
    from draftline.benchmark.config import BenchmarkConfig
    from draftline.core.card import TargetCard
    from draftline.regenerate.config import RegenerateConfig

# The module regenerate.backend hf launches. Named, not imported: the regenerate stage imports it,
# so that an edit to it (which changes the answers) reruns that stage and no other.
HF_BATCH_SERVER = "draftline.engines.batch_server"


# ---- regeneration: the plain target ----------------------------------------------------------


def _port_flag(port: int | None) -> list[str]:
    """--port PORT; none for None (the engine's default: a command shown, not launched)."""
    return ["--port", str(port)] if port else []


def transformers_serve_command(
    model: str,
    host: str,
    port: int,
    device: str,
    continuous_batching: bool,
    cb_num_blocks: int,
    extra_args: list[str],
    trust_remote_code: bool = False,
    chat_template_kwargs: dict | None = None,
) -> list[str]:
    """`transformers serve` pinned to the target.

    Continuous batching is off by default: on CPU it was slower than the plain server, sized its KV
    cache from total RAM (one server took 88% of 24 GB), and kept the sampling settings of the
    first request for all later ones. When on, the cache is bounded by --cb-num-blocks.
    chat_template_kwargs become the server's defaults too (every request also carries them).
    """
    exe = Path(sys.executable).with_name("transformers")
    cmd = [str(exe), "serve", model, "--device", device, "--host", host, *_port_flag(port)]
    if trust_remote_code:
        cmd.append("--trust-remote-code")
    if chat_template_kwargs:
        cmd += ["--chat-template-kwargs", json.dumps(chat_template_kwargs, sort_keys=True)]
    if continuous_batching:
        cmd += ["--continuous-batching", "--cb-num-blocks", str(cb_num_blocks)]
    return cmd + list(extra_args)


def hf_batch_serve_command(
    module: str,
    model: str,
    host: str,
    port: int,
    max_batch: int,
    gather_ms: float,
    tie_tolerance: float,
    threads: int | None,
    stats_file: Path | None,
    trust_remote_code: bool = False,
) -> list[str]:
    """`module` (draftline.engines.batch_server) pinned to the target: greedy batches of the requests in flight."""
    cmd = [
        sys.executable,
        "-m",
        module,
        model,
        "--host",
        host,
        *_port_flag(port),
        "--max-batch",
        str(max_batch),
        "--gather-ms",
        str(gather_ms),
        "--tie-tolerance",
        str(tie_tolerance),
    ]
    cmd += ["--stats-file", str(stats_file)] if stats_file else []
    return (
        cmd
        + (["--threads", str(threads)] if threads else [])
        + (["--trust-remote-code"] if trust_remote_code else [])
    )


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


def vllm_regenerate_command(
    model: str,
    served_name: str,
    host: str,
    port: int,
    revision: str | None,
    tensor_parallel_size: int,
    data_parallel_size: int,
    max_model_len: int | None,
    reasoning_parser: str | None,
    tool_call_parser: str | None,
    extra_args: list[str],
    trust_remote_code: bool = False,
    engine: VllmEngineConfig | None = None,
) -> list[str]:
    """`engine`: the vLLM environment that runs it (engines.vllm; null = its defaults)."""
    cmd = [
        *(engine or VllmEngineConfig()).server_argv(model),
        "--host",
        host,
        *_port_flag(port),
        "--served-model-name",
        served_name,
        "--tensor-parallel-size",
        str(tensor_parallel_size),
        "--data-parallel-size",
        str(data_parallel_size),
    ]
    if trust_remote_code:
        cmd.append("--trust-remote-code")
    if revision:
        cmd += ["--revision", revision]
    if max_model_len:
        cmd += ["--max-model-len", str(max_model_len)]
    if reasoning_parser:
        cmd += ["--reasoning-parser", reasoning_parser]
    if tool_call_parser:  # vLLM parses tool calls only with auto tool choice on
        cmd += ["--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser]
    return cmd + list(extra_args)


def sglang_regenerate_command(
    model: str,
    served_name: str,
    host: str,
    port: int,
    revision: str | None,
    tensor_parallel_size: int,
    data_parallel_size: int,
    max_model_len: int | None,
    reasoning_parser: str | None,
    tool_call_parser: str | None,
    extra_args: list[str],
    trust_remote_code: bool = False,
) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        model,
        "--host",
        host,
        *_port_flag(port),
        "--served-model-name",
        served_name,
        "--tp-size",
        str(tensor_parallel_size),
        "--dp-size",
        str(data_parallel_size),
    ]
    if trust_remote_code:
        cmd.append("--trust-remote-code")
    if revision:
        cmd += ["--revision", revision]
    if max_model_len:
        cmd += ["--context-length", str(max_model_len)]
    if reasoning_parser:
        cmd += ["--reasoning-parser", reasoning_parser]
    if tool_call_parser:
        cmd += ["--tool-call-parser", tool_call_parser]
    return cmd + list(extra_args)


def regenerate_command(
    cfg: RegenerateConfig,
    card: TargetCard,
    model_name: str,
    out: Path | None = None,
    port: int | None = None,
) -> list[str]:
    """The server command of a launched regenerate.backend on `port` (else regenerate.port; with
    neither, no --port: a command to show); `out` (the stage's output dir) takes backend hf's stats."""
    port = port if port is not None else cfg.port
    trust = card.trust_remote_code
    if cfg.backend == "hf":
        return (
            hf_batch_serve_command(
                HF_BATCH_SERVER,
                card.model,
                cfg.host,
                port,
                cfg.hf.max_batch,
                cfg.hf.gather_ms,
                cfg.hf.tie_tolerance,
                cfg.hf.threads,
                out / "server_stats.json" if out else None,
                trust,
            )
            + cfg.extra_args
        )
    if cfg.backend == "transformers":
        return transformers_serve_command(
            card.model,
            cfg.host,
            port,
            "cuda" if has_cuda() else "cpu",
            cfg.continuous_batching,
            cfg.cb_num_blocks,
            cfg.extra_args,
            trust,
            cfg.chat_template_kwargs,
        )
    if cfg.backend == "vllm":
        build = partial(vllm_regenerate_command, engine=vllm_engine())
    else:
        build = sglang_regenerate_command
    return build(
        card.model,
        model_name,
        cfg.host,
        port,
        card.revision,
        cfg.tensor_parallel_size,
        cfg.data_parallel_size,
        cfg.max_model_len,
        cfg.reasoning_parser,
        cfg.tool_call_parser,
        cfg.extra_args,
        trust,
    )


# ---- hidden-state extraction: vLLM and speculators' client ------------------------------------


def vllm_extract_command(
    engine: VllmEngineConfig,
    model: str,
    revision: str | None,
    aux_layer_ids: list[int],
    num_layers: int,
    staging_dir: Path,
    host: str,
    port: int,
    dtype: str,
    tensor_parallel_size: int,
    max_model_len: int,
    gpu_memory_utilization: float,
    extra_args: list[str],
    transfer: str = "file",
    mooncake: dict | None = None,
    trust_remote_code: bool = False,
) -> list[str]:
    """`vllm serve` set up for hidden-state extraction, as speculators' scripts/launch_vllm.py does:
    the `extract_hidden_states` speculative method with aux ids + [N] (N = final pre-norm output),
    and the kv-transfer config of hs-connectors' `transfer` backend: file (vLLM's
    ExampleHiddenStatesConnector) or fp8 (FP8HiddenStatesConnector) writing hs files into
    `staging_dir`, or mooncake (`mooncake`: hidden_states.online.mooncake settings). `engine`:
    the vLLM environment that runs it (engines.vllm)."""
    speculative = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {
            "hf_config": {"eagle_aux_hidden_state_layer_ids": [*aux_layer_ids, num_layers]}
        },
    }
    kv_transfer = kv_transfer_config(transfer, staging_dir, mooncake, engine.is_cpu_build())
    cmd = [
        *engine.server_argv(model),
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--tensor-parallel-size",
        str(tensor_parallel_size),
        "--max-model-len",
        str(max_model_len),
        "--gpu-memory-utilization",
        str(gpu_memory_utilization),
        "--speculative-config",
        json.dumps(speculative),
        "--kv-transfer-config",
        json.dumps(kv_transfer),
    ]
    if revision:
        cmd += ["--revision", revision]
    if trust_remote_code:
        cmd.append("--trust-remote-code")
    return cmd + list(extra_args)


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
            raise SystemExit(
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


def generate_offline_data_command(
    endpoint: str,
    tokenized_dir: Path,
    out: Path,
    concurrency: int,
    request_timeout_s: float,
    max_retries: int,
    validate: bool = True,
) -> list[str]:
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
        endpoint,
        "--preprocessed-data",
        str(tokenized_dir),
        "--output",
        str(out),
        "--concurrency",
        str(concurrency),
        *(["--validate-outputs"] if validate else []),
        "--request-timeout",
        str(request_timeout_s),
        "--max-retries",
        str(max_retries),
    ]


# ---- benchmark: baseline and speculative servers ----------------------------------------------


def sglang_steps(cfg: BenchmarkConfig, k: int) -> tuple[int, int, int]:
    """(num_steps, eagle_topk, num_draft_tokens) at draft length k (benchmark.sglang.num_steps, when
    set, wins); a chain (topk 1) verifies num_steps + 1 tokens."""
    steps = cfg.sglang.num_steps or k
    topk = cfg.sglang.eagle_topk
    draft_tokens = cfg.sglang.num_draft_tokens or (steps + 1 if topk == 1 else steps * topk + 1)
    return steps, topk, draft_tokens


def benchmark_serve_command(
    engine: str,
    card: TargetCard,
    cfg: BenchmarkConfig,
    draft_path: str | None,
    port: int | None = None,
    *,
    k: int | None = None,
    k_per_batch_size: list[list[int]] | None = None,
) -> list[str]:
    """The server command line; draft_path None gives the non-speculative baseline. `port` (else
    benchmark.port); with neither, no --port: the engine's default (the deployment command).
    k: draft tokens per step (None: the largest of benchmark.k); k_per_batch_size: vLLM's
    num_speculative_tokens_per_batch_size schedule, [[first batch size, last, k], ...]."""
    k = max(cfg.k) if k is None else k
    host, port = cfg.host, cfg.port if port is None else port
    revision = ["--revision", card.revision] if card.revision else []
    revision += ["--trust-remote-code"] if card.trust_remote_code else []
    model = (
        str(Path(card.model).resolve()) if Path(card.model).exists() else card.model
    )  # hub id or local dir
    where = ["--host", host] + (["--port", str(port)] if port else [])
    if engine == "vllm":
        if cfg.vllm.launcher is not None:
            server = [*cfg.vllm.launcher, model]
        else:
            server = vllm_engine().server_argv(model)
        cmd = [*server, *revision, *where, *cfg.vllm.args]
        if draft_path:
            spec = {
                "method": cfg.vllm.method,
                "model": draft_path,
                "num_speculative_tokens": k,
                **(
                    {"num_speculative_tokens_per_batch_size": k_per_batch_size}
                    if k_per_batch_size
                    else {}
                ),
                **cfg.vllm.speculative_config,
            }
            cmd += ["--speculative-config", json.dumps(spec)]
        return cmd
    if engine == "sglang":
        cmd = [*cfg.sglang.launcher, "--model-path", model, *revision, *where, *cfg.sglang.args]
        if draft_path:
            steps, topk, draft_tokens = sglang_steps(cfg, k)
            cmd += [
                "--speculative-algorithm",
                cfg.sglang.algorithm,
                "--speculative-draft-model-path",
                draft_path,
                "--speculative-num-steps",
                str(steps),
                "--speculative-eagle-topk",
                str(topk),
                "--speculative-num-draft-tokens",
                str(draft_tokens),
            ]
        return cmd
    raise ValueError(f"benchmark.engine: no server command for engine {engine!r}")


def draft_path_for(
    engine: str, cfg: BenchmarkConfig, draft_dir: str, sglang_draft: str | None = None
) -> str:
    """The draft directory an engine serves: for SGLang benchmark.sglang.draft_model_path, else the
    stage's export of the draft (sglang_draft), else the draft itself (refused by preflight_draft.check_engine_settings)."""
    if engine == "sglang" and (cfg.sglang.draft_model_path or sglang_draft):
        return str(Path(cfg.sglang.draft_model_path or sglang_draft).resolve())
    return str(Path(draft_dir).resolve())
