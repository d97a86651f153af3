"""Loading the trained draft for inference and measuring its acceptance against the target."""

from __future__ import annotations

from pathlib import Path


def load_draft(draft_dir: str | Path, card: dict, device: str):
    """The saved draft with the target's verifier tensors restored, eager attention, eval mode."""
    from draftline.draft import load_saved_draft

    # Eager attention from construction on: our incremental decoder passes dense float masks, and
    # the model's own TTT forward (tau_sim) picks its mask builder from this setting in __init__.
    return load_saved_draft(Path(draft_dir), card, "eager").to(device).eval()


def eos_ids(tokenizer, model) -> set[int]:
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def compare_to_greedy(spec_tokens: list[int], plain, tie_tolerance: float) -> str:
    """"identical"; "near_tie" when the outputs first differ at a token whose greedy logit was
    at most tie_tolerance above the runner-up (a 16-bit target can order those two either way,
    and the batched verification rounds differently from one-token steps); else "mismatch".
    `plain` is a greedy Generation made with margins."""
    if spec_tokens == plain.tokens:
        return "identical"
    first = next((i for i, (a, b) in enumerate(zip(spec_tokens, plain.tokens)) if a != b),
                 min(len(spec_tokens), len(plain.tokens)))
    if first < len(plain.margins) and plain.margins[first] <= tie_tolerance:
        return "near_tie"
    return "mismatch"


# ---- acceptance from decoding rounds ------------------------------------------------------


def mean(xs) -> float:
    return round(sum(xs) / len(xs), 4) if xs else 0.0


def acceptance_summary(rounds: list[int], k: int) -> dict:
    """Real acceptance from rounds of chain decoding (a+1 tokens emitted per round, 1..k+1).

    position_acceptance[i]: share of rounds whose draft tokens 1..i were all accepted (vLLM's
    per-position rate: accepted_per_pos / drafts); histogram[n]: rounds that emitted n tokens.
    """
    n = len(rounds)
    return {
        "acceptance_length": mean(rounds),
        "rounds": n,
        "position_acceptance": {str(i): round(sum(1 for r in rounds if r - 1 >= i) / n, 4) if n else 0.0 for i in range(1, k + 1)},
        "histogram": {str(t): sum(1 for r in rounds if r == t) for t in range(1, k + 2)},
    }


# ---- simulated acceptance (tau_sim) from teacher-forced accuracy ----------------------------


def teacher_forced_sample(target, aux_layer_ids: list[int], prompt: list[int], completion: list[int], storage=None) -> dict:
    """One sample in speculators' training layout over prompt + the target's own completion.

    Hidden states come from the same capture as the hidden_states stage; loss_mask marks the
    completion tokens, so after speculators' shift_batch the draft is scored exactly where the
    speculative decoder drafts: from the first completion token (the prefill's output) onwards.
    `storage` (torch.bfloat16, torch.float8_e4m3fn): the states take that format's round trip, as
    the trainer read them (draftline/hs_format.py); None = as a server hands them to the draft.
    """
    import torch

    from draftline.hidden import capture
    from draftline.hs_format import roundtrip

    ids = list(prompt) + list(completion)
    hs = capture(target, [ids], aux_layer_ids)[0].float().cpu()  # (L, 4, H)
    if storage is not None:
        hs = roundtrip(hs, storage, torch.float32)
    return {
        "hidden_states": hs[:, :-1].flatten(1),  # (L, 3H)
        "input_ids": torch.tensor(ids, dtype=torch.long),
        "verifier_last_hidden_states": hs[:, -1],  # (L, H), before the final norm
        "loss_mask": torch.tensor([0] * len(prompt) + [1] * len(completion), dtype=torch.long),
        "lengths": torch.tensor([len(ids)], dtype=torch.long),
        "position_ids": torch.arange(len(ids), dtype=torch.long),
    }


def teacher_forced_sums(draft, sample: dict, k: int, device: str) -> dict[str, float]:
    """speculators' TTT forward over one sample; the raw `*_sum`/`*_total` metric counts."""
    import torch
    from speculators.losses import resolve_loss_config
    from speculators.models.eagle3 import shift_batch
    from speculators.train.data import CollateFn

    from draftline.draft import accumulate, run_batch

    hidden_size = sample["verifier_last_hidden_states"].shape[-1]
    batch = CollateFn(len(sample["input_ids"]) - 1, hidden_size, num_target_layers=3, dtype=torch.float32,
                      preprocess=shift_batch)([sample])
    loss_config = resolve_loss_config("kl_div", "eager")  # the loss is not used; eager needs no Triton
    with torch.no_grad():
        _, _, metrics = run_batch(draft, batch, device, k, 1.0, loss_config)
    sums: dict[str, float] = {}
    accumulate(sums, metrics)
    return sums


def simulated_acceptance(sums: dict[str, float], k: int) -> dict:
    """tau_sim = 1 + sum_i acc_i with acc_i = P(draft steps 0..i all match the target), as in train."""
    from draftline.draft import summarize

    s = summarize(sums, k)
    return {"tau_sim": s["tau_sim"], "position_accuracy": {str(i + 1): a for i, a in enumerate(s["position_accuracy"])}}


def add_sums(total: dict[str, float], part: dict[str, float]) -> None:
    for key, value in part.items():
        total[key] = total.get(key, 0.0) + value
