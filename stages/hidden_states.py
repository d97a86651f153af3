"""Stage `hidden_states`: capture the target's aux + last hidden states for every tokenized row.

    python -m stages.hidden_states models/target/card.json datasets/tokenized datasets/hidden_states reports/hidden_states.json

Resumable (persist: true in dvc.yaml): valid files are kept, missing, truncated or corrupt ones
(re)done, so growing `samples` extracts only the new rows. Refuses to start when the disk cannot
hold the estimate.
"""

import sys
import time
from pathlib import Path

from draftline.config import stage_params


def main(card_path: str, tokenized_dir: str, out_dir: str, report_path: str) -> None:
    params = stage_params()
    cfg = params.hidden_states
    from datasets import load_from_disk
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from draftline import hidden
    from draftline.io import read_json, write_json, write_meta
    from draftline.target import load_target, resolve_device

    card = read_json(card_path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.tmp"):  # a kill mid-write leaves only temp files
        stale.unlink()
    rows = load_from_disk(tokenized_dir).with_format(None)
    token_ids = rows["input_ids"]
    H = card["hidden_size"]
    store_dtype = hidden.DTYPES[cfg.dtype]

    todo = {i: len(ids) for i, ids in enumerate(token_ids) if not hidden.is_valid_file(hidden.hs_path(out, i), ids, H)}
    # stale files of rows that no longer exist (samples shrank) are removed so outputs match rows
    for f in out.glob("hs_*.safetensors"):
        if int(f.stem[3:]) >= len(token_ids):
            f.unlink()
    needed = hidden.estimate_bytes(list(todo.values()), H, store_dtype)
    print(f"hidden_states: {len(token_ids) - len(todo)} rows done, {len(todo)} to extract, "
          f"{sum(todo.values())} tokens x 4 x {H} x {store_dtype.itemsize} B = {needed / 1e6:.1f} MB")
    hidden.check_disk(out, needed, cfg.disk_margin)

    device = resolve_device(cfg.device)
    compute_dtype = store_dtype if device == "cuda" else hidden.DTYPES["float32"]
    model, _ = load_target(card, device=device, dtype=compute_dtype)
    start, done_tokens = time.perf_counter(), 0
    with Progress(TextColumn("hidden states"), BarColumn(), TextColumn("{task.completed}/{task.total} rows  {task.fields[tps]:.0f} tok/s"), TimeRemainingColumn()) as bar:
        task = bar.add_task("hs", total=len(todo), tps=0.0)
        for batch in hidden.token_budget_batches(todo, cfg.token_budget):
            states = hidden.capture(model, [token_ids[i] for i in batch], card["aux_layer_ids"])
            for i, hs in zip(batch, states, strict=True):
                hidden.save_hidden_states(hidden.hs_path(out, i), token_ids[i], hs, store_dtype)
            done_tokens += sum(todo[i] for i in batch)
            bar.update(task, advance=len(batch), tps=done_tokens / (time.perf_counter() - start))
    elapsed = time.perf_counter() - start
    write_meta(out, "hidden_states", cfg.model_dump(), aux_layer_ids=card["aux_layer_ids"], layout="hs_{i}.safetensors: token_ids [L], hidden_states [L, 4, H] (3 aux + last pre-norm)")
    write_json(report_path, {
        "rows": len(token_ids),
        "extracted_now": len(todo),
        "reused": len(token_ids) - len(todo),
        "tokens_extracted_now": done_tokens,
        "tokens_per_s": round(done_tokens / elapsed, 1) if elapsed > 0 else None,
        "bytes_estimate": needed,
        "dtype": cfg.dtype,
        "aux_layer_ids": card["aux_layer_ids"],
    })


if __name__ == "__main__":
    main(*sys.argv[1:])
