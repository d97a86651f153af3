"""Stage `mix`: prepared datasets → the weighted, prefix-stable train split and a held-out eval split.

    python -m stages.mix datasets/prepared datasets/mixed reports/mix.json

Reads PREPARED_DIR/<name>.jsonl for every dataset in params.yaml and writes OUT_DIR/train.jsonl,
OUT_DIR/eval.jsonl (records of draftline/formats.py plus "partition": short|long) and
OUT_DIR/meta.json. Uses `samples`, `seed` and `mix.*`; the rule is in draftline/mixing.py.
"""

import sys
from pathlib import Path

from draftline.config import stage_params


def main(prepared_dir: str, out_dir: str, report_json: str) -> None:
    params = stage_params()
    from draftline.io import file_sha256, read_jsonl, write_json, write_jsonl, write_meta
    from draftline.mixing import mix_datasets

    pools, inputs = {}, {}
    for name in sorted(params.datasets):
        path = Path(prepared_dir) / f"{name}.jsonl"
        if not path.is_file():
            raise SystemExit(f"error: {path} not found; run `python -m stages.prepare {name} ...` first")
        pools[name] = list(read_jsonl(path))
        # A file from another dataset (renamed, stale) would silently mislabel the mix.
        if strays := sorted({row.get("source") for row in pools[name]} - {name}, key=str):
            raise SystemExit(f"error: {path} holds rows of source {strays}, expected only {name!r}")
        inputs[name] = file_sha256(path)
    cfg = params.mix
    try:
        train, eval_rows, report = mix_datasets(pools, cfg.weights, params.samples, cfg.eval_samples,
                                                cfg.long_threshold_tokens, params.seed)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    out = Path(out_dir)
    write_jsonl(out / "train.jsonl", train)
    write_jsonl(out / "eval.jsonl", eval_rows)
    write_json(report_json, report)
    write_meta(out, "mix", {"samples": params.samples, "seed": params.seed, "mix": cfg.model_dump()},
               inputs=inputs, counts={"train": len(train), "eval": len(eval_rows)})
    short = report["shortfall"]
    print(f"mix: train {len(train)} {report['train']['by_source']}, eval {len(eval_rows)}; "
          f"duplicates dropped {report['duplicates_dropped']['total']}"
          + (f"; SHORTFALL train {short['train']}, eval {short['eval']}" if any(short.values()) else ""))


if __name__ == "__main__":
    main(*sys.argv[1:])
