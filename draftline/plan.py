"""The hidden-state plan before the spend: tokens, bytes per token of each format, total disk for
offline bf16 / offline fp8 / online, free disk where the states would go, and the target forwards
online mode costs per epoch. No model download, no GPU, no torch.

    python -m draftline.plan                       # from params.yaml and whatever exists on disk
    python -m draftline.plan --hidden-size 7168 --samples 25000 --tokens-per-sample 4000   # any scale

Tokens come from the tokenized data when it is there; else from the mixed prompts (about 4
characters a token, as the prepare filter counts, plus regenerate.max_tokens per assistant turn,
capped at tokenize.max_length); else samples x tokenize.max_length, an upper bound. The hidden
size comes from models/target/card.json, or --hidden-size.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from draftline.hs_format import bytes_per_token, minimum_bytes_per_token

if TYPE_CHECKING:
    from draftline.config import Params

CHARS_PER_TOKEN = 4  # the prepare stage's prompt-length estimate


def estimate_row_tokens(prompt: dict, max_tokens: int, max_length: int) -> int:
    """A mixed prompt's tokenized length before regeneration: its text at ~4 characters a token,
    each assistant turn at most max_tokens, the row at most max_length."""
    messages = prompt.get("messages") or []
    chars = sum(len(str(m.get("content") or "")) for m in messages if m.get("role") != "assistant")
    chars += len(json.dumps(prompt["tools"])) if prompt.get("tools") else 0
    answers = max(1, sum(m.get("role") == "assistant" for m in messages))
    return min(max_length, math.ceil(chars / CHARS_PER_TOKEN) + answers * max_tokens)


def free_bytes(path: Path) -> int:
    """Free space of the filesystem `path` is (or would be) on."""
    path = Path(path).resolve()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def packed_forwards(tokens: int, pack_len: int) -> int:
    """Packed batches of pack_len tokens that hold `tokens` (packing rarely fills them all: a floor)."""
    return math.ceil(tokens / pack_len)


def make_plan(
    tokens: int,
    rows: int,
    hidden_size: int,
    *,
    dtype_name: str = "bfloat16",
    pack_len: int = 1024,
    val_fraction: float = 0.1,
    epochs: int = 1,
    free: int | None = None,
    margin: float = 1.1,
    source: str = "",
) -> dict:
    """Disk of each mode and what online costs instead. Bytes are the files' content (states,
    fp8 scales, int64 token ids); headers add a few hundred bytes a file."""
    val_tokens = round(tokens * val_fraction)
    modes = {}
    for fmt in ("bf16", "fp8"):
        per_token = bytes_per_token(hidden_size, fmt, dtype_name)
        total = tokens * per_token
        modes[f"offline_{fmt}"] = {
            "bytes_per_token": per_token,
            "minimum_bytes_per_token": minimum_bytes_per_token(hidden_size, fmt, dtype_name),
            "total_bytes": total,
            "fits": None if free is None else free >= total * margin,
        }
    forwards = packed_forwards(tokens - val_tokens, pack_len) + packed_forwards(
        val_tokens, pack_len
    )
    modes["online"] = {
        "bytes_per_token": 0,
        "total_bytes": 0,
        "fits": True,
        # train + validation batches, each one target forward of up to pack_len tokens
        "target_forwards_per_epoch": forwards,
        "target_tokens_per_epoch": tokens,
        "target_forwards_total": forwards * epochs,
    }
    return {
        "tokens": tokens,
        "rows": rows,
        "tokens_from": source,
        "hidden_size": hidden_size,
        "free_bytes": free,
        "disk_margin": margin,
        "pack_len": pack_len,
        "epochs": epochs,
        "modes": modes,
    }


def cheaper_modes(plan: dict, current: str) -> list[str]:
    """The modes that would fit, as params to set, for the stage's refusal message."""
    out = []
    for name, mode in plan["modes"].items():
        if name == current or not mode["fits"]:
            continue
        if name == "online":
            out.append(
                f"hidden_states.mode: online (no files; the target runs during training, "
                f"~{mode['target_forwards_per_epoch']:,} forwards of <= {plan['pack_len']} tokens per epoch "
                f"at train.pack_len {plan['pack_len']})"
            )
        else:
            out.append(
                f"hidden_states.format: {name.removeprefix('offline_')} ({mode['total_bytes'] / 1e9:,.1f} GB)"
            )
    return out


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:,.1f} {unit}" if unit != "B" else f"{n:,.0f} B"
        n /= 1000
    return str(n)


