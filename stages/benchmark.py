"""Stage `benchmark`: tokens/s of plain greedy decoding vs speculative decoding, same prompts.

    python -m stages.benchmark models/target/card.json models/draft datasets/prompts/eval.jsonl reports/benchmark.json

Engine `hf` (built in, CPU or one GPU): warm-up runs, then `repeats` timed passes over the same
prompts for each mode; the medians are reported with the speedup and the acceptance length.
"""

import statistics
import sys

from draftline.config import stage_params


def main(card_path: str, draft_dir: str, eval_path: str, report_path: str) -> None:
    params = stage_params()
    cfg = params.benchmark
    import torch

    from draftline.evaluation import eos_ids, load_draft, prompt_ids
    from draftline.io import read_json, read_jsonl, write_json
    from draftline.specdec import greedy_generate, speculative_generate
    from draftline.target import load_target, resolve_device

    card = read_json(card_path)
    device = resolve_device(cfg.device)
    target, tokenizer = load_target(card, device=device)
    draft = load_draft(draft_dir, device)
    stop = eos_ids(tokenizer, target)
    prompts = [prompt_ids(tokenizer, row) for row in list(read_jsonl(eval_path))[: cfg.prompts]]

    def run(mode: str):
        gens = []
        for ids in prompts:
            if mode == "baseline":
                gens.append(greedy_generate(target, ids, cfg.max_new_tokens, stop))
            else:
                gens.append(speculative_generate(target, draft, card["aux_layer_ids"], ids, cfg.max_new_tokens, cfg.k, stop))
        if device == "cuda":
            torch.cuda.synchronize()
        return gens

    for _ in range(cfg.warmup):
        run("baseline")
        run("speculative")
    results = {"baseline": [], "speculative": []}
    for _ in range(cfg.repeats):  # interleaved so drift in machine load hits both modes alike
        for mode in results:
            gens = run(mode)
            results[mode].append((sum(len(g.tokens) for g in gens), sum(g.seconds for g in gens), gens))

    report = {"engine": cfg.engine, "device": device, "prompts": len(prompts), "max_new_tokens": cfg.max_new_tokens, "k": cfg.k, "repeats": cfg.repeats}
    for mode, runs in results.items():
        tps = [tokens / seconds for tokens, seconds, _ in runs]
        report[mode] = {"tokens_per_s": round(statistics.median(tps), 2), "tokens": runs[0][0], "all_tokens_per_s": [round(t, 2) for t in tps]}
    spec_rounds = [r for g in results["speculative"][0][2] for r in g.accepted_per_round]
    report["speculative"]["acceptance_length"] = round(sum(spec_rounds) / len(spec_rounds), 4)
    report["speedup"] = round(report["speculative"]["tokens_per_s"] / report["baseline"]["tokens_per_s"], 4)
    same = all(s.tokens == b.tokens for s, b in zip(results["speculative"][0][2], results["baseline"][0][2], strict=True))
    report["outputs_identical"] = same
    write_json(report_path, report)
    print(f"benchmark: baseline {report['baseline']['tokens_per_s']:.1f} tok/s, speculative "
          f"{report['speculative']['tokens_per_s']:.1f} tok/s, speedup {report['speedup']:.2f}x")


if __name__ == "__main__":
    main(*sys.argv[1:])
