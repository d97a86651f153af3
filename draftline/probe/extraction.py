"""The probe row through the configured vLLM extraction path, its result checked
(draftline/probe/checks.py decides whether to probe and keeps the pass).

Offline (hidden_states.backend vllm): the hidden_states stage's own path (draftline/hidden_states/
extract.py `run_vllm`) on one short chat prompt, the file it leaves checked as that stage checks
its files. Online with train.backend speculators: the server the train stage would start (or the
running one of hidden_states.online.endpoint), asked for the probe row as the train stage checks
it. The code here decides whether a probe passes: it is in the pass's key
(draftline/core/shaping.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from safetensors import safe_open

from draftline.core.errors import DraftlineError
from draftline.engines.preflight import (
    PROBE_MESSAGES,
    PreflightError,
    ProbeLimits,
    preflight_extraction,
)
from draftline.hidden_states import formats as hs_format
from draftline.hidden_states.config import HiddenStatesError
from draftline.hidden_states.online_server import OnlineServerJob, online_server, recorded_source
from draftline.targets.model import card_tokenizer
from draftline.tokens.chat import chat_prompt_ids

if TYPE_CHECKING:
    from draftline.core.card import TargetCard
    from draftline.hidden_states.config import HiddenStatesConfig


class ProbeFailed(DraftlineError, RuntimeError):
    """The configured vLLM path cannot extract this target's states; the message says what failed."""


def probe_prompt_ids(card: TargetCard) -> list[int]:
    """A short chat prompt through the target's tokenizer and template (as regeneration renders
    one), so the probe row is the kind of row extraction will get."""
    return chat_prompt_ids(card_tokenizer(card), PROBE_MESSAGES, None, {})


def describe_file(path: Path, ids: list[int], hidden_size: int, store_dtype) -> str:
    """Why the probe row's file is not the states asked for."""
    if not path.exists():
        return "no hidden-state file came back for the probe row"
    try:
        with safe_open(str(path), framework="pt") as f:
            keys = sorted(f.keys())
            if "hidden_states" not in keys or "token_ids" not in keys:
                return f"the probe row's file holds {keys}, not token_ids and hidden_states"
            hs = f.get_slice("hidden_states")
            shape, dtype = list(hs.get_shape()), hs.get_dtype()
            same_ids = f.get_tensor("token_ids").tolist() == list(ids)
    except Exception as err:  # noqa: BLE001 - unreadable: say so
        return f"the probe row's file cannot be read ({type(err).__name__}: {err})"
    want = [len(ids), 4, hidden_size]
    if shape != want:
        return (
            f"the probe row's states have shape {shape}, the card needs {want} "
            "(3 aux layers + the last layer, hidden size)"
        )
    if not same_ids:
        return "the probe row's file holds other token ids than were sent"
    return f"the probe row's states ({dtype}) are not {store_dtype} or not finite"


def probe_offline(
    hs: HiddenStatesConfig, card: TargetCard, ids: list[int], work: Path, log_path: Path
) -> dict:
    """One row through the hidden_states stage's vLLM path (run_vllm), its file checked as that
    stage checks its files. speculators' client reads the tokenized rows from disk, so the row is
    saved as the tokenize stage saves its rows."""
    # torch and datasets load on first use: a probe without the offline vLLM path never needs them
    from datasets import Dataset, load_from_disk
    from draftline.hidden_states.capture import check_aux_layer_ids
    from draftline.hidden_states.extract import ExtractionJob, run_vllm
    from draftline.hidden_states.files import hs_path, is_valid_file

    tokenized = work / "tokenized"
    rows = Dataset.from_dict(
        {"input_ids": [ids], "loss_mask": [[1] * len(ids)], "seq_len": [len(ids)]}
    )
    rows.set_format(type="torch", columns=["input_ids", "loss_mask", "seq_len"])
    rows.save_to_disk(str(tokenized))
    rows = load_from_disk(str(tokenized))
    out = work / "hidden_states"
    out.mkdir()
    aux = check_aux_layer_ids(list(card.aux_ids), card.num_layers)
    job = ExtractionJob(hs, card, aux, rows, tokenized, out, log_path)
    try:
        run_vllm(job, {0: len(ids)})
    except HiddenStatesError as err:  # the client failed, or the endpoint's preflight refused it
        raise ProbeFailed(str(err).removeprefix("error: ")) from None
    except RuntimeError as err:  # the server did not start (its log's last lines are in it)
        raise ProbeFailed(str(err)) from None
    store = hs_format.storage_dtype(hs.format, hs.dtype)
    file = hs_path(out, 0)
    if not is_valid_file(file, ids, card.hidden_size, store, full=True):
        raise ProbeFailed(describe_file(file, ids, card.hidden_size, store))
    return {"tokens": len(ids), "shape": [len(ids), 4, card.hidden_size]}


def probe_online(
    hs: HiddenStatesConfig, card: TargetCard, ids: list[int], work: Path, log_path: Path
) -> dict:
    """The server the train stage would start for speculators' trainers (or the running one of
    hidden_states.online.endpoint, whose preflight is the probe), asked for the probe row as the
    train stage checks it."""
    job = OnlineServerJob(recorded_source(hs), len(ids), ids, work, log_path, "probe")
    transfer = hs.online.resolved_transfer(hs.format)
    try:
        with online_server(card, job) as served:
            if served.seen is not None:  # an external server: checked with the probe row
                return served.seen
            return preflight_extraction(
                served.endpoint.removesuffix("/v1"),
                card,
                list(card.aux_ids),
                ids,
                ProbeLimits(hs.online.request_timeout_s, hs.online.max_retries + 1),
                probe_file=transfer != "mooncake",
            )
    except HiddenStatesError as err:  # the external server's preflight refused it
        raise ProbeFailed(str(err).removeprefix("error: ")) from None
    except PreflightError as err:
        raise ProbeFailed(str(err)) from None
    except RuntimeError as err:  # the server did not start (its log's last lines are in it)
        raise ProbeFailed(str(err)) from None
