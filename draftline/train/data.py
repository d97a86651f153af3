"""The draft's training data: tokenized rows and their hidden states, checked, fingerprinted,
and read through speculators' own data path.

speculators' ArrowDataset over the tokenized rows and hs_{i}.safetensors files, the Multipack
packing plan, and the packs in the draft forward's layout (draftline/draft/forward.py), the next
ones read ahead by train.loader_workers threads while a step computes (make_loader); with
hidden_states.mode online the target computes each packed batch's states at fetch time instead
(draftline/hidden_states/online.py). The states come in the dtype the forward runs in: float32
on CPU, bf16 on a GPU.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from draftline.core.errors import DraftlineError
from draftline.core.io import file_sha256
from draftline.draft.forward import PackLayout, hidden_states_dtype, pack_collate
from draftline.draft.methods import drafter
from draftline.engines.servers import checkpoint_bytes
from draftline.hidden_states import formats as hs_format
from draftline.targets.model import load_target_model

if TYPE_CHECKING:
    from draftline.core.card import TargetCard
    from draftline.train.config import TrainConfig


class DataMismatch(DraftlineError, ValueError):
    """The training data were made for another target configuration; the message names the file."""


class OnlineStatesRefused(DraftlineError):
    """hidden_states.mode online cannot run this way (a transfer the builtin loop cannot read, a
    target too large for one device); the message says the way out."""


def training_data_sha256(tokenized_dir: Path, hs_dir: Path) -> str:
    """The tokenized rows (file contents) and the hidden-state files (names and sizes: hashing
    terabytes of hidden states is not affordable; hs_{i} is keyed to row i and validated upstream)
    with the fingerprint they were made under (target, weights, aux ids, dtype, the code that
    shapes them: files redone with other values keep their names and sizes); in online mode (no
    files are read) the mode, format and target fingerprint instead."""
    h = hashlib.sha256()
    for path in sorted(Path(tokenized_dir).glob("*.arrow")):
        h.update(f"{path.name}:{file_sha256(path)}\n".encode())
    source = hidden_states_source(hs_dir)
    if source["mode"] == "online":
        h.update(f"online:{source['format']}:{source.get('states_fingerprint')}\n".encode())
        return h.hexdigest()
    for path in sorted(Path(hs_dir).iterdir()):
        if path.name.startswith("hs_") or path.name == "meta.json":
            h.update(f"{path.name}:{path.stat().st_size}\n".encode())
    h.update(f"states:{source.get('fingerprint')}\n".encode())
    return h.hexdigest()


def trained_rows(tokenized_dir: Path, pack_len: int) -> dict:
    """How many tokenized rows the draft trains on and the longest position it sees: the longest
    row (after tokenize.max_length's cut), at most train.pack_len (speculators' collate cuts a row
    at the end of its pack). The draft has never seen a position past it, which the evaluate
    stage names (draftline/evaluate/context.py beyond_trained)."""
    from datasets import load_from_disk

    lengths = load_from_disk(str(tokenized_dir)).with_format(None)["seq_len"]
    longest_row = int(max(lengths, default=0))
    return {
        "rows": len(lengths),
        "longest_row": longest_row,
        "pack_len": pack_len,
        "longest": min(longest_row, pack_len),
    }


def hidden_states_source(hs_dir: Path) -> dict:
    """What the hidden_states stage recorded: mode (offline files / online), format, aux ids..."""
    meta = Path(hs_dir) / "meta.json"
    found = json.loads(meta.read_text()) if meta.is_file() else {}
    return {**found, "mode": found.get("mode", "offline"), "format": found.get("format", "bf16")}


def check_hidden_states(hs_dir: Path, card: TargetCard) -> None:
    meta = Path(hs_dir) / "meta.json"
    if meta.is_file():
        ids = json.loads(meta.read_text()).get("aux_layer_ids")
        if ids is not None and list(ids) != card.aux_ids:
            raise DataMismatch(
                f"{meta}: hidden states hold aux layers {ids}, the target card says "
                f"{card.aux_ids}; rerun the hidden_states stage"
            )


class OnlineStates:
    """hidden_states.mode: online for the builtin loop: the target (eval mode, on the train device)
    and what extraction would have captured and stored (aux ids, storage dtype of the format)."""

    def __init__(self, target, aux_layer_ids: list[int], storage: torch.dtype):
        self.target, self.aux_layer_ids, self.storage = target, list(aux_layer_ids), storage


class VllmOnline:
    """hidden_states.mode online through a vLLM extraction server (the builtin loop with
    hidden_states.online.engine vllm, and best-epoch selection of the speculators backend): each
    row's states are asked of the server as they are fetched and read back through the staging
    directory of the file / fp8 transfer (the file is deleted once loaded), as speculators.train
    --on-missing generate does; the target is never loaded here."""

    def __init__(self, endpoint: str, staging: Path, request_timeout_s: float, max_retries: int):
        self.endpoint, self.staging = endpoint, Path(staging)
        self.request_timeout_s, self.max_retries = request_timeout_s, max_retries

    @classmethod
    def of(cls, online: dict, endpoint: str, staging: Path) -> VllmOnline:
        """From hidden_states.online (as the hidden_states stage recorded it)."""
        if (online.get("transfer") or "file") == "mooncake":
            raise OnlineStatesRefused(
                "error: hidden_states.online.transfer mooncake reaches speculators.train only "
                "(train.backend: speculators); the builtin loop reads transfer file or fp8"
            )
        return cls(endpoint, staging, online["request_timeout_s"], online["max_retries"])


# share of a device's memory the whole target may take in the online mode's builtin loop and in
# best-epoch selection (the rest: the draft, its optimizer, activations, the packed batch)
TARGET_MEMORY_SHARE = 0.8


def check_target_fits(card: TargetCard, device: str, what: str) -> None:
    """The online mode and the speculators hand-off's best-epoch selection load the whole target
    through transformers on one device. Before any spend: fail when its weights on disk (a lower
    bound of what loading takes) exceed TARGET_MEMORY_SHARE of that device's memory (the first
    GPU's, or the RAM free now on CPU), naming the bound and the ways out. Unknown sizes pass."""
    import psutil

    size = checkpoint_bytes(card.model, card.revision)
    if size is None:
        return
    if device.startswith("cuda"):
        memory, where = torch.cuda.get_device_properties(0).total_memory, "GPU 0's memory"
    else:
        memory, where = psutil.virtual_memory().available, "the RAM free now"
    bound = TARGET_MEMORY_SHARE * memory
    if size > bound:
        raise OnlineStatesRefused(
            f"error: {what} loads the whole target on one device ({device}): its weights are "
            f"{size / 1e9:.1f} GB on disk, above {TARGET_MEMORY_SHARE:.0%} of {where} "
            f"({bound / 1e9:.1f} GB). Use hidden_states.mode: offline (states extracted by "
            "hidden_states.backend: vllm with tensor parallelism), where training and best-epoch "
            "selection read stored states and never load the target"
        )


