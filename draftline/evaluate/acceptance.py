"""Evaluating the draft: real acceptance of chain speculative decoding checked lossless against
greedy decoding, simulated acceptance (tau_sim) from teacher-forced accuracy, per source, and the
evaluate stage's run over the eval prompts that reports both (their token ids: draftline/tokens/chat.py).

Real: chain speculative decoding (greedy, k draft tokens per round) with the built-in engine
(draftline/evaluate/specdec.py), each output checked against plain greedy decoding of the target
(the engine is lossless, so a mismatch fails the stage). Simulated: tau_sim = 1 + sum of
teacher-forced accuracies, from the draft's own TTT forward (draftline/draft/forward.py) over the
target's hidden states of prompt + its greedy completion (the same tokens the real decoder
verified; the eval prompts have no stored hidden states). Both per source dataset, and per row
source inside a dataset (`source_detail`, e.g. open-perfectblend's subsets) when rows have one.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from draftline.core.errors import DraftlineError
from draftline.core.io import read_json, read_jsonl
from draftline.draft.checkpoint import load_draft
from draftline.draft.methods import Forward, chain, drafter
from draftline.draft.metrics import accumulate, summarize
from draftline.evaluate.context import (
    Markup,
    Step,
    beyond_trained,
    by_context,
    by_span,
    collapse,
    group_figures,
    prompt_steps,
)
from draftline.evaluate.paired import per_prompt_acceptance
from draftline.evaluate.prompts import eval_prompt_ids
from draftline.hidden_states.formats import roundtrip
from draftline.targets.model import load_target

if TYPE_CHECKING:
    from draftline.core.card import TargetCard
    from draftline.evaluate.config import EvaluateConfig

log = logging.getLogger(__name__)


class NotLossless(DraftlineError):
    """Speculative decoding's output was not the target's greedy output, or too many prompts were
    excused as near-ties for the check to cover them; the message says how many and why."""


class EvalPromptsError(DraftlineError):
    """The eval prompts cannot be measured as given (none, or no train count of the `mix` stage
    beside them); the message names the file and the way out."""


def eos_ids(tokenizer, model) -> set[int]:
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def near_tie_flip(chosen, greedy, chosen_gap, tie_tolerance):
    """Whether `chosen` may stand for greedy's token as a 16-bit reordering of a near-tie: it is a
    runner-up of greedy's whose logit was within tie_tolerance of greedy's top one (chosen_gap:
    greedy's top logit minus chosen's). Mostly the runner-up itself; where three or more tokens
    are that close (flat distributions in bf16), any of them. A token further below is a real divergence, however close
    greedy's own top two were. Elementwise: on ints and floats, or on tensors of one shape
    (scripts/gpu_check.py's argmax check)."""
    return (chosen != greedy) & (chosen_gap <= tie_tolerance)


def compare_to_greedy(spec_tokens: list[int], plain, tie_tolerance: float) -> str:
    """ "identical"; "near_tie" when the outputs first differ at a token that is a near-tie flip
    (near_tie_flip: a runner-up within tie_tolerance of greedy's logit; a 16-bit target can order
    those either way, and the batched verification rounds differently from one-token steps);
    else "mismatch", one output stopping before the other included.
    `plain` is a greedy Generation made with margins at (at least) this tie_tolerance."""
    if spec_tokens == plain.tokens:
        return "identical"
    first = next(
        (i for i, (a, b) in enumerate(zip(spec_tokens, plain.tokens)) if a != b),
        min(len(spec_tokens), len(plain.tokens)),
    )
    if first >= min(len(spec_tokens), len(plain.tokens), len(plain.runner_ups)):
        return "mismatch"
    chosen = spec_tokens[first]
    gap = plain.runner_ups[first].get(chosen, float("inf"))  # not recorded: beyond the tolerance
    return (
        "near_tie" if near_tie_flip(chosen, plain.tokens[first], gap, tie_tolerance) else "mismatch"
    )


def lossless_summary(
    verdicts: dict[str, str], tie_tolerance: float, dtype: str, max_near_tie_share: float
) -> dict:
    """The report's lossless figures from each prompt's compare_to_greedy verdict (prompt id ->
    verdict). Fails (NotLossless) on any mismatch, and when the share of prompts excused as
    near-ties is above max_near_tie_share: an excused prompt is checked only up to its first
    differing token, so past that share the check no longer covers the outputs."""
    mismatches = [i for i, v in verdicts.items() if v == "mismatch"]
    near_ties = [i for i, v in verdicts.items() if v == "near_tie"]
    if mismatches:
        raise NotLossless(
            f"error: speculative output differed from greedy target output on {len(mismatches)} "
            f"prompts (ids {mismatches[:5]}), not by a runner-up of greedy's within tie_tolerance "
            f"of its logit ({tie_tolerance}, dtype {dtype})"
        )
    share = round(len(near_ties) / len(verdicts), 4) if verdicts else 0.0
    if share > max_near_tie_share:
        raise NotLossless(
            f"error: {len(near_ties)} of {len(verdicts)} prompts ({share:.0%}) diverged from "
            f"greedy at a near-tie (<= {tie_tolerance} in {dtype}; ids {near_ties[:5]}), above "
            f"evaluate.max_near_tie_share {max_near_tie_share}: each is checked only up to its "
            "first differing token. Evaluate in float32, with fewer max_new_tokens, or raise "
            "evaluate.max_near_tie_share"
        )
    if near_ties:
        log.info(
            f"evaluate: {len(near_ties)} of {len(verdicts)} prompts diverged from greedy at a "
            f"near-tie (the speculative token a runner-up of greedy's within {tie_tolerance} of "
            f"its logit in {dtype}; ids {near_ties[:5]}); counted as near_tie_divergences"
        )
    return {
        # equal to greedy token for token: the prompts the check covers whole
        "lossless_checked_prompts": sum(v == "identical" for v in verdicts.values()),
        "near_tie_divergences": len(near_ties),
        "near_tie_share": share,
    }


# ---- acceptance from decoding rounds ------------------------------------------------------


def mean(xs) -> float:
    return round(sum(xs) / len(xs), 4) if xs else 0.0


def _per_position(rounds: list[int], k: int) -> dict[str, float]:
    n = len(rounds)
    return {
        str(i): round(sum(1 for r in rounds if r - 1 >= i) / n, 4) if n else 0.0
        for i in range(1, k + 1)
    }


def acceptance_summary(rounds: list[int], k: int, emitted: list[int] | None = None) -> dict:
    """Real acceptance from rounds of chain decoding (a+1 tokens per round, 1..k+1).

    acceptance_length: mean a+1 over the rounds, each counted whole (vLLM's 1 + accepted / drafts);
    position_acceptance[i]: share of rounds whose draft tokens 1..i were all accepted (vLLM's
    per-position rate: accepted_per_pos / drafts); histogram[n]: rounds with a+1 = n.
    emitted (Generation.emitted_per_round, the same rounds): tokens each round actually added,
    the last round of a prompt cut at eos or max_new_tokens. tokens_per_step = emitted tokens /
    rounds, at most acceptance_length; emitted_position_acceptance and emitted_histogram count
    the emitted tokens the same way, so tokens_per_step = 1 + sum of emitted_position_acceptance.
    """
    out = {
        "acceptance_length": mean(rounds),
        "rounds": len(rounds),
        "position_acceptance": _per_position(rounds, k),
        "histogram": {str(t): sum(1 for r in rounds if r == t) for t in range(1, k + 2)},
    }
    if emitted is not None:
        if len(emitted) != len(rounds) or any(not 1 <= e <= r for e, r in zip(emitted, rounds)):
            raise ValueError("emitted: one count per round, 1 <= emitted <= a+1")
        out["tokens_per_step"] = mean(emitted)
        out["emitted_position_acceptance"] = _per_position(emitted, k)
        out["emitted_histogram"] = {
            str(t): sum(1 for e in emitted if e == t) for t in range(1, k + 2)
        }
    return out


# ---- simulated acceptance (tau_sim) from teacher-forced accuracy ----------------------------


def teacher_forced_sample(
    target, aux_layer_ids: list[int], prompt: list[int], completion: list[int], storage=None
) -> dict:
    """One sample in speculators' training layout over prompt + the target's own completion.

    Hidden states come from the same capture as the hidden_states stage; loss_mask marks the
    completion tokens, so after speculators' shift_batch the draft is scored exactly where the
    speculative decoder drafts: from the first completion token (the prefill's output) onwards.
    `storage` (torch.bfloat16, torch.float8_e4m3fn): the states take that format's round trip, as
    the trainer read them (draftline/hidden_states/formats.py); None = as a server hands them to the draft.
    """
    # torch, hidden states and decoders load on first use: vLLM alone (parity false) needs none
    import torch

    from draftline.hidden_states.capture import capture

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


def teacher_forced_sums(draft, sample: dict, forward: Forward, device: str) -> dict[str, float]:
    """The draft's own forward (draftline/draft/forward.py) over one sample, packed alone; the raw
    `*_sum`/`*_total` metric counts."""
    import torch

    from draftline.draft.forward import PackLayout, device_loss_config, pack_collate, run_batch

    hidden_size = sample["verifier_last_hidden_states"].shape[-1]
    shifted = drafter(forward.method).shifted
    layout = PackLayout(len(sample["input_ids"]) - int(shifted), hidden_size, shifted)
    batch = pack_collate(layout, torch.float32)([sample])
    loss_config = device_loss_config("cpu")  # the loss is not used: the eager one needs no Triton
    with torch.no_grad():
        _, _, metrics = run_batch(draft, batch, device, forward, loss_config)
    sums: dict[str, float] = {}
    accumulate(sums, metrics)
    return sums


def simulated_acceptance(sums: dict[str, float], forward: Forward) -> dict:
    """tau_sim = 1 + sum_i acc_i with acc_i = P(draft steps 0..i all match the target), as in train."""
    s = summarize(sums, forward)
    return {
        "tau_sim": s["tau_sim"],
        "position_accuracy": {str(i + 1): a for i, a in enumerate(s["position_accuracy"])},
    }


# ---- the evaluate stage's run ----------------------------------------------------------------


@dataclass(frozen=True)
class EvaluationRun:
    """The metrics report, and the rows of each plot file (file name -> rows) under the plots dir."""

    report: dict
    plots: dict[str, list[dict]]
    # per prompt id: the first-turn ids decoded and the target's greedy output (the parity check
    # against vLLM compares them)
    prompt_ids: dict[str, list[int]] = field(default_factory=dict)
    greedy: dict[str, list[int]] = field(default_factory=dict)
    # per prompt id: greedy's near-ties at each token (Generation.runner_ups), for judging another
    # engine's output by the same rule (the parity gate)
    runner_ups: dict[str, list[dict[int, float]]] = field(default_factory=dict)

    @classmethod
    def empty(cls) -> EvaluationRun:
        """The run of an empty prompts file (the dev split of mix.dev_samples: 0): a report of 0
        prompts, nothing measured."""
        return cls(report={"prompts": 0}, plots={})

    @property
    def is_empty(self) -> bool:
        """Whether nothing was measured: the prompts file held none (EvaluationRun.empty)."""
        return self.report == {"prompts": 0}

    def greedy_run(self, prompt_id: str):
        """The greedy output of a prompt as compare_to_greedy reads it (tokens, runner_ups)."""
        from draftline.evaluate.specdec import Generation

        return Generation(self.greedy[prompt_id], runner_ups=self.runner_ups.get(prompt_id, []))


def mixed_train_count(eval_path: str | Path, samples: int) -> int:
    """Train prompts the mix drew, from its meta.json beside the eval prompts; prompts made by hand
    (no mix meta there) are taken to be `samples`, and the stage says so."""
    meta_path = Path(eval_path).parent / "meta.json"
    if not meta_path.is_file():
        log.info(
            f"evaluate: no {meta_path} of the `mix` stage; the scaling point is put at samples={samples}"
        )
        return samples
    try:
        return int(read_json(meta_path)["counts"]["train"])
    except (ValueError, KeyError, TypeError) as err:
        raise EvalPromptsError(
            f"error: {meta_path}: no train count of the `mix` stage ({type(err).__name__}: {err}); "
            "the scaling plot records the train prompts mix drew, so run `mix` again"
        ) from None


def per_source_report(groups, k: int) -> dict:
    """Acceptance length, tokens per step, tau_sim and prompt count of each (name, group of
    prompts), in that order."""
    return {
        name: {
            "acceptance_length": mean(s["rounds"]),
            "tokens_per_step": mean(s["emitted"]),
            "tau_sim": simulated_acceptance(s["sums"], chain(k))["tau_sim"],
            "prompts": s["prompts"],
        }
        for name, s in groups
    }


def _new_group() -> dict:
    """An empty tally of one group of prompts, as per_source_report reads it."""
    return {"rounds": [], "emitted": [], "sums": {}, "prompts": 0, "rounds_by_k": defaultdict(list)}


def acceptance_vs_k(groups) -> dict:
    """{group name: {k: acceptance length}} from each group's rounds walked at every k <= the
    evaluated one (draftline/evaluate/specdec.walk_rounds)."""
    return {
        name: {str(k): mean(rounds) for k, rounds in sorted(s["rounds_by_k"].items())}
        for name, s in groups
    }


@dataclass
class EvaluationTally:
    """What evaluate_draft gathers over the prompts: rounds, emitted tokens and teacher-forced
    sums, overall and per group, with each prompt's verdict, first-turn ids and greedy output.
    fp8: the draft was trained on fp8 states, so tau_sim is also taken over states through the
    fp8 round trip (sums_stored)."""

    fp8: bool = False
    rounds: list[int] = field(default_factory=list)
    emitted: list[int] = field(default_factory=list)
    sums: dict[str, float] = field(default_factory=dict)
    sums_stored: dict[str, float] = field(default_factory=dict)  # over fp8 round-tripped states
    verdicts: dict[str, str] = field(default_factory=dict)
    per_source: defaultdict = field(default_factory=lambda: defaultdict(_new_group))
    # (dataset, its row's own source)
    per_detail: defaultdict = field(default_factory=lambda: defaultdict(_new_group))
    generated: int = 0
    prompt_ids: dict[str, list[int]] = field(default_factory=dict)
    greedy: dict[str, list[int]] = field(default_factory=dict)
    runner_ups: dict[str, list[dict[int, float]]] = field(default_factory=dict)
    rounds_by_k: defaultdict = field(default_factory=lambda: defaultdict(list))
    # prompts whose one-pass rounds at the evaluated k equal the direct run's (a rounding flip
    # between one full forward and the incremental ones can make one differ)
    sweep_agrees: int = 0
    # every verification step with its context and span (draftline/evaluate/context.py)
    steps: list[Step] = field(default_factory=list)

    def add_sweep(self, row: dict, by_k: dict[int, list[int]], agrees: bool) -> None:
        """One prompt's rounds at every k <= the evaluated one, overall and in its source."""
        for k, rounds in by_k.items():
            self.rounds_by_k[k].extend(rounds)
            self.per_source[row.get("source", "?")]["rounds_by_k"][k].extend(rounds)
        self.sweep_agrees += agrees

    def add(self, row: dict, spec, sums: dict[str, float]) -> None:
        """Count one prompt's speculative rounds and teacher-forced sums in its groups and overall."""
        groups = [self.per_source[row.get("source", "?")]]
        if row.get("source_detail"):
            groups.append(self.per_detail[(row.get("source", "?"), row["source_detail"])])
        for src in groups:
            src["rounds"].extend(spec.accepted_per_round)
            src["emitted"].extend(spec.emitted_per_round)
            src["prompts"] += 1
            accumulate(src["sums"], sums)
        self.rounds.extend(spec.accepted_per_round)
        self.emitted.extend(spec.emitted_per_round)
        accumulate(self.sums, sums)


@dataclass(frozen=True)
class EvaluationModels:
    """The loaded target, its tokenizer and the draft, with what decoding every prompt shares."""

    target: object
    tokenizer: object
    draft: object
    device: str
    stop: set[int]
    tie_tolerance: float
    markup: Markup | None = None  # the reasoning span's tokens, where the target has them


def load_models(cfg: EvaluateConfig, card: TargetCard, draft_dir: str | Path) -> EvaluationModels:
    """The target (cfg's device, dtype and device_map) and the draft in draft_dir."""
    import torch

    device = cfg.resolved_device()
    target, tokenizer = load_target(card, device, getattr(torch, cfg.dtype), cfg.device_map)
    tie_tolerance = cfg.resolved_tie_tolerance()
    draft = load_draft(draft_dir, card, device)
    return EvaluationModels(
        target,
        tokenizer,
        draft,
        device,
        eos_ids(tokenizer, target),
        tie_tolerance,
        Markup.of(tokenizer, cfg.reasoning_markup),
    )


def trained_longest_row(draft_dir: str | Path) -> int | None:
    """The longest row (tokens) the draft was trained on, as its meta.json records it (train's
    `trained_rows`); None for a draft trained elsewhere."""
    meta = Path(draft_dir, "meta.json")
    rows = (read_json(meta).get("trained_rows") or {}) if meta.is_file() else {}
    return rows.get("longest")


def context_sections(cfg: EvaluateConfig, tally: EvaluationTally, markup: Markup | None, longest):
    """The report's sections on acceptance against context and reasoning: by_context (with its
    collapse test), by_span where the target marks reasoning, and the prompts past the draft's
    trained length (draftline/evaluate/context.py)."""
    contexts = by_context(
        tally.steps, cfg.context_buckets, cfg.confidence, "verification step context"
    )
    contexts["collapse"] = collapse(contexts, cfg.collapse_share)
    lengths = {
        prompt: len(ids) + len(tally.greedy.get(prompt, []))
        for prompt, ids in tally.prompt_ids.items()
    }
    sections = {
        "by_context": contexts,
        "trained_length": beyond_trained(lengths, longest),
    }
    if markup is not None:
        sections["by_span"] = by_span(tally.steps, cfg.confidence, cfg.reasoning_markup)
    else:
        sections["by_span"] = {
            "markup": list(cfg.reasoning_markup),
            "skipped": "the markup is not one token each in the target's tokenizer",
        }
    return sections


def context_plot(report: dict) -> list[dict]:
    """acceptance_vs_context.json: one row per bucket holding steps."""
    return [
        {
            "bucket": b["bucket"],
            "from_tokens": b["from_tokens"],
            "acceptance_length": b["acceptance_length"],
            "low": b["low"],
            "high": b["high"],
            "prompts": b["prompts"],
            "steps": b["steps"],
            "repetition_rate": b["repetition_rate"],
        }
        for b in report["by_context"]["buckets"]
        if b["steps"]
    ]


def context_summary(report: dict, share: float) -> dict:
    """reports/evaluate/context.json, what the benchmark's verdict says of context: the buckets
    of the held-out split and of each eval set this run's draft was measured on (report `sets`),
    the collapse test of each and its sentence, the trained length and the prompts past it
    (report: the evaluate report, with by_context from either engine)."""
    from draftline.evaluate.context import beyond_words, collapse_words

    measured = {"held-out split": report["by_context"]}
    for name, drafts in ((report.get("sets") or {}).get("results") or {}).items():
        trained = drafts.get("trained") or {}
        if trained.get("by_context") and name != "heldout":  # the split: report["by_context"]
            measured[f"eval set {name}"] = trained["by_context"]
    words, sections = [], {}
    for name, contexts in measured.items():
        fall = collapse(contexts, share)
        sections[name] = {**contexts, "collapse": fall}
        if sentence := collapse_words(fall, contexts):
            words.append(f"on the {name}, {sentence}")
    return {
        "by_context": sections["held-out split"],
        "sets": {name: c for name, c in sections.items() if name != "held-out split"},
        "collapse_share": share,
        "collapse_words": "; ".join(words) or None,
        "trained_length": report.get("trained_length"),
        "beyond_words": beyond_words(report.get("trained_length") or {}),
    }


def thinking_switch(
    models: EvaluationModels, cfg: EvaluateConfig, aux_ids: list[int], rows: list[dict]
) -> dict | None:
    """Acceptance with the template's thinking switch on and off (chat_template_kwargs
    {cfg.thinking_switch: true / false}), the same prompts decoded speculatively each way, with
    the reasoning/answer split of each; None where the template does not read the switch."""
    name = cfg.thinking_switch
    template = getattr(models.tokenizer, "chat_template", None) or ""
    if not name or not isinstance(template, str) or name not in template:
        return None
    from draftline.evaluate.specdec import SpecPair, speculative_generate

    pair = SpecPair(models.target, models.draft, aux_ids)
    out = {"switch": name}
    for state, value in (("on", True), ("off", False)):
        steps = []
        for row in rows:
            ids = eval_prompt_ids(models.tokenizer, row, {name: value})
            spec = speculative_generate(pair, ids, cfg.max_new_tokens, cfg.k, models.stop)
            steps += prompt_steps(
                row["id"], ids, spec.tokens, spec.accepted_per_round, spec.emitted_per_round,
                models.markup,
            )  # fmt: skip
        out[state] = group_figures(steps, cfg.confidence)
        if models.markup is not None:
            out[state]["by_span"] = by_span(steps, cfg.confidence, cfg.reasoning_markup)
    return out


def trained_on_fp8(draft_dir: str | Path) -> bool:
    """Whether the draft's meta.json records fp8 hidden states as what it was trained on."""
    trained_on = (
        (read_json(f"{draft_dir}/meta.json").get("hidden_states") or {})
        if Path(draft_dir, "meta.json").exists()
        else {}
    )
    return trained_on.get("format") == "fp8"


def evaluate_prompt(
    models: EvaluationModels,
    cfg: EvaluateConfig,
    aux_ids: list[int],
    row: dict,
    tally: EvaluationTally,
) -> None:
    """Decode one eval prompt speculatively and greedily, judge it against greedy, and add its
    rounds and teacher-forced sums (with tally.fp8: also over fp8 round-tripped states) to tally."""
    import torch

    from draftline.evaluate.specdec import (
        SpecPair,
        acceptance_runs,
        greedy_generate,
        speculative_generate,
        walk_rounds,
    )

    target, draft, stop = models.target, models.draft, models.stop
    pair = SpecPair(target, draft, aux_ids)
    # a later turn of a multi-turn row carries its own ids (draftline/evaluate/compare.py); a
    # long history is decoded whole (draftline/evaluate/prompts.py eval_prompt_ids)
    ids = eval_prompt_ids(models.tokenizer, row)
    tally.prompt_ids[row["id"]] = ids
    spec = speculative_generate(pair, ids, cfg.max_new_tokens, cfg.k, stop)
    tally.steps.extend(
        prompt_steps(
            row["id"], ids, spec.tokens, spec.accepted_per_round, spec.emitted_per_round,
            models.markup,
        )
    )  # fmt: skip
    # acceptance at every k <= cfg.k from one pass over the greedy output
    output, runs = acceptance_runs(pair, ids, cfg.max_new_tokens, cfg.k, stop)
    by_k = {k: walk_rounds(runs, len(output), k) for k in range(1, cfg.k + 1)}
    tally.add_sweep(row, by_k, by_k[cfg.k] == spec.accepted_per_round)
    plain = greedy_generate(target, ids, cfg.max_new_tokens, stop, True, models.tie_tolerance)
    tally.verdicts[row["id"]] = compare_to_greedy(spec.tokens, plain, models.tie_tolerance)
    tally.greedy[row["id"]] = list(plain.tokens)
    tally.runner_ups[row["id"]] = plain.runner_ups
    sums = teacher_forced_sums(
        draft,
        teacher_forced_sample(target, aux_ids, ids, plain.tokens),
        chain(cfg.k),
        models.device,
    )
    if tally.fp8:
        accumulate(
            tally.sums_stored,
            teacher_forced_sums(
                draft,
                teacher_forced_sample(target, aux_ids, ids, plain.tokens, torch.float8_e4m3fn),
                chain(cfg.k),
                models.device,
            ),
        )
    tally.add(row, spec, sums)
    tally.generated += len(plain.tokens)


def evaluation_report(
    cfg: EvaluateConfig, prompts: int, tally: EvaluationTally, real: dict, sim: dict, lossless: dict
) -> dict:
    """The metrics report: real (acceptance_summary) and simulated acceptance overall, per source
    and per row source where rows name one, the lossless figures, and tau_sim over fp8 states."""
    report = {
        "acceptance_length": real["acceptance_length"],
        "tau_sim": sim["tau_sim"],
        "tokens_per_step": real["tokens_per_step"],
        "engine": "hf",  # the built-in engine measured the headline (vLLM's run replaces it)
        "k": cfg.k,
        "prompts": prompts,
        "generated_tokens": tally.generated,
        "rounds": real["rounds"],
        "position_acceptance": real["position_acceptance"],
        "emitted_position_acceptance": real["emitted_position_acceptance"],
        "sim_position_accuracy": sim["position_accuracy"],
        "histogram": real["histogram"],
        "emitted_histogram": real["emitted_histogram"],
        "per_source": per_source_report(sorted(tally.per_source.items()), cfg.k),
        **(
            {
                "per_source_detail": per_source_report(
                    (
                        (f"{name}/{detail}", s)
                        for (name, detail), s in sorted(tally.per_detail.items())
                    ),
                    cfg.k,
                )
            }
            if tally.per_detail
            else {}
        ),
        "acceptance_vs_k": {
            "all": {str(k): mean(r) for k, r in sorted(tally.rounds_by_k.items())},
            **acceptance_vs_k(sorted(tally.per_source.items())),
        },
        # the one-pass rounds at k equal the direct run's on this many prompts (the rest: a
        # rounding flip of the draft between one full forward of the target and incremental ones)
        "acceptance_vs_k_agreeing_prompts": tally.sweep_agrees,
        **lossless,
    }
    if tally.fp8:
        report["tau_sim_fp8_states"] = simulated_acceptance(tally.sums_stored, chain(cfg.k))[
            "tau_sim"
        ]
    return report


def evaluation_plots(
    train_prompts: int, samples: int, report: dict, real: dict
) -> dict[str, list[dict]]:
    """The plot files' rows: the scaling point (train prompts drawn, and requested) and the
    acceptance at each draft position."""
    return {
        "acceptance_vs_samples.json": [
            {
                "samples": train_prompts,
                "samples_requested": samples,
                "k": report["k"],
                "acceptance_length": report["acceptance_length"],
                "tau_sim": report["tau_sim"],
            }
        ],
        "position_acceptance.json": [
            {"position": int(pos), "acceptance": rate}
            for pos, rate in real["position_acceptance"].items()
        ],
        "acceptance_vs_k.json": [
            {"k": int(k), "source": source, "acceptance_length": tau}
            for source, curve in report["acceptance_vs_k"].items()
            for k, tau in curve.items()
        ],
    }


def evaluate_draft(
    cfg: EvaluateConfig,
    card: TargetCard,
    draft_dir: str | Path,
    eval_path: str | Path,
    samples: int,
) -> EvaluationRun:
    """Decode every eval prompt (up to cfg.prompts) speculatively and greedily with the target and
    the draft in draft_dir, check them lossless, and report real and simulated acceptance;
    `samples` (the params' training prompts requested) goes beside the scaling point."""
    from rich.progress import track

    models = load_models(cfg, card, draft_dir)
    rows = list(read_jsonl(eval_path))[: cfg.prompts]
    if not rows:
        raise EvalPromptsError(f"error: {eval_path} has no eval prompts")
    train_prompts = mixed_train_count(eval_path, samples)

    # a draft trained on fp8 states: tau_sim also over states through the fp8 round trip it was trained on
    tally = EvaluationTally(fp8=trained_on_fp8(draft_dir))
    for row in track(rows, description="evaluate"):
        evaluate_prompt(models, cfg, card.aux_ids, row, tally)
    lossless = lossless_summary(
        tally.verdicts, models.tie_tolerance, cfg.dtype, cfg.max_near_tie_share
    )

    real = acceptance_summary(tally.rounds, cfg.k, tally.emitted)
    sim = simulated_acceptance(tally.sums, chain(cfg.k))
    report = evaluation_report(cfg, len(rows), tally, real, sim, lossless)
    report |= context_sections(cfg, tally, models.markup, trained_longest_row(draft_dir))
    # each prompt's own acceptance: other drafts are paired with this one over them (compare.py)
    report["per_prompt_acceptance"] = per_prompt_acceptance(tally.steps)
    switch = thinking_switch(models, cfg, card.aux_ids, rows)
    if switch is not None:
        report["thinking_switch"] = switch
    log.info(
        f"evaluate: acceptance length {report['acceptance_length']:.3f} over {real['rounds']} rounds (k={cfg.k}), "
        f"{report['tokens_per_step']:.3f} tokens emitted per step, "
        f"tau_sim {report['tau_sim']:.3f}; per position {list(real['position_acceptance'].values())}"
    )
    return EvaluationRun(
        report,
        {
            **evaluation_plots(train_prompts, samples, report, real),
            "acceptance_vs_context.json": context_plot(report),
        },
        tally.prompt_ids,
        tally.greedy,
        tally.runner_ups,
    )
