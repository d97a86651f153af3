"""Acceptance by context length of a workspace's draft on the long-context set, outside the DVC
run: the evaluate stage's own measurement (draftline/evaluate/acceptance.py, built-in engine) over
rows of `pydoc_long` (draftline/data/pydoc_long.py) at the lengths given, for a run whose params
leave the set off (the SmolLM2 recipe's). Writes OUT (JSON): the buckets with their intervals,
reasoning vs answer, the draft's trained length and the prompts past it, the source text's
version, the wall time it took, and `free`: the workspace's benchmark.free methods replayed over
the same greedy outputs (draftline/evaluate/lookup.py: n-gram prompt lookup, where a long prompt
gives it the most to copy), overall and per prompt.

    python -m devtools.context_eval <workspace> reports/recipe_smollm2/context_d500-emb-head-verdict.json \
        --lengths 512 1024 2048 4096 --per-length 2 --buckets 1024 2048 4096

WORKSPACE holds the run (models/target/card.json, models/draft, datasets/tokenized, params.yaml);
the trained length comes from its tokenized rows and train.pack_len where the draft's meta.json
does not record it (a draft trained before it did).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import yaml

from draftline.core.io import write_json, write_jsonl


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workspace", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    ap.add_argument("--per-length", type=int, default=2)
    ap.add_argument("--kinds", nargs="+", default=["document", "history"])
    ap.add_argument("--buckets", type=int, nargs="+", default=[1024, 2048, 4096])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=3)
    args = ap.parse_args()

    from draftline.benchmark.config import BenchmarkConfig
    from draftline.core.card import TargetCard
    from draftline.data.pydoc_long import PydocLongConfig, build_rows, reference
    from draftline.evaluate import acceptance
    from draftline.evaluate.config import EvaluateConfig
    from draftline.evaluate.context import beyond_trained
    from draftline.evaluate.lookup import free_acceptance
    from draftline.train.data import trained_rows

    out = args.out.resolve()
    workspace = args.workspace.resolve()
    os.chdir(workspace)  # the card names the target relative to its workspace
    params = yaml.safe_load(Path("params.yaml").read_text())
    build = PydocLongConfig(lengths=args.lengths, per_length=args.per_length, kinds=args.kinds)
    rows = [{**row, "source": "pydoc_long"} for row in build_rows(build)]
    rows = [{**row, "source_detail": row["id"].rsplit("-", 1)[0]} for row in rows]
    cfg = EvaluateConfig(
        engine="hf", k=args.k, max_new_tokens=args.max_new_tokens, context_buckets=args.buckets
    )
    card = TargetCard.load("models/target/card.json")
    draft = Path("models/draft")
    trained = acceptance.trained_longest_row(draft)
    rows_trained = trained_rows(Path("datasets/tokenized"), params["train"]["pack_len"])
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="draftline-context-") as work:
        write_jsonl(Path(work) / "eval.jsonl", rows)
        run = acceptance.evaluate_draft(cfg, card, draft, Path(work) / "eval.jsonl", 0)
    seconds = round(time.perf_counter() - started, 1)
    report = run.report
    if trained is None:  # a draft trained before train recorded it: from its data and pack_len
        lengths = {i: len(ids) + len(run.greedy.get(i, [])) for i, ids in run.prompt_ids.items()}
        report["trained_length"] = beyond_trained(lengths, rows_trained["longest"])
    free = BenchmarkConfig.model_validate(params.get("benchmark") or {}).free
    replayed = free_acceptance(free, run.prompt_ids, run.greedy, cfg.k)
    ref = reference()
    write_json(
        out,
        {
            "workspace": str(args.workspace),
            "set": {
                "builtin": "pydoc_long",
                **build.model_dump(),
                "python": ref.python,
                "sha256": ref.sha256,
            },  # fmt: skip
            "prompt_tokens": {row_id: len(ids) for row_id, ids in run.prompt_ids.items()},
            "k": cfg.k,
            "max_new_tokens": cfg.max_new_tokens,
            "acceptance_length": report["acceptance_length"],
            "by_context": report["by_context"],
            "by_span": report["by_span"],
            "per_source_detail": report.get("per_source_detail"),
            "trained_length": report["trained_length"],
            "trained_rows": rows_trained,
            "lossless_checked_prompts": report["lossless_checked_prompts"],
            "per_prompt": report.get("per_prompt_acceptance"),
            "free": replayed,
            "seconds": seconds,
        },
    )
    print(f"context_eval: {len(rows)} prompts in {seconds} s -> {out}")


if __name__ == "__main__":
    main()
