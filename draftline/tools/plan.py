"""`draftline plan`: the hidden-state plan of a params file before the spend (the rules:
draftline/hidden_states/plan.py).

    draftline plan                       # from params.yaml and whatever exists on disk
    draftline plan --hidden-size 7168 --samples 25000 --tokens-per-sample 4000   # any scale
    draftline plan --max-length 8192     # training on longer rows: tokens, disk, what it needs"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from draftline.core.errors import DraftlineError, entry_point
from draftline.hidden_states.plan import (
    HASHING_REPORT,
    LINK_TYPES,
    PlanSettings,
    add_dvc,
    dvc_cache_types,
    estimate_row_tokens,
    free_bytes,
    hashing_rates,
    length_plan,
    link_type,
    make_plan,
    render,
)
from draftline.params import Params

# by name: `python -m draftline.tools.plan` runs this module as __main__, a logger nothing sets up
log = logging.getLogger("draftline.tools.plan")


def token_counts(
    params: Params, tokenized: Path, prompts: Path, max_length: int | None = None
) -> tuple[int, int, str]:
    """(tokens, rows, where they came from). max_length: another tokenize.max_length than the
    params' (rows estimated from the prompts at that cap: the tokenized data holds rows cut at
    the old one)."""
    max_length = max_length or params.tokenize.max_length
    tokenized_here = (tokenized / "dataset_info.json").is_file() or (
        tokenized / "state.json"
    ).is_file()
    if tokenized_here and max_length == params.tokenize.max_length:
        from datasets import load_from_disk

        lengths = load_from_disk(str(tokenized)).with_format(None)["seq_len"]
        return sum(lengths), len(lengths), f"tokenized data {tokenized}"
    if prompts.is_file():
        from draftline.core.io import read_jsonl

        lengths = [
            estimate_row_tokens(p, params.regenerate.max_tokens, max_length)
            for p in read_jsonl(prompts)
        ]
        return sum(lengths), len(lengths), f"estimated from the prompts {prompts}"
    rows = params.samples
    return rows * max_length, rows, "upper bound: samples x tokenize.max_length"


def training_length(params: Params, args, card: Path) -> dict:
    """length_plan for tokenize.max_length (or --max-length), with the target's limits from its
    card's model config and the tokenize report's longest row where they are on disk."""
    from draftline.evaluate.context import served_context_limit

    limit = None
    if card.is_file():
        from draftline.core.card import TargetCard

        limit = served_context_limit(TargetCard.load(card).model)
    report = Path(args.tokenize_report)
    tokenized = json.loads(report.read_text()) if report.is_file() else {}
    check = tokenized.get("check") or {}
    return length_plan(
        args.max_length or params.tokenize.max_length,
        params.train.pack_len,
        limit,  # speculators' draft layer takes the target's max_position_embeddings
        limit,
        check.get("longest_before_cut"),
        check.get("share"),
    )


@entry_point
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="draftline plan", description=__doc__.split("\n\n")[0])
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
    ap.add_argument("--dvc-dir", default=".dvc", help="the repository's DVC config (cache.type)")
    ap.add_argument(
        "--cache-type",
        help="DVC link types to plan for, e.g. reflink (an XFS host), instead of cache.type",
    )
    ap.add_argument("--hashing-report", default=HASHING_REPORT, help="DVC's measured rates")
    ap.add_argument(
        "--hash-gbps", type=float, help="DVC's hashing rate, GB/s, instead of the report's"
    )
    ap.add_argument(
        "--max-length",
        type=int,
        help="plan for another tokenize.max_length: tokens, disk, and what longer rows need",
    )
    ap.add_argument("--tokenize-report", default="reports/tokenize.json")
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    args = ap.parse_args(argv)

    from draftline.core.card import TargetCard
    from draftline.params import load_params

    try:
        params = load_params(args.params)  # a ParamsError names each bad key
    except FileNotFoundError as err:
        raise DraftlineError(f"error: {err}") from None
    hidden_size = args.hidden_size
    if hidden_size is None:
        card = Path(args.card)
        if not card.is_file():
            raise DraftlineError(
                f"error: no {card} yet (run the target stage) and no --hidden-size given"
            )
        hidden_size = TargetCard.load(card).hidden_size
    if (args.samples is None) != (args.tokens_per_sample is None):
        raise DraftlineError("error: --samples and --tokens-per-sample go together")
    if args.samples is not None:
        tokens, rows = args.samples * args.tokens_per_sample, args.samples
        source = f"{args.samples:,} samples x {args.tokens_per_sample:,} tokens"
    else:
        tokens, rows, source = token_counts(
            params, Path(args.tokenized), Path(args.prompts), args.max_length
        )
    hs, train = params.hidden_states, params.train
    plan = make_plan(
        tokens,
        rows,
        hidden_size,
        PlanSettings(hs.dtype, train.pack_len, train.val_fraction, train.epochs, hs.disk_margin),
        free=round(args.free_gb * 1e9) if args.free_gb is not None else free_bytes(Path(args.out)),
        source=source,
    )
    if args.cache_type:
        types = [t.strip() for t in args.cache_type.split(",")]
        if bad := [t for t in types if t not in LINK_TYPES]:
            raise DraftlineError(f"error: --cache-type {bad}: DVC knows {', '.join(LINK_TYPES)}")
        link = types[0]  # what the named host does: its filesystem is not this one
    else:
        types = dvc_cache_types(Path(args.dvc_dir))
        link = link_type(types, Path(args.out))
    rates = hashing_rates(Path(args.hashing_report))
    if args.hash_gbps is not None:
        rates = {**rates, "hash_gbps": args.hash_gbps, "hash_from": "--hash-gbps"}
    add_dvc(plan, types, link, rates)
    plan["length"] = training_length(params, args, Path(args.card))
    log.info(json.dumps(plan, indent=2) if args.json else render(plan))


if __name__ == "__main__":
    main(sys.argv[1:])
