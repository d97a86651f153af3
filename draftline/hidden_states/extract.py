"""The hidden_states stage's work: capture the target's aux + last hidden states for every tokenized row.

Backend `hf` runs the target here (CPU, one GPU, or several with `device_map`), by the batches of
draftline/hidden_states/batches.py; backend `vllm` launches `vllm serve` for extraction (or uses
hidden_states.vllm.endpoint, checked first) and hands the rows to speculators'
`generate-offline-data`. `format: fp8` stores hs-connectors' FP8 layout (vLLM: its FP8
connector). `mode: online` stores nothing: meta.json tells the train stage to make the states
itself, the report gives the estimate. Valid files are kept, missing, truncated or corrupt ones
(re)done; what is removed is decided first (draftline/hidden_states/resume.py), then the disk is
checked, and only then are files removed.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from datasets import load_from_disk
from draftline.core.card import TargetCard
from draftline.core.io import read_json, write_meta
from draftline.engines.commands import (
    ExtractServe,
    OfflineDataRun,
    generate_offline_data_command,
    vllm_extract_command,
)
from draftline.engines.config import vllm_engine
from draftline.engines.preflight import PreflightError, ProbeLimits, preflight_extraction
from draftline.engines.servers import ManagedServer, launch_env, server_url, startup_timeout_s
from draftline.hidden_states import formats as hs_format
from draftline.hidden_states import plan, resume
from draftline.hidden_states.batches import BATCHES_FILE, BatchJob, extract_batches
from draftline.hidden_states.capture import DTYPES, check_aux_layer_ids
from draftline.hidden_states.config import HiddenStatesError
from draftline.hidden_states.disk import check_disk
from draftline.hidden_states.files import hs_path
from draftline.hidden_states.spot_check import Kept, StatesCheck, StatesMismatch, check_kept_states
from draftline.targets.model import load_target_model

if TYPE_CHECKING:
    from draftline.hidden_states.config import HiddenStatesConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExtractionJob:
    """One run of the stage: its settings, the target and its checked aux layer ids, the tokenized
    rows (loaded, and the directory speculators' client reads them from), the output directory
    and the vLLM server's log (backend vllm)."""

    cfg: HiddenStatesConfig
    card: TargetCard
    aux_ids: list[int]
    rows: Any  # datasets.Dataset
    tokenized: Path
    out: Path
    log_path: Path
    verify_sample: int = 8  # resume.verify_sample: kept files recomputed before extracting


def run_hf(job: ExtractionJob, todo: dict[int, int], kept: list[int]) -> StatesCheck:
    """Backend hf: the target runs here, batch by batch, once a few `kept` rows recomputed agree
    with their files (spot_check.py); returns that check."""
    cfg = job.cfg
    resolved = resume.resolved_settings(cfg, job.card, job.aux_ids)  # as the states' key has them
    device, dtype = resolved["device"], DTYPES[resolved["compute_dtype"]]
    model = load_target_model(job.card, device, dtype, cfg.device_map)
    store_dtype = hs_format.storage_dtype(cfg.format, cfg.dtype)
    with torch.inference_mode():
        try:
            files = Kept(job.rows, kept, job.out, job.aux_ids, store_dtype)
            checked = check_kept_states(model, files, job.verify_sample)
        except StatesMismatch as err:
            raise HiddenStatesError(str(err)) from None
    if checked.checked:
        log.info(
            f"hidden_states: spot-check: {len(checked.checked)} kept files recomputed, largest "
            f"difference {checked.largest_gap:.3g} {checked.unit} (tolerance {checked.tolerance})"
        )
    batches = BatchJob(job.aux_ids, job.out, store_dtype, cfg.token_budget)
    start = time.perf_counter()
    columns = (
        TextColumn("hidden states"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("rows {task.fields[tps]:,.0f} tok/s"),
        TimeRemainingColumn(),
    )
    with Progress(*columns) as bar, torch.inference_mode():
        task = bar.add_task("hs", total=len(todo), tps=0.0)
        tokens = 0

        def advance(n_rows: int, n_tokens: int) -> None:
            nonlocal tokens
            tokens += n_tokens
            bar.update(task, advance=n_rows, tps=tokens / (time.perf_counter() - start))

        extract_batches(model, job.rows, todo, batches, advance)
    return checked


def vllm_extract_serve(job: ExtractionJob, staging: Path, longest: int, port: int) -> list[str]:
    """The `vllm serve` command for extraction on `port`, its states written under staging;
    max_model_len defaults to the longest row + 1."""
    cfg, card = job.cfg, job.card
    v = cfg.vllm
    return vllm_extract_command(
        vllm_engine(),
        ExtractServe(
            card.model,
            card.revision,
            job.aux_ids,
            card.num_layers,
            staging,
            v.host,
            port,
            cfg.dtype,
            v.tensor_parallel_size,
            v.max_model_len or longest + 1,
            v.gpu_memory_utilization,
            v.extra_args,
            transfer=cfg.format if cfg.format == "fp8" else "file",
            trust_remote_code=card.trust_remote_code,
        ),
    )


def offline_server(job: ExtractionJob, todo: dict[int, int], staging: Path, longest: int):
    """The extraction server, as a context manager giving its base URL: hidden_states.vllm.endpoint
    (preflight-checked with the first row to do), else `vllm serve` launched with its log at
    job.log_path."""
    card, v = job.card, job.cfg.vllm
    if v.endpoint:  # already running: checked with one probe row, not started
        base_url = v.endpoint.rstrip("/")
        probe = job.rows.with_format(None)[min(todo)]["input_ids"]
        try:
            limits = ProbeLimits(v.request_timeout_s, v.max_retries + 1)
            seen = preflight_extraction(base_url, card, job.aux_ids, probe, limits)
        except PreflightError as err:
            raise HiddenStatesError(f"error: hidden_states.vllm.endpoint: {err}") from None
        log.info(
            f"hidden_states: using the running extraction server {base_url} (preflight: {seen})"
        )
        return contextlib.nullcontext(base_url)
    limit, why = startup_timeout_s(v.startup_timeout_s, card.model, card.revision)

    def launch(port: int) -> list[str]:  # hidden_states.vllm.port, else a free port chosen at start
        cmd = vllm_extract_serve(job, staging, longest, port)
        log.info(
            f"hidden_states: launching {' '.join(cmd)}\nhidden_states: start-up limit {limit:.0f}s ({why}); log {job.log_path}"
        )
        return cmd

    return ManagedServer(
        launch,
        launch_env("vllm", card.model, job.out / ".hf_cache"),
        server_url(v.host, v.port),
        job.log_path,
        limit,
    )


def generate_offline_data(job: ExtractionJob, base_url: str) -> None:
    """Feed the tokenized rows to the server at base_url with speculators' generate-offline-data;
    HiddenStatesError when it fails."""
    cfg = job.cfg
    v = cfg.vllm
    client = generate_offline_data_command(
        OfflineDataRun(
            f"{base_url}/v1",
            job.tokenized,
            job.out,
            v.concurrency,
            v.request_timeout_s,
            v.max_retries,
            validate=cfg.format != "fp8",
        )
    )
    log.info("hidden_states: running " + " ".join(client))
    code = subprocess.run(client).returncode  # its own tqdm bar shows rows/s
    if code != 0:
        where = f"the server at {base_url}" if v.endpoint else f"server log: {job.log_path}"
        raise HiddenStatesError(
            f"error: speculators generate-offline-data exited with {code}; {where}"
        )


def run_vllm(job: ExtractionJob, todo: dict[int, int]) -> None:
    """Backend vllm: `vllm serve` for extraction (launched, or hidden_states.vllm.endpoint), fed by
    speculators' generate-offline-data."""
    for i in todo:  # speculators skips any readable file; a stale or mismatched one must go first
        hs_path(job.out, i).unlink(missing_ok=True)
    # same filesystem: speculators' move is then an atomic rename
    staging = job.out / resume.VLLM_STAGING
    staging.mkdir(parents=True, exist_ok=True)
    longest = max(job.rows.with_format(None)["seq_len"])
    server = offline_server(job, todo, staging, longest)
    try:
        with server as base_url:
            generate_offline_data(job, base_url)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


LAYOUTS = {
    "bf16": "hs_{i}.safetensors: token_ids [L], hidden_states [L, 4, H] (inputs of the aux layers, then last layer pre-norm)",
    "fp8": "hs_{i}.safetensors (hs-connectors fp8): token_ids [L], hidden_states [L, 4, H] float8_e4m3fn, "
    "hidden_states_scales [L, 1, 1] float32 (inputs of the aux layers, then last layer pre-norm)",
}


def write_online(job: ExtractionJob, fingerprint: str) -> dict:
    """mode online: no states are stored. meta.json tells the train stage to make them itself; files
    an earlier offline run left are kept for a switch back (their fingerprint stays recorded).
    Returns the report."""
    cfg, out, aux_ids = job.cfg, job.out, job.aux_ids
    out.mkdir(parents=True, exist_ok=True)
    previous = read_json(out / "meta.json") if (out / "meta.json").exists() else {}
    files_fingerprint = (
        previous.get("fingerprint")
        if previous.get("mode", "offline") == "offline"
        else previous.get("files_fingerprint")
    )
    lengths = job.rows.with_format(None)["seq_len"]
    disk = plan.make_plan(
        sum(lengths),
        len(lengths),
        job.card.hidden_size,
        plan.PlanSettings(dtype_name=cfg.dtype, margin=cfg.disk_margin),
        free=plan.free_bytes(out),
        source="tokenized data",
    )
    write_meta(
        out,
        "hidden_states",
        cfg.model_dump(),
        complete=True,
        mode="online",
        format=cfg.format,
        states_fingerprint=fingerprint,
        files_fingerprint=files_fingerprint,
        fingerprint=files_fingerprint,
        key=previous.get("key"),  # of the files kept, as fingerprint is
        aux_layer_ids=aux_ids,
        online=cfg.online.model_dump(),
    )
    report = {
        "backend": None,
        "mode": "online",
        "format": cfg.format,
        "rows": len(lengths),
        "tokens": sum(lengths),
        "extracted_now": 0,
        "files_kept_from_offline": len(list(out.glob("hs_*.safetensors"))),
        "offline_bytes": {
            name: m["total_bytes"] for name, m in disk["modes"].items() if name != "online"
        },
        "free_bytes_before": disk["free_bytes"],
        "aux_layer_ids": aux_ids,
    }
    log.info(
        f"hidden_states: mode online, nothing stored ({sum(lengths):,} tokens would take "
        f"{report['offline_bytes']['offline_bf16'] / 1e9:.3f} GB in bf16, {report['offline_bytes']['offline_fp8'] / 1e9:.3f} GB in fp8)"
    )
    return report


def check_extraction_inputs(card: TargetCard, card_path: Path, tokenized_dir: Path) -> list[int]:
    """The card's aux layer ids, checked, once tokenized_dir is known to be made with the card's
    chat template; HiddenStatesError otherwise."""
    try:
        aux_ids = check_aux_layer_ids(card.aux_ids, card.num_layers)
    except ValueError as err:
        raise HiddenStatesError(f"error: {card_path}: {err}") from None
    tok_meta = tokenized_dir / "meta.json"
    if tok_meta.exists() and read_json(tok_meta).get("chat_template_sha256") not in (
        None,
        card.chat_template_sha256,
    ):
        raise HiddenStatesError(
            f"error: {tokenized_dir} was tokenized with another chat template than {card_path}'s target"
        )
    return aux_ids


def check_disk_for(job: ExtractionJob, work: resume.PendingWork, pack_len: int) -> int:
    """The free bytes before the run; HiddenStatesError, naming the cheaper modes that would fit,
    when the pending states do not fit in the output directory beside hidden_states.disk_margin."""
    cfg = job.cfg
    try:
        return check_disk(job.out, work.needed, cfg.disk_margin, work.reclaimable)
    except RuntimeError as err:
        disk = plan.make_plan(
            sum(work.todo.values()),
            len(work.todo),
            job.card.hidden_size,
            plan.PlanSettings(dtype_name=cfg.dtype, pack_len=pack_len, margin=cfg.disk_margin),
            free=plan.free_bytes(job.out),
        )
        fits = plan.cheaper_modes(disk, f"offline_{cfg.format}")
        hint = ("; these would fit: " + "; ".join(fits)) if fits else ""
        raise HiddenStatesError(
            f"error: {err}{hint} (`draftline plan` prints the figures)"
        ) from None


# the report's figures of this run only (speed, free disk space): they go to the run's record,
# out of the hashed report (draftline/core/machine.py)
RUN_FACTS = ("tokens_per_s", "free_bytes_before")


def offline_report(job: ExtractionJob, work: resume.PendingWork, elapsed: float, free: int) -> dict:
    """The report of an offline run: rows reused and extracted, its speed, and the stored format."""
    cfg, H = job.cfg, job.card.hidden_size
    tokens = sum(work.todo.values())
    return {
        "backend": cfg.backend,
        "rows": len(job.rows),
        "reused": work.done,
        "extracted_now": len(work.todo),
        "tokens_extracted_now": tokens,
        "tokens_per_s": round(tokens / elapsed, 1) if work.todo and elapsed > 0 else None,
        "removed_for_new_fingerprint": work.cleared,
        # existing files redone, by reason (unreadable: truncated or corrupt; other_tokens: ...),
        # with the first few named
        "redone": {reason: len(files) for reason, files in sorted(work.redone.items())},
        "redone_first": {reason: files[:5] for reason, files in sorted(work.redone.items())},
        "bytes_estimate": work.needed,
        "free_bytes_before": free,
        "mode": "offline",
        "format": cfg.format,
        "dtype": hs_format.storage_name(cfg.format, cfg.dtype),
        "bytes_per_token": hs_format.bytes_per_token(H, cfg.format, cfg.dtype),
        "aux_layer_ids": job.aux_ids,
    }


class Paths(NamedTuple):
    card: Path  # models/target/card.json
    tokenized: Path  # datasets/tokenized
    out: Path  # datasets/hidden_states
    log: Path  # the vLLM server's log (backend vllm), beside the stage's report


def extract_hidden_states(
    cfg: HiddenStatesConfig, card: TargetCard, paths: Paths, pack_len: int, verify_sample: int = 8
) -> dict:
    """The hidden_states stage's work (see the module docstring); returns its report. paths.card
    names the card in messages; paths.log takes the vLLM server's log; pack_len (train.pack_len)
    sizes the online mode's forwards in the refusal when the disk is short; verify_sample
    (resume.verify_sample) kept files are recomputed before extracting (spot_check.py)."""
    aux_ids = check_extraction_inputs(card, paths.card, paths.tokenized)
    rows = load_from_disk(str(paths.tokenized))
    job = ExtractionJob(
        cfg, card, aux_ids, rows, paths.tokenized, paths.out, paths.log, verify_sample
    )
    out = paths.out
    H, store_dtype = card.hidden_size, hs_format.storage_dtype(cfg.format, cfg.dtype)

    wanted = resume.derivation(cfg, card, aux_ids)
    if cfg.mode == "online":
        return write_online(job, wanted.key)
    resume.remove_temporaries(out)  # *.tmp and vLLM staging of a killed run: never finished files
    # Decide what to remove and redo, check the disk, and only then remove anything: a refusal
    # leaves every file in place.
    work = resume.pending_work(cfg, rows, out, wanted, H, store_dtype)
    free = check_disk_for(job, work, pack_len)
    for f in work.stale + work.extra:
        f.unlink()
    if work.cleared:
        log.info(f"hidden_states: removed {resume.cleared_text(work.cleared, work.why)}")

    meta = dict(
        mode="offline",
        format=cfg.format,
        fingerprint=wanted.key,
        key=wanted.record(),  # its parts: a later run names what changed
        aux_layer_ids=aux_ids,
        layout=LAYOUTS[cfg.format],
    )
    write_meta(out, "hidden_states", cfg.model_dump(), complete=False, **meta)
    todo = work.todo
    start = time.perf_counter()
    kept = [i for i in range(len(rows)) if i not in todo]
    checked = StatesCheck(
        job.verify_sample, not_run="resume.verify_sample is 0" if kept else "no file kept"
    )
    # kept files are recomputed whenever the stage reruns, also with nothing to extract: DVC
    # reruns it when what it depends on changed, which is when kept files need the proof
    if cfg.backend == "hf" and (todo or (kept and job.verify_sample > 0)):
        checked = run_hf(job, todo, kept)
    elif cfg.backend != "hf":
        checked.not_run = "backend vllm: the states come from a server, not recomputed here"
    if todo and cfg.backend != "hf":
        run_vllm(job, todo)
        missing, _ = resume.pending_rows(rows, out, H, store_dtype, False)
        if missing:
            raise HiddenStatesError(
                f"error: {len(missing)} rows still have no valid hidden states after generate-offline-data "
                f"(first: {sorted(missing)[:10]}); rerun to retry them"
            )
    elapsed = time.perf_counter() - start
    (out / BATCHES_FILE).unlink(missing_ok=True)  # complete: the batches of this run are done
    write_meta(out, "hidden_states", cfg.model_dump(), complete=True, **meta)
    report = offline_report(job, work, elapsed, free)
    report["spot_check"] = checked.as_dict()  # kept files recomputed before extracting
    log.info(
        f"hidden_states: {len(todo)} rows extracted ({report['tokens_per_s']} tok/s), {work.done} reused"
    )
    return report


def run(params, paths: Paths) -> dict:
    """Stage `hidden_states`: the states of every tokenized row by params.hidden_states, into
    paths.out (offline) or only its meta.json (online); the report. train.pack_len sizes the
    online mode's forwards named when the disk is short."""
    card = TargetCard.load(paths.card)
    verify = getattr(params, "resume", None)
    sample = verify.verify_sample if verify is not None else 8
    return extract_hidden_states(params.hidden_states, card, paths, params.train.pack_len, sample)
