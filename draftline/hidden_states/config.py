"""params.yaml `hidden_states`: offline files or online, their format, the engine that captures
them (hf here, or a vLLM extraction server) and how states move in the online mode."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from draftline.core.config import Port, Section, operational, shaping
from draftline.core.errors import DraftlineError


class HiddenStatesError(DraftlineError):
    """The hidden states cannot be made or served as configured (inputs, disk, a vLLM server);
    the message, "error: " included, is what the user reads."""


class VllmExtractionConfig(Section):
    """hidden_states.backend: vllm — `vllm serve` launched for extraction, speculators'
    generate-offline-data as the client."""

    # base URL (http://host:port) of an extraction server already running (speculators'
    # launch_vllm.py, our aux ids + the last layer, a hidden_states_path this machine can read):
    # used instead of launching one, after a preflight (docs/targets.md)
    endpoint: str | None = operational(None)
    host: str = operational("127.0.0.1")
    port: Port = operational(None)  # null = a free port chosen at start
    tensor_parallel_size: int = operational(1, ge=1)
    max_model_len: int | None = operational(None, ge=16)  # null = longest tokenized row + 1
    gpu_memory_utilization: float = operational(0.9, gt=0, le=1)
    concurrency: int = operational(32, ge=1)  # requests in flight
    request_timeout_s: float = operational(600, gt=0)
    max_retries: int = operational(3, ge=0)
    startup_timeout_s: float | None = operational(
        None, gt=0
    )  # null = from the checkpoint size (as regenerate)
    extra_args: list[str] = shaping([])  # appended to `vllm serve` as given
    # the probe stage extracts one row through this path before regenerate starts (backend vllm,
    # or mode online with train.backend speculators), once per card and settings; false skips it
    probe: bool = operational(True)

    @model_validator(mode="after")
    def _endpoint_url(self):
        if self.endpoint is not None and not self.endpoint.startswith(("http://", "https://")):
            raise ValueError(f"endpoint: {self.endpoint!r} is not an http(s) base URL")
        return self


class MooncakeConfig(Section):
    """hs-connectors' Mooncake transfer (hidden_states.online.transfer: mooncake): vLLM puts each
    row's states in a Mooncake store, the trainers read them from it; no shared filesystem."""

    master: str = operational("127.0.0.1:50051")  # mooncake_master address
    metadata_server: str = operational("P2PHANDSHAKE")
    protocol: Literal["tcp", "rdma"] = operational("tcp")
    device: str = operational("")  # RDMA device(s), e.g. mlx5_0; empty = Mooncake chooses
    global_segment_gib: float = operational(4.0, gt=0)  # memory each client registers for the store
    local_buffer_gib: float = operational(2.0, gt=0)
    writer_threads: int = operational(4, ge=1)  # vLLM side


class OnlineConfig(Section):
    """hidden_states.mode: online — where the trainers get each row's states as they train:
    train.backend speculators always asks a vLLM extraction server (`speculators.train
    --on-missing generate`); the builtin loop runs the target itself (engine hf) or asks the same
    server (engine vllm: a target no one device holds, tensor-parallel in vLLM)."""

    # builtin loop: hf = the target on the train device through transformers, one forward per
    # packed batch; vllm = the extraction server below (launched, or `endpoint`), file/fp8 transfer
    engine: Literal["hf", "vllm"] = shaping("hf")

    # null = the train stage launches `vllm serve` with hidden_states.vllm.* settings; else the
    # /v1 base URL of a server already running the extract_hidden_states method
    endpoint: str | None = operational(None)
    # how states move from vLLM to the trainers (hs-connectors backends): file and fp8 through a
    # shared directory (`staging_dir`), mooncake through a Mooncake store; null = by `format`
    transfer: Literal["file", "fp8", "mooncake"] | None = operational(None)
    # file / fp8: a directory vLLM and the trainers share; null = models/draft_checkpoints/online_staging
    staging_dir: str | None = operational(None)
    request_timeout_s: float = operational(600, gt=0)
    max_retries: int = operational(3, ge=0)
    mooncake: MooncakeConfig = operational(MooncakeConfig())

    def resolved_transfer(self, fmt: str) -> str:
        return self.transfer or ("fp8" if fmt == "fp8" else "file")


class HiddenStatesConfig(Section):
    # offline: every row's states are extracted into files by this stage (resumable);
    # online: none are stored: the train stage runs the target on each packed batch (backend
    # builtin) or asks a vLLM server for them (backend speculators, see `online`); this stage then
    # writes only meta.json and its report (docs/hidden-states.md "Hidden states at scale")
    mode: Literal["offline", "online"] = shaping("offline")
    # bf16: speculators' plain layout in `dtype`, 4 x H x 2 bytes a token; fp8: hs-connectors' FP8
    # layout (float8_e4m3fn + a float32 scale per token), 4 x H + 4 bytes (draftline/hidden_states/formats.py)
    format: Literal["bf16", "fp8"] = shaping("bf16")
    backend: Literal["hf", "vllm"] = shaping(
        "hf"
    )  # hf: forward pass here; vllm: see VllmExtractionConfig
    device: Literal["auto", "cpu", "cuda"] = shaping("auto")  # backend hf
    # backend hf: spread a target larger than one GPU over all of them ("auto", "balanced", ...);
    # null = the whole target on `device`
    device_map: str | None = operational(None)
    dtype: Literal["float32", "bfloat16", "float16"] = shaping(
        "bfloat16"
    )  # stored; 4 x H x this per token
    # dtype of the forward pass; auto = `dtype` on GPU, float32 on CPU (bf16 matmuls are slow there)
    compute_dtype: Literal["auto", "float32", "bfloat16", "float16"] = shaping("auto")
    token_budget: int = operational(8192, ge=16)  # padded tokens per forward batch
    disk_margin: float = operational(1.1, ge=1.0)  # required free space = estimate x margin
    # how existing files are checked on a rerun: header (shape, dtype, token ids; reads a few KB)
    # or full (also loads the states and checks they are finite)
    verify_existing: Literal["header", "full"] = operational("header")
    vllm: VllmExtractionConfig = shaping(VllmExtractionConfig())
    online: OnlineConfig = shaping(OnlineConfig())

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
