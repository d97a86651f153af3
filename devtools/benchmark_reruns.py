"""Reruns of the benchmark side by side: each run's decision, k, speedup and interval at every load,
its deployed k per batch size and the rounds it ran, whether any two runs contradict each other
(yes in one, no in another), how many runs deployed the same schedule, and each load's k against
the best k pooled over the runs (every run's paired ratios together).

    python -m devtools.benchmark_reruns quiet1=run1.detail.json quiet2=run2.detail.json \\
        busy=run4.detail.json --out reports/benchmark_design/reruns.json

Each argument is LABEL=a benchmark.detail.json saved after a `dvc repro -f -s benchmark`; the label
says how the run was made (quiet: nothing else running; busy: a competing process).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from draftline.core.io import write_json
from draftline.tools.verify_repro import CONTRADICTS


def summary(detail: dict) -> dict:
    v = detail["verdict"]
    return {
        "design": v["design"]["layout"],
        "rounds": v["design"]["rounds"],
        "rounds_budget": v["design"].get("rounds_budget"),
        "stops": v["design"].get("stops"),
        "k_per_batch_size": v.get("k_per_batch_size"),
        "settled": v.get("settled"),
        "min_pass_s": v["design"]["min_pass_s"],
        "idle_servers_cpu_cores": v["design"].get("idle_servers_cpu_cores"),
        "loads": {
            c: {
                "decision": d["decision"],
                "k": d["k"],
                "speedup": d["speedup"],
                "low": d["low"],
                "high": d["high"],
                "half_width_log": (d["by_k"].get(str(d["k"] or d["best_k"])) or {}).get(
                    "half_width_log"
                ),
                "rounds_to_decide": d.get("rounds_to_decide"),
            }
            for c, d in v["decisions"].items()
        },
    }


def contradictions(runs: dict) -> list[str]:
    out = []
    labels = list(runs)
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            for c, da in runs[a]["loads"].items():
                db = runs[b]["loads"].get(c)
                if db and (da["decision"], db["decision"]) in CONTRADICTS:
                    out.append(f"c{c}: {a} {da['decision']}, {b} {db['decision']}")
    return out


def schedules(runs: dict) -> dict:
    """How many runs deployed each distinct k per batch size, the most common first."""
    counts: dict[str, list[str]] = {}
    for label, run in runs.items():
        counts.setdefault(json.dumps(run.get("k_per_batch_size")), []).append(label)
    ranked = sorted(counts.items(), key=lambda kv: -len(kv[1]))
    return {
        "distinct": len(ranked),
        "most_common": json.loads(ranked[0][0]) if ranked else None,
        "runs_with_most_common": len(ranked[0][1]) if ranked else 0,
        "by_schedule": [{"schedule": json.loads(k), "runs": labels} for k, labels in ranked],
    }


def pooled(details: dict, k_margin: float) -> dict:
    """{load: {pooled speedup per k, best k, each run's deployed k, whether it is within k_margin
    of the best k pooled}} from every run's paired ratios together."""
    out = {}
    loads = sorted({c for d in details.values() for c in d["verdict"]["decisions"]}, key=int)
    for c in loads:
        logs: dict[str, list[float]] = {}
        for d in details.values():
            level = d["levels"].get(f"c{c}", {})
            for key, spec in level.items():
                if key.startswith("k") and spec.get("paired_speedups"):
                    logs.setdefault(key[1:], []).extend(
                        math.log(r) for r in spec["paired_speedups"] if r > 0
                    )
        speedup = {k: round(math.exp(sum(v) / len(v)), 4) for k, v in logs.items() if v}
        best = max(speedup, key=speedup.get) if speedup else None
        chosen = {}
        for label, d in details.items():
            dec = d["verdict"]["decisions"][c]
            k = str(dec["k"]) if dec["decision"] == "yes" else None
            chosen[label] = {
                "decision": dec["decision"],
                "k": dec["k"] if dec["decision"] == "yes" else None,
                "within_k_margin_of_pooled_best": (
                    None if k is None else speedup[k] * (1 + k_margin) >= speedup[best]
                ),
            }
        out[c] = {"pooled_speedup": speedup, "pooled_best_k": best, "runs": chosen}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="LABEL=benchmark.detail.json")
    ap.add_argument("--out", default="reports/benchmark_design/reruns.json")
    ap.add_argument(
        "--pooled", action="store_true", help="each load's k against the best k pooled over runs"
    )
    args = ap.parse_args()
    runs, details = {}, {}
    for arg in args.runs:
        label, path = arg.split("=", 1)
        details[label] = json.loads(Path(path).read_text())
        runs[label] = summary(details[label])
    report = {"runs": runs, "contradictions": contradictions(runs), "schedules": schedules(runs)}
    if args.pooled:
        margin = next(iter(details.values()))["verdict"].get("k_margin", 0.05)
        report["pooled"] = pooled(details, margin)
    write_json(args.out, report)
    for label, run in runs.items():
        cells = [
            f"c{c} {d['decision']} k={d['k']} {d['speedup']} [{d['low']}-{d['high']}]"
            for c, d in run["loads"].items()
        ]
        print(f"{label:>8}: " + "; ".join(cells) + f"; schedule {run['k_per_batch_size']}")
    print(f"contradictions: {report['contradictions'] or 'none'}")


if __name__ == "__main__":
    main()
