"""Speculation that needs no trained draft, replayed over the target's greedy outputs: the
acceptance each of benchmark.free's methods would reach on the same prompts as the draft.

At temperature 0 the target's output does not depend on what is proposed, so a method that
proposes from the context alone (FreeMethod.propose: n-gram prompt lookup) can be replayed exactly:
at each verification step, the context is the prompt and the output so far; the proposal's leading
tokens that equal the output's next ones are accepted, and the target adds one more. A step whose
proposal is empty is a plain decoding step (one token). Past the end of the output (eos or
max_new_tokens) nothing is known, so a proposal is judged on the tokens the output has.

Reported at evaluate.k, the k the draft is measured at, for each method that replays
(draftline/draft/free.py; suffix decoding does not: its trees hold the server's past
responses):
- acceptance_length: tokens per target forward over every step (a+1, counted as the draft's are);
- acceptance_length_drafted: the same over the steps that had a proposal (vLLM's spec-decode
  counters count only those);
- proposal_share: the share of steps with a proposal;
- per_prompt: each prompt's acceptance length, for pairing with the draft prompt by prompt.
"""

from __future__ import annotations

from draftline.draft.free import free_method
from draftline.evaluate.acceptance import acceptance_summary, mean


def replay(method, settings: dict, prompt: list[int], output: list[int], k: int) -> tuple:
    """(a+1 per step, tokens emitted per step, whether each step had a proposal) of `method`
    replayed over `output`, the target's greedy continuation of `prompt`."""
    rounds, emitted, drafted = [], [], []
    done = 0
    while done < len(output):
        proposal = method.propose(prompt + output[:done], k, settings) or []
        accepted = 0
        while (
            accepted < len(proposal)
            and done + accepted < len(output)
            and proposal[accepted] == output[done + accepted]
        ):
            accepted += 1
        rounds.append(accepted + 1)
        emitted.append(min(accepted + 1, len(output) - done))
        drafted.append(bool(proposal))
        done += emitted[-1]
    return rounds, emitted, drafted


def free_acceptance(free: dict, prompt_ids: dict, greedy: dict, k: int) -> dict:
    """{method: figures} for each benchmark.free method that replays (`free`: name -> its settings,
    FreeBenchConfig), over the prompts' greedy outputs ({id: ids}, {id: output ids})."""
    out = {}
    for name, bench in free.items():
        method = free_method(name)
        settings = dict(bench.speculative_config)
        if method.propose([], k, settings) is None:
            out[name] = {"replayed": False, "why": f"{method.title} has no offline replay"}
            continue
        rounds, emitted, drafted, per_prompt = [], [], [], {}
        for pid, output in greedy.items():
            r, e, d = replay(method, settings, list(prompt_ids[pid]), list(output), k)
            rounds += r
            emitted += e
            drafted += d
            if r:  # an empty output has no step to count (as the draft's per-prompt figures)
                per_prompt[pid] = mean(r)
        summary = acceptance_summary(rounds, k, emitted)
        with_proposal = [r for r, d in zip(rounds, drafted, strict=True) if d]
        out[name] = {
            "replayed": True,
            "title": method.title,
            "k": k,
            "speculative_config": settings,
            "acceptance_length": summary["acceptance_length"],
            "tokens_per_step": summary["tokens_per_step"],
            "acceptance_length_drafted": mean(with_proposal) if with_proposal else None,
            "proposal_share": round(len(with_proposal) / len(rounds), 4) if rounds else None,
            "rounds": len(rounds),
            "prompts": len(greedy),
            "per_prompt": per_prompt,
        }
    return out
