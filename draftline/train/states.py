"""Where the trainers get the hidden states: the files of the hidden_states stage, or with
hidden_states.mode online a vLLM extraction server, an external one (checked first) or one
launched for the run, the states moved through a staging directory (file / fp8) or Mooncake:
`speculators.train` always, the builtin loop with hidden_states.online.engine vllm.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

from draftline.engines.commands import vllm_extract_command
from draftline.engines.config import vllm_engine
from draftline.engines.preflight import PreflightError, preflight_extraction
from draftline.engines.servers import launch_env, server_url, startup_timeout_s

if TYPE_CHECKING:
    from draftline.core.card import TargetCard
    from draftline.train.run import TrainPaths


def speculators_hidden_states_args(
    hs_dir: Path,
    fmt: str = "bf16",
    online: dict | None = None,
    endpoint: str | None = None,
    staging_dir: Path | None = None,
) -> list[str]:
    """Where speculators.train gets the states. Offline: the files in hs_dir, read by hs-connectors'
    `file` or `fp8` backend. Online (`online`: hidden_states.online as a dict): `--on-missing
    generate` against the vLLM `endpoint` running extract_hidden_states, the states moved by the
    `file`/`fp8` transfer through `staging_dir` (deleted once loaded) or by `mooncake`."""
    if online is None:
        return [
            "--hidden-states-path",
            str(hs_dir),
            "--on-missing",
            "raise",
            "--hidden-states-backend",
            "fp8" if fmt == "fp8" else "file",
        ]
    transfer = online.get("transfer") or ("fp8" if fmt == "fp8" else "file")
    if endpoint is None:
        raise ValueError(
            "online hidden states need the vLLM endpoint (hidden_states.online.endpoint, or a launched server)"
        )
    args = [
        "--on-missing",
        "generate",
        "--vllm-endpoint",
        endpoint,
        "--hidden-states-backend",
        transfer,
        "--request-timeout",
        str(online["request_timeout_s"]),
        "--max-retries",
        str(online["max_retries"]),
    ]
    if transfer == "mooncake":
        m = online["mooncake"]
        return args + [
            "--mooncake-master",
            m["master"],
            "--mooncake-metadata-server",
            m["metadata_server"],
            "--mooncake-protocol",
            m["protocol"],
            "--mooncake-device",
            m["device"],
            "--mooncake-global-segment-gib",
            str(m["global_segment_gib"]),
            "--mooncake-local-buffer-gib",
            str(m["local_buffer_gib"]),
        ]
    return args + ["--hidden-states-path", str(staging_dir)]


def online_vllm(card: TargetCard, paths: TrainPaths, source: dict) -> tuple:
    """hidden_states.mode online with backend speculators: (a function port -> the `vllm serve`
    command to launch, or None for an external endpoint; the /v1 endpoint of an external server,
    or the base URL to launch on, port 0 = a free one chosen at start; the staging directory of
    the file/fp8 transfer)."""
    online, params = source["online"], source.get("params") or {}
    transfer = online.get("transfer") or ("fp8" if source["format"] == "fp8" else "file")
    # default staging in the train stage's own state dir: files under datasets/hidden_states would
    # change the hidden_states stage's output behind DVC's back
    staging = (
        None
        if transfer == "mooncake"
        else Path(online.get("staging_dir") or paths.state / "online_staging").resolve()
    )
    if online.get("endpoint"):
        return None, online["endpoint"], staging
    # datasets loads on first use: the probe imports online_vllm without it
    from datasets import load_from_disk

    v = params.get("vllm") or {}
    longest = max(load_from_disk(str(paths.tokenized)).with_format(None)["seq_len"])
    host = v.get("host") or "127.0.0.1"

    def serve(port: int) -> list[str]:
        return vllm_extract_command(
            vllm_engine(),
            card.model,
            card.revision,
            card.aux_ids,
            card.num_layers,
            staging,
            host,
            port,
            params.get("dtype", "bfloat16"),
            v.get("tensor_parallel_size", 1),
            v.get("max_model_len") or longest + 1,
            v.get("gpu_memory_utilization", 0.9),
            v.get("extra_args", []),
            transfer=transfer,
            mooncake=online.get("mooncake"),
            trust_remote_code=card.trust_remote_code,
        )

    return serve, server_url(host, v.get("port")), staging


def check_extraction_endpoint(
    card: TargetCard, paths: TrainPaths, source: dict, endpoint: str
) -> None:
    """The external extraction server of hidden_states.online.endpoint, checked with a probe row
    before the trainers ask it for states (draftline/engines/preflight.py); exits with the refusal."""
    from datasets import load_from_disk

    online = source["online"]
    probe = load_from_disk(str(paths.tokenized)).with_format(None)[0]["input_ids"]
    try:
        seen = preflight_extraction(
            endpoint.removesuffix("/v1"),
            card,
            card.aux_ids,
            probe,
            online.get("request_timeout_s", 600),
            online.get("max_retries", 3) + 1,
            probe_file=(online.get("transfer") or "file") != "mooncake",
        )
    except PreflightError as err:
        raise SystemExit(f"error: hidden_states.online.endpoint: {err}") from None
    print(f"train: using the running extraction server {endpoint} (preflight: {seen})")


@contextlib.contextmanager
def extraction_server(card: TargetCard, paths: TrainPaths, source: dict, log_dir: Path, say=print):
    """hidden_states.mode online: the vLLM extraction server the trainers ask for states while the
    context lasts, as (its /v1 endpoint, the staging directory of the file/fp8 transfer, the
    launched command or None). An external server (hidden_states.online.endpoint) is checked
    with a probe row first; otherwise one is launched with hidden_states.vllm.* and stopped at
    the end (its log: log_dir/vllm.log)."""
    # bound at call time: tests replace servers.ManagedServer
    from draftline.engines.servers import ManagedServer

    serve, endpoint, staging = online_vllm(card, paths, source)
    if staging is not None:
        staging.mkdir(parents=True, exist_ok=True)
    if serve is None:
        check_extraction_endpoint(card, paths, source, endpoint)
        yield endpoint, staging, None
        return
    launched = []

    def launch(port: int) -> list[str]:  # hidden_states.vllm.port, else a free port chosen at start
        launched.append(serve(port))
        say("train: launching " + " ".join(launched[-1]))
        return launched[-1]

    limit, why = startup_timeout_s(
        (source.get("params") or {}).get("vllm", {}).get("startup_timeout_s"),
        card.model,
        card.revision,
    )
    say(f"train: extraction server start-up limit {limit:.0f}s: {why}")
    log_dir.mkdir(parents=True, exist_ok=True)
    env = launch_env("vllm", card.model, log_dir / ".hf_cache")
    with ManagedServer(launch, env, endpoint, log_dir / "vllm.log", limit, say=say) as base_url:
        yield f"{base_url}/v1", staging, launched[-1]
