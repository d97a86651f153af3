"""The hidden_states stage's work: capture the target's aux + last hidden states for every tokenized row.

Backend `hf` runs the target here (CPU, one GPU, or several with `device_map`); backend `vllm`
launches `vllm serve` for extraction (or uses hidden_states.vllm.endpoint, checked first) and hands
the rows to speculators' `generate-offline-data`. `format: fp8` stores hs-connectors' FP8 layout
(vLLM: its FP8 connector). `mode: online` stores nothing: meta.json tells the train stage to make
the states itself, the report gives the estimate. Valid files are kept, missing, truncated or
corrupt ones (re)done; what is removed is planned, then the disk is checked, and only then are
files removed (draftline/hidden_states/hidden.py holds the file format, the checks and the capture).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from draftline.core.card import TargetCard
from draftline.core.config import resolve_device
from draftline.core.io import read_json, write_meta
from draftline.engines.commands import generate_offline_data_command, vllm_extract_command
from draftline.engines.config import vllm_engine
from draftline.engines.preflight import PreflightError, preflight_extraction
from draftline.engines.servers import ManagedServer, launch_env, server_url, startup_timeout_s
from draftline.hidden_states import formats as hs_format
from draftline.hidden_states import plan
from draftline.target.model import load_target_model

if TYPE_CHECKING:
    from draftline.hidden_states.config import HiddenStatesConfig


def run_hf(
    cfg: HiddenStatesConfig,
    card: TargetCard,
    rows,
    todo: dict[int, int],
    out: Path,
    aux_ids: list[int],
    store_dtype,
) -> int:
    """Backend hf: the target runs here, batch by batch; returns the tokens done."""
    # torch (and hidden.py) load on first use: backend vllm and the probe run without them
    import torch
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    from draftline.hidden_states import hidden

    device = "cuda" if cfg.device_map else resolve_device(cfg.device)
    compute = (
        cfg.compute_dtype
        if cfg.compute_dtype != "auto"
        else (cfg.dtype if device == "cuda" else "float32")
    )
    model = load_target_model(card, device, hidden.DTYPES[compute], cfg.device_map)
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

        return hidden.extract(
            model, rows, todo, aux_ids, out, store_dtype, cfg.token_budget, advance
        )


def vllm_extract_serve(
    cfg: HiddenStatesConfig,
    card: TargetCard,
    aux_ids: list[int],
    staging: Path,
    longest: int,
    port: int,
) -> list[str]:
    """The `vllm serve` command for extraction on `port`, its states written under staging;
    max_model_len defaults to the longest row + 1."""
    v = cfg.vllm
    return vllm_extract_command(
        vllm_engine(),
        card.model,
        card.revision,
        aux_ids,
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
    )


def extraction_server(
    cfg: HiddenStatesConfig,
    card: TargetCard,
    rows,
    todo: dict[int, int],
    out: Path,
    aux_ids: list[int],
    log_path: Path,
    staging: Path,
    longest: int,
):
    """The extraction server, as a context manager giving its base URL: hidden_states.vllm.endpoint
    (preflight-checked with the first row to do), else `vllm serve` launched with its log at log_path."""
    v = cfg.vllm
    if v.endpoint:  # already running: checked with one probe row, not started
        base_url = v.endpoint.rstrip("/")
        probe = rows.with_format(None)[min(todo)]["input_ids"]
        try:
            seen = preflight_extraction(
                base_url, card, aux_ids, probe, v.request_timeout_s, v.max_retries + 1
            )
        except PreflightError as err:
            raise SystemExit(f"error: hidden_states.vllm.endpoint: {err}") from None
        print(f"hidden_states: using the running extraction server {base_url} (preflight: {seen})")
        return nullcontext(base_url)
    limit, why = startup_timeout_s(v.startup_timeout_s, card.model, card.revision)

    def launch(port: int) -> list[str]:  # hidden_states.vllm.port, else a free port chosen at start
        cmd = vllm_extract_serve(cfg, card, aux_ids, staging, longest, port)
        print(
            f"hidden_states: launching {' '.join(cmd)}\nhidden_states: start-up limit {limit:.0f}s ({why}); log {log_path}"
        )
        return cmd

    return ManagedServer(
        launch,
        launch_env("vllm", card.model, out / ".hf_cache"),
        server_url(v.host, v.port),
        log_path,
        limit,
        say=print,
    )


def generate_offline_data(
    cfg: HiddenStatesConfig, tokenized_dir: str, out: Path, base_url: str, log_path: Path
) -> None:
    """Feed the tokenized rows to the server at base_url with speculators' generate-offline-data;
    SystemExit when it fails."""
    v = cfg.vllm
    client = generate_offline_data_command(
        f"{base_url}/v1",
        Path(tokenized_dir),
        out,
        v.concurrency,
        v.request_timeout_s,
        v.max_retries,
        validate=cfg.format != "fp8",
    )
    print("hidden_states: running", " ".join(client))
    code = subprocess.run(client).returncode  # its own tqdm bar shows rows/s
    if code != 0:
        where = f"the server at {base_url}" if v.endpoint else f"server log: {log_path}"
        raise SystemExit(f"error: speculators generate-offline-data exited with {code}; {where}")


def run_vllm(
    cfg: HiddenStatesConfig,
    card: TargetCard,
    tokenized_dir: str,
    rows,
    todo: dict[int, int],
    out: Path,
    aux_ids: list[int],
    log_path: Path,
) -> None:
    """Backend vllm: `vllm serve` for extraction (launched, or hidden_states.vllm.endpoint), fed by
    speculators' generate-offline-data."""
    from draftline.hidden_states import hidden

    for i in todo:  # speculators skips any readable file; a stale or mismatched one must go first
        hidden.hs_path(out, i).unlink(missing_ok=True)
    staging = (
        out / hidden.VLLM_STAGING
    )  # same filesystem: speculators' move is then an atomic rename
    staging.mkdir(parents=True, exist_ok=True)
    longest = max(rows.with_format(None)["seq_len"])
    server = extraction_server(cfg, card, rows, todo, out, aux_ids, log_path, staging, longest)
    try:
        with server as base_url:
            generate_offline_data(cfg, tokenized_dir, out, base_url, log_path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


LAYOUTS = {
    "bf16": "hs_{i}.safetensors: token_ids [L], hidden_states [L, 4, H] (inputs of the aux layers, then last layer pre-norm)",
    "fp8": "hs_{i}.safetensors (hs-connectors fp8): token_ids [L], hidden_states [L, 4, H] float8_e4m3fn, "
    "hidden_states_scales [L, 1, 1] float32 (inputs of the aux layers, then last layer pre-norm)",
}


def write_online(
    cfg: HiddenStatesConfig, card: TargetCard, rows, out: Path, fingerprint: str, aux_ids: list[int]
) -> dict:
    """mode online: no states are stored. meta.json tells the train stage to make them itself; files
    an earlier offline run left are kept for a switch back (their fingerprint stays recorded).
    Returns the report."""
    out.mkdir(parents=True, exist_ok=True)
    previous = read_json(out / "meta.json") if (out / "meta.json").exists() else {}
    files_fingerprint = (
        previous.get("fingerprint")
        if previous.get("mode", "offline") == "offline"
        else previous.get("files_fingerprint")
    )
    lengths = rows.with_format(None)["seq_len"]
    the_plan = plan.make_plan(
        sum(lengths),
        len(lengths),
        card.hidden_size,
        dtype_name=cfg.dtype,
        free=plan.free_bytes(out),
        margin=cfg.disk_margin,
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
            name: m["total_bytes"] for name, m in the_plan["modes"].items() if name != "online"
        },
        "free_bytes_before": the_plan["free_bytes"],
        "aux_layer_ids": aux_ids,
    }
    print(
        f"hidden_states: mode online, nothing stored ({sum(lengths):,} tokens would take "
        f"{report['offline_bytes']['offline_bf16'] / 1e9:.3f} GB in bf16, {report['offline_bytes']['offline_fp8'] / 1e9:.3f} GB in fp8)"
    )
    return report


