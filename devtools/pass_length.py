"""How long a timed pass must be: the spread of the paired speedups against the pass length, on the
benchmark's own servers side by side (draftline/benchmark/server.py), for choosing
benchmark.min_pass_s and benchmark.repeats.

    python -m devtools.pass_length --lengths 0 1 3 --rounds 3 --out reports/benchmark_design/pass_length.json

Runs the pipeline's current target, draft and eval prompts (models/target, models/draft,
datasets/prompts/eval.jsonl) under params.yaml's benchmark section with min_pass_s and repeats
replaced, every length in one start of the servers (the same processes throughout). For each
length and load: the paired log-ratios' standard deviation per k, the interval half-width it
gives at benchmark.confidence for the rounds run and for 3, 5 and 8 rounds, and the wall time a
round takes; plus the servers' memory and what the idle ones took from the one under test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import time
from pathlib import Path

from draftline.benchmark import intervals
from draftline.benchmark.config import BenchmarkConfig
from draftline.benchmark.rounds import pair_side_by_side
from draftline.benchmark.server import ServerBench, Sweeper, sweep_modes
from draftline.core.card import TargetCard
from draftline.core.config import stage_sections
from draftline.core.io import read_jsonl, write_json
from draftline.targets.model import card_tokenizer
from draftline.tokens.chat import first_turn_ids


def spread(passes, confidence: float, ks: int) -> dict:
    """Per (k, load): the paired log-ratios' sd and the half-width (log) at several round counts."""
    out = {}
    for (server, c), entry in sorted(pair_side_by_side(passes).items()):
        logs = [math.log(r) for r in entry["paired_speedups"]]
        sd = statistics.stdev(logs) if len(logs) > 1 else None
        level = 1 - (1 - confidence) / ks
        out[f"{server}@c{c}"] = {
            "pairs": [round(r, 4) for r in entry["paired_speedups"]],
            "sd_log": round(sd, 5) if sd is not None else None,
            "half_width_log": {
                str(n): round(
                    intervals.t_quantile(1 - (1 - level) / 2, n - 1) * sd / math.sqrt(n), 5
                )
                for n in (len(logs), 3, 5, 8)
            }
            if sd is not None
            else None,
        }
    return out


def summarize(results: dict, confidence: float, ks: int) -> dict:
    """Per pass length: the spread pooled over every (k, load) (root mean variance of the log
    ratios) and the half-width it gives at several round counts, with the seconds those rounds
    take; the figures min_pass_s and repeats are chosen by."""
    out = {}
    level = 1 - (1 - confidence) / ks
    for length, entry in results["by_length"].items():
        sds = [s["sd_log"] for s in entry["spread"].values() if s["sd_log"] is not None]
        pooled = math.sqrt(sum(sd * sd for sd in sds) / len(sds))
        out[length] = {
            "pooled_sd_log": round(pooled, 4),
            "half_width_log": {
                str(n): round(
                    intervals.t_quantile(1 - (1 - level) / 2, n - 1) * pooled / math.sqrt(n), 4
                )
                for n in (3, 5, 8, 10)
            },
            "rounds_s": {str(n): round(n * entry["round_s"]) for n in (3, 5, 8, 10)},
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=float, nargs="+", default=[0, 1, 3])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="reports/benchmark_design/pass_length.json")
    ap.add_argument("--summarize", action="store_true", help="only redo the summary of --out")
    args = ap.parse_args()
    cfg: BenchmarkConfig = stage_sections(benchmark=BenchmarkConfig).benchmark
    if args.summarize:
        results = json.loads(Path(args.out).read_text())
        results["summary"] = summarize(results, cfg.confidence, len(cfg.ks))
        write_json(args.out, results)
        print(json.dumps(results["summary"], indent=1))
        return
    card = TargetCard.load("models/target/card.json")
    tokenizer = card_tokenizer(card)
    rows = list(read_jsonl("datasets/prompts/eval.jsonl"))[: cfg.prompts]
    prompts = [first_turn_ids(tokenizer, row) for row in rows]
    log_dir = Path("reports/benchmark_design/logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    modes = sweep_modes(cfg, "models/draft", {})
    results = {"servers": [m.name for m in modes], "loads": cfg.concurrency, "by_length": {}}
    env = {"VLLM_CPU_KVCACHE_SPACE": f"{cfg.vllm.cpu_kvcache_space_gb:g}"}
    sweep = Sweeper(ServerBench(cfg.engine, cfg, card, prompts, log_dir), "side_by_side")
    with contextlib.ExitStack() as stack, sweep.bar:
        started = time.monotonic()
        running = sweep.start(stack, modes, [dict(env) for _ in modes])
        results["startup_s"] = round(time.monotonic() - started, 1)
        results["servers_rss_gib"] = sweep.memory_gib
        for run in running.values():
            sweep.warm_up(run)
        for length in args.lengths:
            sweep.cfg = cfg.model_copy(update={"min_pass_s": length, "repeats": args.rounds})
            sweep.passes = []
            began = time.monotonic()
            for rnd in range(args.rounds):
                for c in cfg.concurrency:
                    order = list(running)
                    sweep.rng.shuffle(order)
                    for name in order:
                        idle = [r for n, r in running.items() if n != name]
                        sweep.timed_pass(running[name], c, rnd, idle)
            wall = time.monotonic() - began
            idle = [v for p in sweep.passes for v in p.idle_cpu.values()]
            results["by_length"][str(length)] = {
                "round_s": round(wall / args.rounds, 1),
                "pass_s_median": round(statistics.median(p.wall_s for p in sweep.passes), 3),
                "idle_server_cpu_cores_median": round(statistics.median(idle), 4) if idle else None,
                "idle_server_cpu_cores_max": round(max(idle), 4) if idle else None,
                "spread": spread(sweep.passes, cfg.confidence, len(cfg.ks)),
            }
            print(json.dumps({length: results["by_length"][str(length)]["round_s"]}), flush=True)
    results["summary"] = summarize(results, cfg.confidence, len(cfg.ks))
    write_json(args.out, results)
    print(f"pass_length: {args.out}")


if __name__ == "__main__":
    main()
