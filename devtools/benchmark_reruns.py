"""Reruns of the benchmark side by side: each run's decision, k, speedup and interval at every load,
and whether any two runs contradict each other (yes in one, no in another).

    python -m devtools.benchmark_reruns quiet1=run1.detail.json quiet2=run2.detail.json \\
        busy=run4.detail.json --out reports/benchmark_design/reruns.json

Each argument is LABEL=a benchmark.detail.json saved after a `dvc repro -f -s benchmark`; the label
says how the run was made (quiet: nothing else running; busy: a competing process).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftline.core.io import write_json
from draftline.tools.verify_repro import CONTRADICTS


def summary(detail: dict) -> dict:
    v = detail["verdict"]
    return {
        "design": v["design"]["layout"],
        "rounds": v["design"]["rounds"],
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="LABEL=benchmark.detail.json")
    ap.add_argument("--out", default="reports/benchmark_design/reruns.json")
    args = ap.parse_args()
    runs = {}
    for arg in args.runs:
        label, path = arg.split("=", 1)
        runs[label] = summary(json.loads(Path(path).read_text()))
    report = {"runs": runs, "contradictions": contradictions(runs)}
    write_json(args.out, report)
    for label, run in runs.items():
        cells = [
            f"c{c} {d['decision']} k={d['k']} {d['speedup']} [{d['low']}-{d['high']}]"
            for c, d in run["loads"].items()
        ]
        print(f"{label:>8}: " + "; ".join(cells))
    print(f"contradictions: {report['contradictions'] or 'none'}")


if __name__ == "__main__":
    main()