def check_extraction_inputs(card: TargetCard, card_path: str, tokenized_dir: str) -> list[int]:
    """The card's aux layer ids, checked, once tokenized_dir is known to be made with the card's
    chat template; SystemExit otherwise."""
    from draftline.hidden_states import hidden

    try:
        aux_ids = hidden.check_aux_layer_ids(card.aux_ids, card.num_layers)
    except ValueError as err:
        raise SystemExit(f"error: {card_path}: {err}") from None
    tok_meta = Path(tokenized_dir) / "meta.json"
    if tok_meta.exists() and read_json(tok_meta).get("chat_template_sha256") not in (
        None,
        card.chat_template_sha256,
    ):
        raise SystemExit(
            f"error: {tokenized_dir} was tokenized with another chat template than {card_path}'s target"
        )
    return aux_ids


@dataclass(frozen=True)
class ExtractionPlan:
    """What an offline run redoes and removes, planned before any file is removed: the rows to
    extract (index -> tokens), the rows kept, the files to remove, and the bytes it takes."""

    todo: dict[int, int]
    done: int
    stale: list[Path]  # made for another target, aux layers, dtype or format
    extra: list[Path]  # rows past the end: `samples` shrank
    cleared: int  # stale hidden-state files (the batch plan file not counted)
    needed: int
    reclaimable: int  # bytes the removed and overwritten files free
    # files that exist but are redone, by reason (truncated, other tokens, ...): their names
    redone: dict[str, list[str]]