def online_states(card: TargetCard, source: dict, device: str) -> OnlineStates:
    """hidden_states.mode online: the target on the train device (float32 on CPU, bf16 on a GPU, as
    extraction computes), the aux ids and the storage dtype of the format the states would have."""
    check_target_fits(card, device, "hidden_states.mode: online")
    target = load_target_model(card, device, torch.float32 if device == "cpu" else torch.bfloat16)
    target.eval()
    target.requires_grad_(False)
    storage = hs_format.storage_dtype(
        source["format"], (source.get("params") or {}).get("dtype", "bfloat16")
    )
    return OnlineStates(target, card.aux_ids, storage)


@dataclass(frozen=True)
class TrainingData:
    """The rows a trainer reads and where their states come from: the tokenized rows, the
    hidden_states stage's directory (its files; in online mode its meta.json alone), and with
    `online` the target or a vLLM extraction server computing each row's states as it is read."""

    tokenized: Path
    hs: Path
    online: OnlineStates | VllmOnline | None = None


def make_dataset(data: TrainingData, split: str, train_ratio: float, pack_len: int, device: str):
    """speculators' ArrowDataset over the rows of `split` (train: the first train_ratio of them),
    their states in the dtype the forward runs in on `device`: from the files through hs-connectors'
    FP8Transfer (it dequantizes fp8 files and passes bf16 ones through), or, data.online, from the
    target at fetch time (draftline/hidden_states/online.py) or from a vLLM extraction server (VllmOnline)."""
    dtype, online = hidden_states_dtype(device), data.online
    common = dict(
        max_len=pack_len,
        datapath=str(data.tokenized),
        train_ratio=train_ratio,
        split=split,
        hidden_states_dtype=dtype,
    )
    # hs-connectors and hidden_states.online (speculators) load only for the modes needing them
    from hs_connectors import FP8Transfer
    from speculators.train.data import ArrowDataset

    if isinstance(online, VllmOnline):  # nothing is cached there: every row is generated
        return ArrowDataset(
            transfer=FP8Transfer(online.staging, dequantize_dtype=dtype),
            on_missing="generate",
            vllm_endpoint=online.endpoint,
            request_timeout=online.request_timeout_s,
            max_retries=online.max_retries,
            **common,
        )
    if online is not None:
        from draftline.hidden_states.online import OnlineArrowDataset

        return OnlineArrowDataset(online.target, online.aux_layer_ids, online.storage, **common)

    return ArrowDataset(
        transfer=FP8Transfer(Path(data.hs), dequantize_dtype=dtype), on_missing="raise", **common
    )


