"""The serving verdict again, from a benchmark's recorded sweep, without starting a server: at
another load, with other speedup goals, or with the samples forecast over more runs' points.

    draftline verdict reports/benchmark.detail.json --serve-concurrency 16
    draftline verdict reports/benchmark.detail.json --points reports/recipe_smollm2/acceptance_vs_samples.json --points-k 3
    draftline verdict DETAIL --goals 1.0 1.5 --out reports/recipe_smollm2/verdict.json

DETAIL is a `benchmark.detail.json` (or a recipe's `verdict_NAME.json`): its levels hold every
load and k measured. The decision is draftline/benchmark/verdict.py's, as the stage makes it.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from types import SimpleNamespace

from draftline.benchmark.sweep import levels_from
from draftline.benchmark.verdict import decide
from draftline.core.errors import DraftlineError, entry_point
from draftline.core.io import read_json, write_json

# by name: `python -m draftline.tools.verdict` runs this module as __main__, a logger nothing sets up
log = logging.getLogger("draftline.tools.verdict")


def read_points(paths: list[str], k: int | None) -> list[dict]:
    """The acceptance-vs-samples points, each with the k it was measured at (--points-k where a
    file does not say)."""
    points = []
    for path in paths:
        for row in read_json(path):
            if "samples" not in row or "acceptance_length" not in row:
                raise ValueError(f"{path}: a point needs `samples` and `acceptance_length`: {row}")
            at_k = row.get("k", k)
            if at_k is None:
                raise ValueError(f"{path}: its points carry no `k`: give --points-k")
            points.append(
                {
                    "samples": int(row["samples"]),
                    "acceptance_length": row["acceptance_length"],
                    "k": at_k,
                }
            )
    if len({p["k"] for p in points}) > 1:
        raise ValueError(
            f"points measured at several k {sorted({p['k'] for p in points})}: give one k's"
        )
    return points


@entry_point
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("detail", help="a benchmark.detail.json (or a recipe's verdict_NAME.json)")
    ap.add_argument("--serve-concurrency", type=int, help="default: the report's own")
    ap.add_argument("--goals", type=float, nargs="+", help="speedup goals (default: 1.0 1.2)")
    ap.add_argument("--points", nargs="*", default=[], help="acceptance-vs-samples points files")
    ap.add_argument("--points-k", type=int, help="the k of points files that do not record one")
    ap.add_argument("--confidence", type=float, help="of the intervals (default: the report's)")
    ap.add_argument(
        "--undecided-k", type=int, help="k deployed where undecided (default: the report's)"
    )
    ap.add_argument("--out", help="write the verdict here as JSON")
    args = ap.parse_args(argv)
    try:
        detail = read_json(args.detail)
        levels = levels_from(detail)
        points = read_points(args.points, args.points_k)
    except (OSError, ValueError, KeyError) as err:
        raise DraftlineError(f"error: draftline verdict: {err}") from None
    recorded = detail.get("verdict", {})
    serve = args.serve_concurrency or recorded.get("serve_concurrency") or min(levels)
    if serve not in levels:
        raise DraftlineError(
            f"error: --serve-concurrency {serve}: the sweep measured {sorted(levels)} requests in "
            "flight; the verdict is given at a measured load"
        )
    cfg = SimpleNamespace(
        serve_concurrency=serve,
        speedup_goals=args.goals or [1.0, 1.2],
        confidence=args.confidence or recorded.get("confidence", 0.9),
        undecided_k=recorded.get("undecided_k", 0)
        if args.undecided_k is None
        else args.undecided_k,
    )
    v = decide(
        levels,
        cfg,
        recorded.get("engine") or detail.get("engine", "?"),
        points,
        recorded.get("design"),
    )
    log.info(v["words"])
    if args.out:
        write_json(args.out, v)
    else:
        log.info(
            json.dumps(
                {
                    key: v[key]
                    for key in (
                        "serve_concurrency",
                        "decision",
                        "k",
                        "speedup",
                        "speedup_low",
                        "speedup_high",
                    )
                }
            )
        )


if __name__ == "__main__":
    main(sys.argv[1:])
