"""Speculative decoding on the default target (built-in engine): acceptance length and speedup.

    python overhead/specdec_speedup.py --out reports/overhead/specdec_speedup.json      # after `make repro`

Uses the artifacts of the default pipeline (models/target, models/draft, the eval prompts) and the
same engine as the `benchmark` stage, with more repeats: greedy and speculative decoding of the same
prompts, interleaved, medians of tokens/s and their ratio (draftline/benchmark/hf.py); the load
averages and CPU count are recorded.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # devtools/ is not installed

from devtools.ab_timing import loadavg, machine_load
from draftline.benchmark.config import BenchmarkConfig
from draftline.benchmark.hf import benchmark_hf
from draftline.core.card import TargetCard
from draftline.core.io import read_jsonl
from draftline.draft.checkpoint import load_draft
from draftline.evaluate.acceptance import eos_ids
from draftline.targets.model import load_target
from draftline.tokens.chat import first_turn_ids


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--card", default="models/target/card.json")
    ap.add_argument("--draft", default="models/draft")
    ap.add_argument("--prompts", default="datasets/prompts/eval.jsonl")
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="reports/overhead/specdec_speedup.json")
    args = ap.parse_args()
    at_start = loadavg()
    if not Path(args.draft, "config.json").exists():
        raise SystemExit(f"error: no trained draft at {args.draft}; run `make repro` first")
    card = TargetCard.load(args.card)
    target, tokenizer = load_target(card)
    draft = load_draft(args.draft, card, "cpu")
    rows = list(read_jsonl(args.prompts))[: args.n]
    prompts = [first_turn_ids(tokenizer, row) for row in rows]
    cfg = BenchmarkConfig(
        engine="hf",
        device="cpu",
        k=[args.k],
        max_new_tokens=args.max_new_tokens,
        warmup=1,
        repeats=args.repeats,
    )
    level = benchmark_hf(target, draft, card.aux_ids, prompts, eos_ids(tokenizer, target), cfg)
    base, spec = level.baseline, level.speculative[args.k]
    result = {
        "speedup": round(spec["output_tokens_per_s"] / base["output_tokens_per_s"], 4),
        "acceptance_length": spec["acceptance_length"],
        "baseline_tokens_per_s": base["output_tokens_per_s"],
        "speculative_tokens_per_s": spec["output_tokens_per_s"],
        "outputs_identical": set(level.verdicts[args.k]) == {"identical"},
        "output_tokens": base["output_tokens"],
        "device": "cpu",
        "repeats": args.repeats,
        "runs": {"baseline": base["runs"], "speculative": spec["runs"]},
    }
    result.update(prompts=len(prompts), k=args.k, max_new_tokens=args.max_new_tokens)
    result.update(machine_load(at_start))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