def epoch_batches(dataset, pack_len: int, seed: int, epoch: int) -> list[list[int]]:
    """speculators' Multipack packing plan for one epoch (depends only on lengths, seed, epoch)."""
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    sampler = MultipackDistributedBatchSamplerV2(
        batch_max_length=pack_len, lengths=dataset.approx_lengths, num_replicas=1, rank=0, seed=seed
    )
    sampler.set_epoch(epoch)
    return [[int(i) for i in batch] for batch in sampler]


# packs a reading thread may hold ready beyond the one in use, per thread (torch's DataLoader
# default prefetch_factor): at H = 7168, 2,048 tokens, float32 on CPU, one pack's states
# (4 x H x 2,048 x 4 bytes) are 235 MB
PREFETCH_PER_WORKER = 2


def fetch_pack(dataset, batch: list[int], collate) -> dict:
    """One packed batch as torch's DataLoader fetches it: the dataset's __getitems__ when it has one
    (the online mode's one target forward per pack), else row by row; then the collate."""
    getitems = getattr(dataset, "__getitems__", None)
    return collate(getitems(batch) if getitems else [dataset[i] for i in batch])


def pinned(pack: dict) -> dict:
    """The pack's tensors in page-locked memory: their copy to the GPU can run asynchronously."""
    return {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in pack.items()}


def prefetched(fetch, items, workers: int, depth: int):
    """fetch(item) for each of `items`, in their order, computed ahead by `workers` threads with at
    most `depth` results waiting. A fetch's error is raised where its result is taken; closing the
    generator cancels what has not started and waits for what has."""
    pool = ThreadPoolExecutor(workers, thread_name_prefix="pack-reader")
    todo = iter(items)
    pending = deque(pool.submit(fetch, item) for item in itertools.islice(todo, depth))
    try:
        while pending:
            result = pending.popleft().result()
            pending.extend(pool.submit(fetch, item) for item in itertools.islice(todo, 1))
            yield result
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def layout_of(cfg: TrainConfig, hidden_size: int) -> PackLayout:
    """The packs train.method's forward reads: train.pack_len tokens, shifted or not."""
    return PackLayout(cfg.pack_len, hidden_size, drafter(cfg.method).shifted)


def make_loader(
    dataset,
    batches: list[list[int]],
    layout: PackLayout,
    device: str = "cpu",
    workers: int = 0,
):
    """The packed batches of `batches`, in order, in the draft forward's layout
    (draftline/draft/forward.py pack_collate) and its dtype on `device`.

    workers 0: each pack is read when the loop asks for it. workers N: N threads read ahead (at most
    N x PREFETCH_PER_WORKER packs waiting) while the step computes; reading is file IO and tensor
    copies, which release the GIL, and a thread hands the pack over without the copy into shared
    memory a worker process needs. On CUDA packs come in page-locked memory."""
    collate = pack_collate(layout, hidden_states_dtype(device))
    pin_memory = torch.device(device).type == "cuda"

    def fetch(batch):
        pack = fetch_pack(dataset, batch, collate)
        return pinned(pack) if pin_memory else pack

    if workers == 0:
        return (fetch(batch) for batch in batches)
    return prefetched(fetch, batches, workers, workers * PREFETCH_PER_WORKER)
