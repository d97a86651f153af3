"""Stage `evaluate`: real and simulated acceptance of the draft on the held-out eval prompts.

    python -m stages.evaluate models/target/card.json models/draft datasets/prompts/eval.jsonl reports/acceptance.json reports/evaluate

reports/evaluate/ holds the plot data: acceptance length against the train prompts `mix` drew (one
point per run, so `dvc plots diff` over experiments draws the scaling curve; it reads their count
from the mix's meta.json beside the eval prompts, which is `samples` unless mix.allow_shortfall let
fewer through) and acceptance per draft position.

Real: chain speculative decoding (greedy, k draft tokens per round) with the built-in engine, each
output checked against plain greedy decoding of the target (the engine is lossless, so a mismatch
fails the stage). Simulated: tau_sim = 1 + sum of teacher-forced accuracies, from speculators' own
TTT forward over the target's hidden states of prompt + its greedy completion (the same tokens the
real decoder verified; the eval prompts have no stored hidden states). Both per source dataset, and
per row source inside a dataset (`source_detail`, e.g. open-perfectblend's subsets) when rows have one.
The metrics file holds the two headline figures; the whole report (per position, per source,
histogram, prompts) is in acceptance.detail.json beside it.
"""

import sys
from collections import defaultdict
from pathlib import Path

from draftline.card import TargetCard
from draftline.config import stage_params
from draftline.threads import apply_thread_policy


def mixed_train_count(eval_path: str, samples: int) -> int:
    """Train prompts the mix drew, from its meta.json beside the eval prompts; prompts made by hand
    (no mix meta there) are taken to be `samples`, and the stage says so."""
    from pathlib import Path

    from draftline.io import read_json

    meta_path = Path(eval_path).parent / "meta.json"
    if not meta_path.is_file():
        print(f"evaluate: no {meta_path} of the `mix` stage; the scaling point is put at samples={samples}")
        return samples
    try:
        return int(read_json(meta_path)["counts"]["train"])
    except (ValueError, KeyError, TypeError) as err:
        raise SystemExit(f"error: {meta_path}: no train count of the `mix` stage ({type(err).__name__}: {err}); "
                         "the scaling plot records the train prompts mix drew, so run `mix` again") from None


