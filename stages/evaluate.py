"""Stage `evaluate`: real acceptance length of the draft on the held-out eval prompts.

    python -m stages.evaluate models/target/card.json models/draft datasets/prompts/eval.jsonl reports/acceptance.json

Runs chain speculative decoding (greedy, k draft tokens per round) with the built-in engine and
checks every output against plain greedy decoding of the target: the engine is lossless, so any
mismatch fails the stage.
"""

import sys
from collections import Counter, defaultdict

from draftline.config import stage_params


def main(card_path: str, draft_dir: str, eval_path: str, report_path: str) -> None:
    params = stage_params()
    cfg = params.evaluate
    from rich.progress import track

    from draftline.evaluation import eos_ids, load_draft, prompt_ids
    from draftline.io import read_json, read_jsonl, write_json
    from draftline.specdec import greedy_generate, speculative_generate
    from draftline.target import load_target, resolve_device

    card = read_json(card_path)
    device = resolve_device(cfg.device)
    target, tokenizer = load_target(card, device=device)
    draft = load_draft(draft_dir, device)
    stop = eos_ids(tokenizer, target)
    rows = list(read_jsonl(eval_path))[: cfg.prompts]

    rounds_all, per_source, mismatches = [], defaultdict(list), 0
    for row in track(rows, description="evaluate"):
        ids = prompt_ids(tokenizer, row)
        spec = speculative_generate(target, draft, card["aux_layer_ids"], ids, cfg.max_new_tokens, cfg.k, stop)
        plain = greedy_generate(target, ids, cfg.max_new_tokens, stop)
        mismatches += spec.tokens != plain.tokens
        rounds_all.extend(spec.accepted_per_round)
        per_source[row.get("source", "?")].extend(spec.accepted_per_round)
    if mismatches:
        raise SystemExit(f"error: speculative output differed from greedy target output on {mismatches} prompts")

    def mean(xs):
        return round(sum(xs) / len(xs), 4) if xs else 0.0

    histogram = Counter(rounds_all)
    # acceptance rate of draft position i: share of rounds that accepted at least i+1 draft tokens
    position_acceptance = [round(sum(1 for r in rounds_all if r - 1 > i) / len(rounds_all), 4) for i in range(cfg.k)]
    report = {
        "acceptance_length": mean(rounds_all),
        "k": cfg.k,
        "prompts": len(rows),
        "rounds": len(rounds_all),
        "position_acceptance": position_acceptance,
        "histogram": {str(n): histogram.get(n, 0) for n in range(1, cfg.k + 2)},
        "per_source": {src: mean(v) for src, v in sorted(per_source.items())},
        "lossless_checked_prompts": len(rows),
    }
    write_json(report_path, report)
    print(f"evaluate: mean acceptance length {report['acceptance_length']:.3f} over {len(rounds_all)} rounds (k={cfg.k})")


if __name__ == "__main__":
    main(*sys.argv[1:])