def plan_extraction(
    cfg: HiddenStatesConfig, rows, out: Path, fingerprint: str, H: int, store_dtype
) -> ExtractionPlan:
    """What to remove and redo in out (ExtractionPlan), printed; nothing is removed yet."""
    from draftline.hidden_states import hidden

    stale = hidden.stale_files(
        out, fingerprint
    )  # made for another target, aux layers, dtype or format
    redone: dict[str, list[str]] = {}
    if stale:
        todo, done, extra = hidden.all_rows(rows), 0, []
    else:
        todo, done = hidden.pending_rows(
            rows, out, H, store_dtype, cfg.verify_existing == "full", False, redone
        )
        extra = hidden.extra_files(out, len(rows))  # rows past the end: `samples` shrank
    cleared = sum(f.name != hidden.PLAN_FILE for f in stale)
    overwritten = [hidden.hs_path(out, i) for i in todo]
    reclaimable = sum(f.stat().st_size for f in stale + extra + overwritten if f.exists())
    needed = hidden.estimate_bytes(list(todo.values()), H, store_dtype)
    print(
        f"hidden_states: {done} rows done, {len(todo)} to extract: {sum(todo.values()):,} tokens x "
        f"{hs_format.bytes_per_token(H, cfg.format, cfg.dtype):,} B ({cfg.format}) = {needed / 1e9:.3f} GB"
        + (
            f"; {cleared} files made for another target, aux layers, dtype or format to remove"
            if cleared
            else ""
        )
    )
    for reason, files in sorted(redone.items()):
        print(
            f"hidden_states: {len(files)} existing files redone ({reason}), first: "
            + "; ".join(files[:3])
        )
    return ExtractionPlan(todo, done, stale, extra, cleared, needed, reclaimable, redone)


def check_disk_for(
    cfg: HiddenStatesConfig, out: Path, work: ExtractionPlan, H: int, pack_len: int
) -> int:
    """The free bytes before the run; SystemExit, naming the cheaper modes that would fit, when
    the planned states do not fit in out beside hidden_states.disk_margin."""
    from draftline.hidden_states import hidden

    try:
        return hidden.check_disk(out, work.needed, cfg.disk_margin, work.reclaimable)
    except RuntimeError as err:
        the_plan = plan.make_plan(
            sum(work.todo.values()),
            len(work.todo),
            H,
            dtype_name=cfg.dtype,
            free=plan.free_bytes(out),
            margin=cfg.disk_margin,
            pack_len=pack_len,
        )
        fits = plan.cheaper_modes(the_plan, f"offline_{cfg.format}")
        hint = ("; these would fit: " + "; ".join(fits)) if fits else ""
        raise SystemExit(f"error: {err}{hint} (`draftline plan` prints the figures)") from None