def main(card_path: str, draft_dir: str, eval_path: str, report_path: str, plots_dir: str) -> None:
    params = stage_params()
    apply_thread_policy("evaluate")  # before torch loads: draftline/threads.py
    cfg = params.evaluate
    import torch
    from rich.progress import track

    from draftline.chat import first_turn_ids
    from draftline.evaluation import (acceptance_summary, add_sums, compare_to_greedy, eos_ids, load_draft, mean,
                                      simulated_acceptance, teacher_forced_sample, teacher_forced_sums)
    from draftline.io import read_json, read_jsonl, write_json, write_metrics
    from draftline.specdec import greedy_generate, speculative_generate
    from draftline.target import load_target

    card = TargetCard.load(card_path)
    device = cfg.resolved_device()
    target, tokenizer = load_target(card, device, getattr(torch, cfg.dtype), cfg.device_map)
    tie_tolerance = cfg.resolved_tie_tolerance()
    draft = load_draft(draft_dir, card, device)
    stop = eos_ids(tokenizer, target)
    rows = list(read_jsonl(eval_path))[: cfg.prompts]
    if not rows:
        raise SystemExit(f"error: {eval_path} has no eval prompts")
    train_prompts = mixed_train_count(eval_path, params.samples)

    # a draft trained on fp8 states: tau_sim also over states through the fp8 round trip it was trained on
    trained_on = (read_json(f"{draft_dir}/meta.json").get("hidden_states") or {}) if Path(draft_dir, "meta.json").exists() else {}
    fp8 = trained_on.get("format") == "fp8"
    sums_stored = {}
    rounds_all, sums_all, mismatches, near_ties = [], {}, [], []
    per_source = defaultdict(lambda: {"rounds": [], "sums": {}, "prompts": 0})
    per_detail = defaultdict(lambda: {"rounds": [], "sums": {}, "prompts": 0})  # (dataset, its row's own source)
    generated = 0
    for row in track(rows, description="evaluate"):
        ids = first_turn_ids(tokenizer, row)
        spec = speculative_generate(target, draft, card["aux_layer_ids"], ids, cfg.max_new_tokens, cfg.k, stop)
        plain = greedy_generate(target, ids, cfg.max_new_tokens, stop, margins=True)
        verdict = compare_to_greedy(spec.tokens, plain, tie_tolerance)
        if verdict != "identical":
            (near_ties if verdict == "near_tie" else mismatches).append(row["id"])
        sums = teacher_forced_sums(draft, teacher_forced_sample(target, card["aux_layer_ids"], ids, plain.tokens), cfg.k, device)
        if fp8:
            add_sums(sums_stored, teacher_forced_sums(draft, teacher_forced_sample(
                target, card["aux_layer_ids"], ids, plain.tokens, torch.float8_e4m3fn), cfg.k, device))
        groups = [per_source[row.get("source", "?")]]
        if row.get("source_detail"):
            groups.append(per_detail[(row.get("source", "?"), row["source_detail"])])
        for src in groups:
            src["rounds"].extend(spec.accepted_per_round)
            src["prompts"] += 1
            add_sums(src["sums"], sums)
        rounds_all.extend(spec.accepted_per_round)
        add_sums(sums_all, sums)
        generated += len(plain.tokens)
    if mismatches:
        raise SystemExit(f"error: speculative output differed from greedy target output on {len(mismatches)} "
                         f"prompts (ids {mismatches[:5]}), not at a near-tie of the target's top two logits "
                         f"(tie_tolerance {tie_tolerance}, dtype {cfg.dtype})")
    if near_ties:
        print(f"evaluate: {len(near_ties)} prompts diverged from greedy at a near-tie of the target's top two "
              f"logits (<= {tie_tolerance} in {cfg.dtype}; ids {near_ties[:5]}); counted as near_tie_divergences")

    real = acceptance_summary(rounds_all, cfg.k)
    sim = simulated_acceptance(sums_all, cfg.k)
    report = {
        "acceptance_length": real["acceptance_length"],
        "tau_sim": sim["tau_sim"],
        "k": cfg.k,
        "prompts": len(rows),
        "generated_tokens": generated,
        "rounds": real["rounds"],
        "position_acceptance": real["position_acceptance"],
        "sim_position_accuracy": sim["position_accuracy"],
        "histogram": real["histogram"],
        "per_source": {
            name: {"acceptance_length": mean(s["rounds"]), "tau_sim": simulated_acceptance(s["sums"], cfg.k)["tau_sim"],
                   "prompts": s["prompts"]}
            for name, s in sorted(per_source.items())
        },
        **({"per_source_detail": {
            f"{name}/{detail}": {"acceptance_length": mean(s["rounds"]),
                                 "tau_sim": simulated_acceptance(s["sums"], cfg.k)["tau_sim"], "prompts": s["prompts"]}
            for (name, detail), s in sorted(per_detail.items())}} if per_detail else {}),
        "lossless_checked_prompts": len(rows),
        "near_tie_divergences": len(near_ties),
    }
    if fp8:
        report["tau_sim_fp8_states"] = simulated_acceptance(sums_stored, cfg.k)["tau_sim"]
    write_metrics(report_path, report, ["acceptance_length", "tau_sim"])
    write_json(f"{plots_dir}/acceptance_vs_samples.json",
               [{"samples": train_prompts, "samples_requested": params.samples,
                 "acceptance_length": report["acceptance_length"], "tau_sim": report["tau_sim"]}])
    write_json(f"{plots_dir}/position_acceptance.json",
               [{"position": int(pos), "acceptance": rate} for pos, rate in real["position_acceptance"].items()])
    print(f"evaluate: acceptance length {report['acceptance_length']:.3f} over {real['rounds']} rounds (k={cfg.k}), "
          f"tau_sim {report['tau_sim']:.3f}; per position {list(real['position_acceptance'].values())}")


if __name__ == "__main__":
    main(*sys.argv[1:])