def render(plan: dict) -> str:
    free = plan["free_bytes"]
    lines = [
        f"tokens: {plan['tokens']:,} in {plan['rows']:,} rows ({plan['tokens_from']}); hidden size {plan['hidden_size']}",
        f"free disk: {human(free) if free is not None else 'unknown'} (needed: total x disk_margin {plan['disk_margin']})",
        "",
        "| mode | bytes/token | / format minimum | total disk | fits |",
        "|---|---|---|---|---|",
    ]
    for name, mode in plan["modes"].items():
        if name == "online":
            continue
        ratio = mode["bytes_per_token"] / mode["minimum_bytes_per_token"]
        fits = "?" if mode["fits"] is None else ("yes" if mode["fits"] else "no")
        lines.append(
            f"| {name.replace('_', ' ')} | {mode['bytes_per_token']:,} | {ratio:.4f} | {human(mode['total_bytes'])} | {fits} |"
        )
    online = plan["modes"]["online"]
    lines.append("| online | 0 | - | 0 B | yes |")
    lines += [
        "",
        f"online: {online['target_forwards_per_epoch']:,} target forwards per epoch (packed batches of <= "
        f"{plan['pack_len']} tokens, train + validation), {online['target_tokens_per_epoch']:,} tokens through the "
        f"target per epoch, {online['target_forwards_total']:,} over {plan['epochs']} epochs",
    ]
    return "\n".join(lines)


def token_counts(params: Params, tokenized: Path, prompts: Path) -> tuple[int, int, str]:
    """(tokens, rows, where they came from)."""
    if (tokenized / "dataset_info.json").is_file() or (tokenized / "state.json").is_file():
        from datasets import load_from_disk

        lengths = load_from_disk(str(tokenized)).with_format(None)["seq_len"]
        return sum(lengths), len(lengths), f"tokenized data {tokenized}"
    if prompts.is_file():
        from draftline.io import read_jsonl

        lengths = [
            estimate_row_tokens(p, params.regenerate.max_tokens, params.tokenize.max_length)
            for p in read_jsonl(prompts)
        ]
        return sum(lengths), len(lengths), f"estimated from the prompts {prompts}"
    rows = params.samples
    return rows * params.tokenize.max_length, rows, "upper bound: samples x tokenize.max_length"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m draftline.plan", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--card", default="models/target/card.json", help="target card (hidden size)")
    ap.add_argument("--tokenized", default="datasets/tokenized")
    ap.add_argument("--prompts", default="datasets/prompts/train.jsonl")
    ap.add_argument(
        "--out", default="datasets/hidden_states", help="where the states would go (free disk)"
    )
    ap.add_argument("--hidden-size", type=int, help="instead of the card's")
    ap.add_argument(
        "--samples", type=int, help="with --tokens-per-sample: a plan at any scale, no data needed"
    )
    ap.add_argument("--tokens-per-sample", type=int)
    ap.add_argument(
        "--free-gb", type=float, help="free disk to plan for, instead of --out's filesystem"
    )
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    args = ap.parse_args(argv)

    from draftline.card import TargetCard
    from draftline.config import ParamsError, load_params

    try:
        params = load_params(args.params)
    except (ParamsError, FileNotFoundError) as err:
        raise SystemExit(f"error: {err}") from None
    hidden_size = args.hidden_size
    if hidden_size is None:
        card = Path(args.card)
        if not card.is_file():
            raise SystemExit(
                f"error: no {card} yet (run the target stage) and no --hidden-size given"
            )
        hidden_size = TargetCard.load(card).hidden_size
    if (args.samples is None) != (args.tokens_per_sample is None):
        raise SystemExit("error: --samples and --tokens-per-sample go together")
    if args.samples is not None:
        tokens, rows = args.samples * args.tokens_per_sample, args.samples
        source = f"{args.samples:,} samples x {args.tokens_per_sample:,} tokens"
    else:
        tokens, rows, source = token_counts(params, Path(args.tokenized), Path(args.prompts))
    hs, train = params.hidden_states, params.train
    plan = make_plan(
        tokens,
        rows,
        hidden_size,
        dtype_name=hs.dtype,
        pack_len=train.pack_len,
        val_fraction=train.val_fraction,
        epochs=train.epochs,
        free=round(args.free_gb * 1e9) if args.free_gb is not None else free_bytes(Path(args.out)),
        margin=hs.disk_margin,
        source=source,
    )
    print(json.dumps(plan, indent=2) if args.json else render(plan))


if __name__ == "__main__":
    main(sys.argv[1:])
