"""Acceptance where long prompts and reasoning live: verification steps bucketed by the context
they ran at, and split into reasoning and answer spans, each figure with an interval over prompts.

A draft trained on rows cut at `tokenize.max_length` can hold its acceptance on short prompts and
lose it on long ones; one acceptance per eval set hides that. Here every verification step carries
its context (the tokens the target had before the step: prompt plus what was generated), and the
steps are counted per bucket of `evaluate.context_buckets`. The built-in engine knows each step's
context; vLLM's counters are per engine, not per step, so vLLM's requests are bucketed by their
prompt length and each bucket's requests run together (draftline/evaluate/vllm_generate.py;
counted_buckets), with no interval: one count per bucket, not per prompt.

Steps within one prompt are correlated (a draft that fails on a prompt's topic fails on most of
its steps), so a bucket's interval treats prompts as the units: the ratio estimator of accepted
tokens per step with its linearised variance over prompts (a cluster-robust interval), Student-t
at prompts - 1 degrees of freedom. A bucket with one prompt has no interval.

Repetition: a target that degenerates into loops at long context makes drafting easy and inflates
acceptance. A generated token is a repeat when the `REPEAT_NGRAM` tokens ending with it already
occurred earlier in the sequence (prompt included); each bucket reports its share of repeats.

Reasoning vs answer: where the template marks reasoning with a pair of single tokens (the tiny
target's and Qwen3's `<think>` / `</think>`), a step is in reasoning when the last marker before it
opened a span (the prompt counted: a template can open the span in its generation prompt). Every
step is in exactly one of the two, so the two counts sum to the whole.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from draftline.core.errors import DraftlineError
from draftline.core.stats import t_quantile

REPEAT_NGRAM = 4  # a repeat: these many tokens ending at the token seen before in the sequence


class ContextBucketsError(DraftlineError):
    """evaluate.context_buckets cannot bucket contexts (not increasing, not positive)."""


@dataclass(frozen=True)
class Step:
    """One verification step of one prompt: the context the target had before it (prompt plus
    generated tokens), the tokens it accepted plus the target's own (a+1), the tokens it added to
    the output (a+1, the last step cut at eos or max_new_tokens), how many of those repeat an
    earlier n-gram, and whether it ran inside a reasoning span (None: no markup known)."""

    prompt: str
    context: int
    accepted: int
    emitted: int
    repeats: int = 0
    reasoning: bool | None = None


def check_edges(edges: Sequence[int]) -> list[int]:
    """The bucket edges, strictly increasing positive token counts; ContextBucketsError otherwise."""
    edges = [int(e) for e in edges]
    if any(e <= 0 for e in edges) or any(b <= a for a, b in zip(edges, edges[1:])):
        raise ContextBucketsError(
            f"error: evaluate.context_buckets {edges}: give strictly increasing positive token "
            "counts, e.g. [512, 2048, 8192] (buckets <512, 512-2048, 2048-8192, >=8192)"
        )
    return edges


def bucket_labels(edges: Sequence[int]) -> list[str]:
    """Names of the len(edges) + 1 buckets: '<e0', 'e0-e1', ..., '>=eN'."""
    inner = [f"{a}-{b}" for a, b in zip(edges, edges[1:])]
    return [f"<{edges[0]}", *inner, f">={edges[-1]}"] if edges else ["all"]


def bucket_index(context: int, edges: Sequence[int]) -> int:
    """The bucket of a context: i where edges[i-1] <= context < edges[i]."""
    return bisect_right(edges, context)


def repeat_flags(sequence: Sequence[int], start: int, n: int = REPEAT_NGRAM) -> list[bool]:
    """For each token of sequence[start:]: whether the n tokens ending with it occurred before
    (ending earlier) in the sequence."""
    seen: set[tuple[int, ...]] = set()
    flags = []
    for end in range(n, len(sequence) + 1):
        gram = tuple(sequence[end - n : end])
        if end - 1 >= start:
            flags.append(gram in seen)
        seen.add(gram)
    return [False] * (len(sequence) - start - len(flags)) + flags


def clustered_ratio(units: Sequence[tuple[float, float]], confidence: float) -> dict:
    """sum(a) / sum(n) over units (a, n) (per prompt: tokens per step summed, steps) with its
    interval over units: the ratio estimator's linearised variance, Student-t at units - 1 dof.
    low/high None with fewer than two units."""
    units = [(a, n) for a, n in units if n > 0]
    steps = sum(n for _, n in units)
    if not steps:
        return {"value": None, "low": None, "high": None}
    ratio = sum(a for a, _ in units) / steps
    m = len(units)
    if m < 2:
        return {"value": round(ratio, 4), "low": None, "high": None}
    mean_n = steps / m
    var = sum((a - ratio * n) ** 2 for a, n in units) / (m * (m - 1) * mean_n**2)
    half = t_quantile(0.5 + confidence / 2, m - 1) * var**0.5
    return {"value": round(ratio, 4), "low": round(ratio - half, 4), "high": round(ratio + half, 4)}


def group_figures(steps: Iterable[Step], confidence: float) -> dict:
    """Acceptance length (tokens per step verified, a+1) and tokens per step emitted, each with
    its interval over prompts, the repetition rate, and the counts, of one group of steps."""
    per_prompt: dict[str, list[Step]] = defaultdict(list)
    for step in steps:
        per_prompt[step.prompt].append(step)
    accepted = clustered_ratio(
        [(sum(s.accepted for s in ss), len(ss)) for ss in per_prompt.values()], confidence
    )
    emitted_tokens = sum(s.emitted for ss in per_prompt.values() for s in ss)
    repeats = sum(s.repeats for ss in per_prompt.values() for s in ss)
    return {
        "acceptance_length": accepted["value"],
        "low": accepted["low"],
        "high": accepted["high"],
        "prompts": len(per_prompt),
        "steps": sum(len(ss) for ss in per_prompt.values()),
        "emitted_tokens": emitted_tokens,
        "repetition_rate": round(repeats / emitted_tokens, 4) if emitted_tokens else None,
    }


def by_context(steps: Sequence[Step], edges: Sequence[int], confidence: float, basis: str) -> dict:
    """Every bucket of `edges` with its figures (group_figures; an empty bucket: 0 prompts)."""
    edges = check_edges(edges)
    groups: dict[int, list[Step]] = defaultdict(list)
    for step in steps:
        groups[bucket_index(step.context, edges)].append(step)
    bounds = [0, *edges, None]
    buckets = [
        {
            "bucket": label,
            "from_tokens": bounds[i],
            "to_tokens": bounds[i + 1],
            **group_figures(groups.get(i, []), confidence),
        }
        for i, label in enumerate(bucket_labels(edges))
    ]
    return {"basis": basis, "edges": list(edges), "confidence": confidence, "buckets": buckets}


def collapse(report: dict, share: float) -> dict | None:
    """Whether acceptance falls with context: the longest bucket holding steps against the
    shortest one, 'collapses' when its acceptance length is below `share` of the shortest's.
    `separated`: the two intervals do not overlap (the fall is more than the prompts' spread).
    None with fewer than two buckets holding steps."""
    filled = [b for b in report["buckets"] if b["steps"]]
    if len(filled) < 2:
        return None
    short, long = filled[0], filled[-1]
    ratio = long["acceptance_length"] / short["acceptance_length"]
    separated = None
    if None not in (short["low"], long["high"]):
        separated = long["high"] < short["low"]
    return {
        "shortest": short["bucket"],
        "longest": long["bucket"],
        "ratio": round(ratio, 4),
        "share": share,
        "collapses": ratio < share,
        "separated": separated,
    }


def collapse_words(fall: dict | None, report: dict) -> str | None:
    """One sentence on acceptance against context, for the verdict: None when nothing can be
    said (fewer than two buckets measured) or when acceptance holds."""
    if fall is None or not fall["collapses"]:
        return None
    named = {b["bucket"]: b for b in report["buckets"]}
    short, long = named[fall["shortest"]], named[fall["longest"]]
    how = (
        "beyond the prompts' spread"
        if fall["separated"]
        else "within the prompts' spread: more long prompts would tell"
        if fall["separated"] is False
        else "no interval: one prompt, or one count per bucket (vLLM)"
    )
    return (
        f"acceptance collapses with context: {long['acceptance_length']:.2f} at "
        f"{long['bucket']} tokens against {short['acceptance_length']:.2f} at "
        f"{short['bucket']} ({fall['ratio']:.0%}, below {fall['share']:.0%}; {how})"
    )


# ---- reasoning vs answer -------------------------------------------------------------------


@dataclass(frozen=True)
class Markup:
    """The single-token ids that open and close a reasoning span."""

    open_id: int
    close_id: int

    @classmethod
    def of(cls, tokenizer, pair: Sequence[str]) -> Markup | None:
        """The pair's ids in the tokenizer; None when either is not one token of it."""
        if len(pair) != 2:
            return None
        ids = []
        for text in pair:
            encoded = tokenizer.encode(text, add_special_tokens=False)
            if len(encoded) != 1:
                return None
            ids.append(encoded[0])
        return cls(*ids)

    def inside(self, sequence: Sequence[int], upto: int) -> list[bool]:
        """For each position p < upto: whether the last marker at or before p opened a span."""
        state, out = False, []
        for token in sequence[:upto]:
            if token == self.open_id:
                state = True
            elif token == self.close_id:
                state = False
            out.append(state)
        return out


def by_span(steps: Sequence[Step], confidence: float, markup: Sequence[str]) -> dict:
    """Reasoning and answer steps' figures (group_figures); the two sum to all steps."""
    reasoning = [s for s in steps if s.reasoning]
    answer = [s for s in steps if s.reasoning is False]
    return {
        "markup": list(markup),
        "reasoning": group_figures(reasoning, confidence),
        "answer": group_figures(answer, confidence),
        "reasoning_share_of_steps": round(len(reasoning) / len(steps), 4) if steps else None,
    }


def prompt_steps(
    prompt_id: str,
    prompt: Sequence[int],
    output: Sequence[int],
    rounds: Sequence[int],
    emitted: Sequence[int],
    markup: Markup | None,
) -> list[Step]:
    """The steps of one prompt decoded by chain speculative decoding: rounds (a+1 each) and
    emitted (tokens each added) as Generation reports them, output the generated tokens (the
    prefill's token first). Step r starts with the prompt, the prefill's token and every token
    emitted before it in context."""
    sequence = list(prompt) + list(output)
    flags = repeat_flags(sequence, len(prompt))
    inside = markup.inside(sequence, len(sequence)) if markup else None
    steps, done = [], 1  # the prefill's token is out before the first round
    for accepted, added in zip(rounds, emitted):
        context = len(prompt) + done
        steps.append(
            Step(
                prompt_id,
                context,
                accepted,
                added,
                repeats=sum(flags[done : done + added]),
                # the span of the step's pending token (the last one in context)
                reasoning=inside[context - 1] if inside is not None else None,
            )
        )
        done += added
    return steps


def counted_buckets(
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    counters: Sequence[dict | None],
    edges: Sequence[int],
    confidence: float,
) -> dict:
    """by_context's report from an engine that counts per run, not per step (vLLM): `requests`
    (prompt ids, output ids) bucketed by prompt length, `counters` one per bucket (its requests
    run together: drafts, accepted_tokens; None for an empty bucket). Acceptance length is
    1 + accepted / drafts per bucket, with no interval (one count per bucket, not per prompt)."""
    edges = check_edges(edges)
    labels = bucket_labels(edges)
    if len(counters) != len(labels):
        raise ValueError(
            f"one counter set per bucket: {len(labels)} buckets, {len(counters)} given"
        )
    members: dict[int, list[tuple[Sequence[int], Sequence[int]]]] = defaultdict(list)
    for prompt, output in requests:
        members[bucket_index(len(prompt), edges)].append((prompt, output))
    bounds, buckets = [0, *edges, None], []
    for i, label in enumerate(labels):
        counts = counters[i] or {}
        drafts = int(counts.get("drafts") or 0)
        # the output's first token is the prefill's, which no step verified (as prompt_steps)
        emitted = sum(max(len(out) - 1, 0) for _, out in members.get(i, []))
        repeats = sum(
            sum(repeat_flags([*prompt, *out], len(prompt) + 1))
            for prompt, out in members.get(i, [])
        )
        buckets.append(
            {
                "bucket": label,
                "from_tokens": bounds[i],
                "to_tokens": bounds[i + 1],
                "acceptance_length": round(1 + counts["accepted_tokens"] / drafts, 4)
                if drafts
                else None,
                "low": None,
                "high": None,
                "prompts": len(members.get(i, [])),
                "steps": drafts,
                "emitted_tokens": emitted,
                "repetition_rate": round(repeats / emitted, 4) if emitted else None,
            }
        )
    return {
        "basis": "prompt length (vLLM counts per run: each bucket's requests run together)",
        "edges": list(edges),
        "confidence": confidence,
        "buckets": buckets,
    }


# ---- what the draft was trained on ---------------------------------------------------------


def beyond_trained(lengths: dict[str, int], longest: int | None) -> dict:
    """The prompts whose decoded sequence (prompt plus output) ran past the longest row the draft
    was trained on (`longest`, from its meta.json; None: not recorded). A draft has never seen a
    position past it: acceptance there is extrapolation, however it measures."""
    measured = max(lengths.values(), default=0)
    if longest is None:
        return {
            "longest_trained_row": None,
            "longest_measured": measured,
            "why": "the draft's meta.json records no trained row lengths (a draft trained elsewhere)",
        }
    beyond = sorted(prompt for prompt, n in lengths.items() if n > longest)
    return {
        "longest_trained_row": longest,
        "longest_measured": measured,
        "prompts_beyond": beyond,
        "count_beyond": len(beyond),
    }


def beyond_words(trained: dict) -> str | None:
    """One sentence naming the prompts past the trained length; None when there are none."""
    if not trained.get("count_beyond"):
        return None
    named = ", ".join(trained["prompts_beyond"][:3])
    more = f" and {trained['count_beyond'] - 3} more" if trained["count_beyond"] > 3 else ""
    return (
        f"{trained['count_beyond']} eval prompt(s) ran past the longest row the draft was trained "
        f"on ({trained['longest_trained_row']} tokens; up to {trained['longest_measured']} "
        f"measured): {named}{more}"
    )


def served_context_limit(model_dir: str) -> int | None:
    """The longest context the target serves (max_position_embeddings of its config, nested text
    config included); None where the config is not a local file or does not say."""
    import json
    from pathlib import Path

    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text())
    for section in (config, config.get("text_config") or {}):
        if isinstance(section.get("max_position_embeddings"), int):
            return section["max_position_embeddings"]
    return None


