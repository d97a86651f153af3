"""hidden_states.mode online through vLLM: the extraction server the trainers ask for each row's
states (`speculators.train` always, the builtin loop with hidden_states.online.engine vllm), and
the probe stage asks for one row before regeneration. An external one
(hidden_states.online.endpoint, checked with a probe row first) or one launched for the run; the
states move through a staging directory (transfer file / fp8) or a Mooncake store.

The settings are the hidden_states stage's as it recorded them (its meta.json: format, online,
params), so the trainers use the server that stage was configured for. The builtin loop's
in-process alternative (the target on the train device) is draftline/hidden_states/online.py.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from draftline.engines.commands import ExtractServe, vllm_extract_command
from draftline.engines.config import vllm_engine
from draftline.engines.preflight import PreflightError, ProbeLimits, preflight_extraction
from draftline.engines.servers import ManagedServer, launch_env, server_url, startup_timeout_s
from draftline.hidden_states.config import HiddenStatesError

if TYPE_CHECKING:
    from draftline.core.card import TargetCard
    from draftline.hidden_states.config import HiddenStatesConfig

log = logging.getLogger(__name__)


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


def recorded_source(hs: HiddenStatesConfig) -> dict:
    """hidden_states params in the shape its stage records them in meta.json (what the train stage
    reads back): for a server set up from params.yaml directly."""
    return {"format": hs.format, "online": hs.online.model_dump(), "params": hs.model_dump()}


@dataclass(frozen=True)
class OnlineServerJob:
    """One use of the online server: the recorded hidden_states settings (`source`), the rows it
    must fit (the longest row's tokens, with one row's token ids for an external server's
    preflight), the directory the default staging goes under, the launched server's log, and the
    stage that names it in messages."""

    source: dict
    longest: int
    probe_ids: list[int]
    state_dir: Path
    log_path: Path
    stage: str

    @classmethod
    def for_training(
        cls, source: dict, tokenized: Path, state_dir: Path, log_dir: Path
    ) -> OnlineServerJob:
        """The train stage's: its tokenized rows, its state directory, the log in log_dir."""
        # datasets loads on first use: the probe imports this module and never reads rows from disk
        from datasets import load_from_disk

        rows = load_from_disk(str(tokenized)).with_format(None)
        longest, first = max(rows["seq_len"]), rows[0]["input_ids"]
        return cls(source, longest, first, state_dir, log_dir / "vllm.log", "train")


class Served(NamedTuple):
    """The online server while it runs: its /v1 endpoint, the staging directory of the file/fp8
    transfer (None with mooncake), the launched command (None for an external server), and what
    an external server's preflight saw (None for a launched one)."""

    endpoint: str
    staging: Path | None
    launched: list[str] | None
    seen: dict | None


def staging_dir(job: OnlineServerJob) -> Path | None:
    """Where the file/fp8 transfer moves the states: hidden_states.online.staging_dir, else
    state_dir/online_staging; None for mooncake."""
    online = job.source["online"]
    transfer = online.get("transfer") or ("fp8" if job.source["format"] == "fp8" else "file")
    if transfer == "mooncake":
        return None
    # default staging in the caller's own state dir: files under datasets/hidden_states would
    # change the hidden_states stage's output behind DVC's back
    return Path(online.get("staging_dir") or job.state_dir / "online_staging").resolve()


def serve_command(card: TargetCard, job: OnlineServerJob, staging: Path | None, port: int):
    """The `vllm serve` command of a launched server on `port`, set by hidden_states.vllm.*;
    max_model_len defaults to the longest row + 1."""
    online, params = job.source["online"], job.source.get("params") or {}
    transfer = online.get("transfer") or ("fp8" if job.source["format"] == "fp8" else "file")
    v = params.get("vllm") or {}
    return vllm_extract_command(
        vllm_engine(),
        ExtractServe(
            card.model,
            card.revision,
            card.aux_ids,
            card.num_layers,
            staging,
            v.get("host") or "127.0.0.1",
            port,
            params.get("dtype", "bfloat16"),
            v.get("tensor_parallel_size", 1),
            v.get("max_model_len") or job.longest + 1,
            v.get("gpu_memory_utilization", 0.9),
            v.get("extra_args", []),
            transfer=transfer,
            mooncake=online.get("mooncake"),
            trust_remote_code=card.trust_remote_code,
        ),
    )


def check_endpoint(card: TargetCard, job: OnlineServerJob, endpoint: str) -> dict:
    """The external server of hidden_states.online.endpoint, checked with the probe row before
    anyone asks it for states (draftline/engines/preflight.py); returns what it saw, raises
    HiddenStatesError with its refusal."""
    online = job.source["online"]
    try:
        seen = preflight_extraction(
            endpoint.removesuffix("/v1"),
            card,
            card.aux_ids,
            job.probe_ids,
            ProbeLimits(online.get("request_timeout_s", 600), online.get("max_retries", 3) + 1),
            probe_file=(online.get("transfer") or "file") != "mooncake",
        )
    except PreflightError as err:
        raise HiddenStatesError(f"error: hidden_states.online.endpoint: {err}") from None
    log.info(f"{job.stage}: using the running extraction server {endpoint} (preflight: {seen})")
    return seen


@contextlib.contextmanager
def online_server(card: TargetCard, job: OnlineServerJob) -> Iterator[Served]:
    """The online mode's vLLM extraction server while the context lasts (Served). An external
    server (hidden_states.online.endpoint) is checked with the probe row first; otherwise one is
    launched with hidden_states.vllm.* (on its port, else a free one chosen at start) and stopped
    at the end."""
    online, params = job.source["online"], job.source.get("params") or {}
    staging = staging_dir(job)
    if staging is not None:
        staging.mkdir(parents=True, exist_ok=True)
    if online.get("endpoint"):
        seen = check_endpoint(card, job, online["endpoint"])
        yield Served(online["endpoint"], staging, None, seen)
        return
    v = params.get("vllm") or {}
    launched = []

    def launch(port: int) -> list[str]:
        launched.append(serve_command(card, job, staging, port))
        log.info(f"{job.stage}: launching " + " ".join(launched[-1]))
        return launched[-1]

    limit, why = startup_timeout_s(v.get("startup_timeout_s"), card.model, card.revision)
    log.info(
        f"{job.stage}: extraction server start-up limit {limit:.0f}s ({why}); log {job.log_path}"
    )
    job.log_path.parent.mkdir(parents=True, exist_ok=True)
    env = launch_env("vllm", card.model, job.log_path.parent / ".hf_cache")
    base = server_url(v.get("host") or "127.0.0.1", v.get("port"))
    with ManagedServer(launch, env, base, job.log_path, limit) as base_url:
        yield Served(f"{base_url}/v1", staging, launched[-1], None)