def offline_report(
    cfg: HiddenStatesConfig,
    n_rows: int,
    work: ExtractionPlan,
    tokens: int,
    elapsed: float,
    free: int,
    H: int,
    aux_ids: list[int],
) -> dict:
    """The report of an offline run: rows reused and extracted, its speed, and the stored format."""
    return {
        "backend": cfg.backend,
        "rows": n_rows,
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
        "aux_layer_ids": aux_ids,
    }


def extract_hidden_states(
    cfg: HiddenStatesConfig,
    card: TargetCard,
    card_path: str,
    tokenized_dir: str,
    out_dir: str,
    log_path: Path,
    pack_len: int,
) -> dict:
    """The hidden_states stage's work (see the module docstring); returns its report. card_path names
    the card in messages; log_path takes the vLLM server's log; pack_len (train.pack_len) sizes the
    other modes' estimate shown when the disk is short."""
    from datasets import load_from_disk
    from draftline.hidden_states import hidden

    aux_ids = check_extraction_inputs(card, card_path, tokenized_dir)
    rows = load_from_disk(tokenized_dir)
    out = Path(out_dir)
    H, store_dtype = card.hidden_size, hs_format.storage_dtype(cfg.format, cfg.dtype)

    fingerprint = hidden.fingerprint(card, hs_format.storage_name(cfg.format, cfg.dtype))
    if cfg.mode == "online":
        return write_online(cfg, card, rows, out, fingerprint, aux_ids)
    hidden.remove_temporaries(out)  # *.tmp and vLLM staging of a killed run: never finished files
    # Plan what to remove and redo, check the disk, and only then remove anything: a refusal
    # leaves every file in place.
    work = plan_extraction(cfg, rows, out, fingerprint, H, store_dtype)
    free = check_disk_for(cfg, out, work, H, pack_len)
    for f in work.stale + work.extra:
        f.unlink()
    if work.cleared:
        print(
            f"hidden_states: removed {work.cleared} files made for another target, aux layers, dtype or format"
        )

    meta = dict(
        mode="offline",
        format=cfg.format,
        fingerprint=fingerprint,
        aux_layer_ids=aux_ids,
        layout=LAYOUTS[cfg.format],
    )
    write_meta(out, "hidden_states", cfg.model_dump(), complete=False, **meta)
    todo = work.todo
    start, tokens = time.perf_counter(), sum(todo.values())
    if todo and cfg.backend == "hf":
        run_hf(cfg, card, rows, todo, out, aux_ids, store_dtype)
    elif todo:
        run_vllm(cfg, card, tokenized_dir, rows, todo, out, aux_ids, log_path)
        missing, _ = hidden.pending_rows(rows, out, H, store_dtype, False)
        if missing:
            raise SystemExit(
                f"error: {len(missing)} rows still have no valid hidden states after generate-offline-data "
                f"(first: {sorted(missing)[:10]}); rerun to retry them"
            )
    elapsed = time.perf_counter() - start
    (out / hidden.PLAN_FILE).unlink(missing_ok=True)  # complete: the batch plan of this run is done
    write_meta(out, "hidden_states", cfg.model_dump(), complete=True, **meta)
    report = offline_report(cfg, len(rows), work, tokens, elapsed, free, H, aux_ids)
    print(
        f"hidden_states: {len(todo)} rows extracted ({report['tokens_per_s']} tok/s), {work.done} reused"
    )
    return report


class Paths(NamedTuple):
    card: Path  # models/target/card.json
    tokenized: Path  # datasets/tokenized
    out: Path  # datasets/hidden_states
    log: Path  # the vLLM server's log (backend vllm), beside the stage's report


def run(params, paths: Paths) -> dict:
    """Stage `hidden_states`: the states of every tokenized row by params.hidden_states, into
    paths.out (offline) or only its meta.json (online); the report. train.pack_len sizes the
    online mode's forwards in the report's plan."""
    card = TargetCard.load(paths.card)
    return extract_hidden_states(
        params.hidden_states,
        card,
        str(paths.card),
        str(paths.tokenized),
        str(paths.out),
        paths.log,
        params.train.pack_len,
    )