def deploy_context(summary: dict | None, served_limit: int | None) -> dict:
    """What deploy.json and the verdict's words say of context, from evaluate's context.json
    (`summary`; None: not measured) and the longest context the target serves: the collapse
    sentence, the prompts past the trained length, and a warning when users' prompts may run
    past the longest row the draft was trained on."""
    if summary is None:
        return {"words": [], "deploy": {"measured": False}}
    trained = summary.get("trained_length") or {}
    longest = trained.get("longest_trained_row")
    words = [
        w[0].upper() + w[1:] + ("" if w.endswith(".") else ".")
        for w in (summary.get("collapse_words"), summary.get("beyond_words"))
        if w
    ]
    deploy = {
        "longest_trained_row": longest,
        "served_context_limit": served_limit,
        "longest_measured": trained.get("longest_measured"),
        "collapse": (summary.get("by_context") or {}).get("collapse"),
    }
    if longest is not None and (served_limit is None or served_limit > longest):
        limit = f"up to {served_limit:,}" if served_limit else "longer"
        deploy["warning"] = (
            f"the target serves prompts {limit} tokens; the draft never trained on a row past "
            f"{longest:,} tokens, so acceptance on longer prompts is untrained (measured up to "
            f"{trained.get('longest_measured', 0):,}: reports/evaluate/context.json; train on "
            "longer rows with tokenize.max_length, docs/evaluation.md#acceptance-by-context-length)"
        )
        words.append(deploy["warning"][0].upper() + deploy["warning"][1:] + ".")
    deploy["collapse_in_sets"] = {
        name: contexts.get("collapse") for name, contexts in (summary.get("sets") or {}).items()
    }
    return {"words": words, "deploy": deploy}
