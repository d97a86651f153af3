"""Benchmark engine `hf`: the built-in greedy and speculative decoders on the same prompts (batch 1).

Warm-up passes, then `repeats` rounds of timed passes, the baseline and each k once in each, so
that drift in machine load hits them alike; each k's pass over the baseline's pass of the same
round is one paired ratio of the interval (draftline/benchmark/intervals.py).
Every speculative output is judged against an untimed greedy reference with its logit margins
(the near-tie rule of draftline/evaluate/acceptance.py), for the lossless gate.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from draftline.benchmark.sweep import Level
from draftline.evaluate.acceptance import compare_to_greedy

if TYPE_CHECKING:
    from draftline.benchmark.config import BenchmarkConfig


def benchmark_hf(
    target,
    draft,
    aux_layer_ids: list[int],
    prompts: list[list[int]],
    stop: set[int],
    cfg: BenchmarkConfig,
) -> Level:
    """The one load level (1 request in flight): the baseline's summary, each k's with its
    acceptance, and each k's compare_to_greedy verdict per prompt and timed pass."""
    # torch and the decoders load on first use: benchmark.run imports this module for every engine
    import torch

    from draftline.evaluate.specdec import SpecPair, greedy_generate, speculative_generate

    def run(k: int | None):
        gens = []
        for ids in prompts:
            if k is None:
                gens.append(greedy_generate(target, ids, cfg.max_new_tokens, stop))
            else:
                pair = SpecPair(target, draft, aux_layer_ids)
                gens.append(speculative_generate(pair, ids, cfg.max_new_tokens, k, stop))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return gens

    modes = [None, *cfg.ks]
    for _ in range(cfg.warmup):
        for k in modes:
            run(k)
    timed = {k: [] for k in modes}
    for _ in range(cfg.repeats):
        for k in modes:
            timed[k].append(run(k))
    tolerance = cfg.resolved_tie_tolerance()
    reference = [
        greedy_generate(target, ids, cfg.max_new_tokens, stop, True, tolerance) for ids in prompts
    ]

    def summary(runs) -> dict:
        tps = [sum(len(g.tokens) for g in gens) / sum(g.seconds for g in gens) for gens in runs]
        return {
            "requests": len(prompts),
            "failed": 0,
            "output_tokens": sum(len(g.tokens) for g in runs[0]),
            "output_tokens_per_s": round(statistics.median(tps), 2),
            "runs": {str(i + 1): round(t, 2) for i, t in enumerate(tps)},
            "runs_tokens_per_s": [round(t, 2) for t in tps],
        }

    speculative, verdicts, base = {}, {}, summary(timed[None])
    for k in cfg.ks:
        rounds = [r for g in timed[k][0] for r in g.accepted_per_round]
        own = summary(timed[k])
        speculative[k] = {
            **own,
            "paired_speedups": [
                round(t / b, 4)
                for t, b in zip(own["runs_tokens_per_s"], base["runs_tokens_per_s"], strict=True)
                if b
            ],
            "acceptance_length": round(sum(rounds) / len(rounds), 4) if rounds else None,
            "drafts": len(rounds),
        }
        verdicts[k] = [
            compare_to_greedy(g.tokens, ref, tolerance)
            for gens in timed[k]
            for g, ref in zip(gens, reference, strict=True)
        ]
    return Level(base, speculative, verdicts)
