"""Benchmark engine `hf`: the built-in greedy and speculative decoders on the same prompts (batch 1).

Warm-up passes, then `repeats` timed passes per mode, interleaved so that drift in machine load
hits both alike; the median tokens/s of each mode and their ratio are reported.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from draftline.benchmark.config import BenchmarkConfig


def benchmark_hf(
    target,
    draft,
    aux_layer_ids: list[int],
    prompts: list[list[int]],
    stop: set[int],
    cfg: BenchmarkConfig,
    device: str,
) -> dict:
    # torch and the decoders load on first use: benchmark.run imports this module for every engine
    import torch

    from draftline.evaluate.specdec import greedy_generate, speculative_generate

    def run(mode: str):
        gens = []
        for ids in prompts:
            if mode == "baseline":
                gens.append(greedy_generate(target, ids, cfg.max_new_tokens, stop))
            else:
                gens.append(
                    speculative_generate(
                        target, draft, aux_layer_ids, ids, cfg.max_new_tokens, cfg.k, stop
                    )
                )
        if device == "cuda":
            torch.cuda.synchronize()
        return gens

    for _ in range(cfg.warmup):
        run("baseline")
        run("speculative")
    timed = {"baseline": [], "speculative": []}
    for _ in range(cfg.repeats):
        for mode in timed:
            timed[mode].append(run(mode))

    def tokens_per_s(gens):
        return sum(len(g.tokens) for g in gens) / sum(g.seconds for g in gens)

    tps = {mode: [tokens_per_s(g) for g in runs] for mode, runs in timed.items()}
    base, spec = statistics.median(tps["baseline"]), statistics.median(tps["speculative"])
    rounds = [r for g in timed["speculative"][0] for r in g.accepted_per_round]
    identical = all(
        s.tokens == b.tokens
        for s, b in zip(timed["speculative"][0], timed["baseline"][0], strict=True)
    )
    return {
        "speedup": round(spec / base, 4),
        "acceptance_length": round(sum(rounds) / len(rounds), 4) if rounds else 0.0,
        "baseline_tokens_per_s": round(base, 2),
        "speculative_tokens_per_s": round(spec, 2),
        "outputs_identical": identical,
        "output_tokens": sum(len(g.tokens) for g in timed["baseline"][0]),
        "device": device,
        "repeats": cfg.repeats,
        "runs": {
            mode: {str(i + 1): round(t, 2) for i, t in enumerate(values)}
            for mode, values in tps.items()
        },
    }
