"""Acceptance by context length and by reasoning vs answer (draftline/evaluate/context.py), on
hand-built decoding traces whose per-bucket counts are known."""

import math

import pytest

from draftline.evaluate.config import EvaluateConfig
from draftline.evaluate.context import (
    ContextBucketsError,
    Markup,
    beyond_trained,
    beyond_words,
    bucket_labels,
    by_context,
    by_span,
    check_edges,
    clustered_ratio,
    collapse,
    collapse_words,
    counted_buckets,
    deploy_context,
    prompt_steps,
    repeat_flags,
)

OPEN, CLOSE = 90, 91


def trace(prompt_len: int, rounds: list[int], output=None):
    """A prompt of prompt_len tokens and an output the rounds emit whole (the prefill's token
    first), distinct tokens (no repeats) unless given."""
    prompt = list(range(1000, 1000 + prompt_len))
    output = output or list(range(1 + sum(rounds)))
    return prompt, output, rounds, list(rounds)


def test_steps_carry_their_context_and_fall_in_the_right_buckets():
    # prompt of 10; rounds 3, 1, 2: contexts 10+1, 10+4, 10+5
    prompt, output, rounds, emitted = trace(10, [3, 1, 2])
    steps = prompt_steps("p", prompt, output, rounds, emitted, None)
    assert [s.context for s in steps] == [11, 14, 15]
    report = by_context(steps, [12, 15], 0.9, "verification step context")
    counts = {b["bucket"]: (b["steps"], b["emitted_tokens"]) for b in report["buckets"]}
    # 11 < 12; 14 in 12-15; 15 in >=15
    assert counts == {"<12": (1, 3), "12-15": (1, 1), ">=15": (1, 2)}
    assert [b["acceptance_length"] for b in report["buckets"]] == [3.0, 1.0, 2.0]


def test_bucket_counts_of_several_prompts_sum_to_the_whole():
    steps = []
    for i, (plen, rounds) in enumerate([(5, [4, 4, 1]), (300, [2, 2]), (2000, [1, 1, 1, 2])]):
        prompt, output, r, e = trace(plen, rounds)
        steps += prompt_steps(f"p{i}", prompt, output, r, e, None)
    report = by_context(steps, [256, 1024], 0.9, "step")
    by = {b["bucket"]: b for b in report["buckets"]}
    assert (by["<256"]["steps"], by["<256"]["prompts"]) == (3, 1)
    assert (by["256-1024"]["steps"], by["256-1024"]["prompts"]) == (2, 1)
    assert (by[">=1024"]["steps"], by[">=1024"]["prompts"]) == (4, 1)
    assert sum(b["steps"] for b in report["buckets"]) == len(steps)
    assert by["<256"]["acceptance_length"] == 3.0
    assert by[">=1024"]["acceptance_length"] == 1.25


def test_the_interval_is_over_prompts_not_steps():
    # two prompts: 3 steps of 4 tokens, 1 step of 1: ratio 13/4; the linearised variance
    units = [(12.0, 3.0), (1.0, 1.0)]
    got = clustered_ratio(units, 0.9)
    ratio = 13 / 4
    var = ((12 - ratio * 3) ** 2 + (1 - ratio) ** 2) / (2 * 1 * 2.0**2)
    half = 6.313751514675043 * math.sqrt(var)  # t(0.95, 1 dof)
    assert got["value"] == round(ratio, 4)
    assert got["low"] == pytest.approx(ratio - half, abs=1e-4)
    assert got["high"] == pytest.approx(ratio + half, abs=1e-4)
    # one prompt: no interval, however many steps
    assert clustered_ratio([(40.0, 10.0)], 0.9) == {"value": 4.0, "low": None, "high": None}


def test_reasoning_and_answer_sum_to_the_whole():
    # output: <think> a b </think> c d e f ... ; rounds of 2 tokens each
    output = [OPEN, 1, 2, CLOSE, 3, 4, 5, 6, 7]
    rounds = [2, 2, 2, 2]
    steps = prompt_steps("p", [50, 51], output, rounds, rounds, Markup(OPEN, CLOSE))
    # pending tokens at each step: output[0]=<think> (in), output[2]=2 (in), output[4]=3 (out) ...
    assert [s.reasoning for s in steps] == [True, True, False, False]
    split = by_span(steps, 0.9, ["<think>", "</think>"])
    assert split["reasoning"]["steps"] + split["answer"]["steps"] == len(steps)
    total_tokens = split["reasoning"]["emitted_tokens"] + split["answer"]["emitted_tokens"]
    assert total_tokens == sum(rounds)
    assert split["reasoning_share_of_steps"] == 0.5


def test_a_span_opened_by_the_generation_prompt_counts_as_reasoning():
    steps = prompt_steps("p", [50, OPEN], [1, 2, CLOSE, 4], [1, 2], [1, 2], Markup(OPEN, CLOSE))
    assert [s.reasoning for s in steps] == [True, True]


def test_markup_that_is_not_one_token_gives_no_split():
    class Tok:
        def encode(self, text, add_special_tokens=False):
            return {"<think>": [7], "</think>": [8, 9]}[text]

    assert Markup.of(Tok(), ["<think>", "</think>"]) is None


def test_repeats_are_ngrams_seen_before():
    seq = [1, 2, 3, 4, 9, 1, 2, 3, 4, 5]
    # from position 5 on: ...,1,2,3,4 repeats the first 4-gram at its last token
    assert repeat_flags(seq, 5) == [False, False, False, True, False]
    prompt, output = [1, 2, 3, 4], [9, 1, 2, 3, 4]
    steps = prompt_steps("p", prompt, output, [4], [4], None)
    report = by_context(steps, [100], 0.9, "step")
    assert report["buckets"][0]["repetition_rate"] == 0.25


def test_a_collapse_is_named_with_its_spread():
    steps = []
    for i in range(3):
        steps += prompt_steps(f"s{i}", *trace(10, [4, 4, 4])[0:2], [4, 4, 4], [4, 4, 4], None)
        prompt, output, r, e = trace(600, [1, 2, 1])
        steps += prompt_steps(f"l{i}", prompt, output, r, e, None)
    report = by_context(steps, [256], 0.9, "step")
    fall = collapse(report, 0.8)
    assert fall["collapses"] and fall["shortest"] == "<256" and fall["longest"] == ">=256"
    words = collapse_words(fall, report)
    assert "collapses" in words and "1.33 at >=256" in words
    # holding acceptance: no words
    assert collapse_words(collapse(report, 0.3), report) is None


def test_prompts_past_the_trained_length_are_named():
    trained = beyond_trained({"a": 100, "b": 900, "c": 1200}, 512)
    assert trained["prompts_beyond"] == ["b", "c"] and trained["count_beyond"] == 2
    assert "b, c" in beyond_words(trained) and "512" in beyond_words(trained)
    unknown = beyond_trained({"a": 100}, None)
    assert unknown["longest_trained_row"] is None and "no trained row lengths" in unknown["why"]
    assert beyond_words(unknown) is None


def test_deploy_warns_when_served_prompts_may_exceed_the_trained_rows():
    summary = {
        "trained_length": beyond_trained({"a": 300}, 512),
        "collapse_words": None,
        "beyond_words": None,
        "by_context": {"collapse": None},
    }
    notes = deploy_context(summary, 4096)
    assert "4,096" in notes["deploy"]["warning"] and "512" in notes["deploy"]["warning"]
    assert notes["words"]
    # a draft trained as long as the target serves: no warning
    assert "warning" not in deploy_context(summary, 512)["deploy"]
    assert deploy_context(None, 4096) == {"words": [], "deploy": {"measured": False}}


def test_vllm_buckets_by_prompt_length_from_one_count_per_bucket():
    requests = [([0] * 10, [1, 2, 3]), ([0] * 300, [1, 2]), ([0] * 20, [5, 6, 7, 8])]
    counters = [{"drafts": 4, "accepted_tokens": 4}, {"drafts": 2, "accepted_tokens": 1}]
    report = counted_buckets(requests, counters, [256], 0.9)
    short, long = report["buckets"]
    assert (short["prompts"], short["steps"], short["acceptance_length"]) == (2, 4, 2.0)
    assert short["emitted_tokens"] == 2 + 3  # the prefill's token of each output aside
    assert (long["prompts"], long["steps"], long["acceptance_length"]) == (1, 2, 1.5)
    assert short["low"] is None  # one count per bucket: no interval over prompts
    with pytest.raises(ValueError, match="one counter set per bucket"):
        counted_buckets(requests, counters[:1], [256], 0.9)


def test_bucket_edges_are_checked():
    assert bucket_labels([256, 1024]) == ["<256", "256-1024", ">=1024"]
    assert check_edges([]) == []
    with pytest.raises(ContextBucketsError, match="strictly increasing"):
        check_edges([512, 256])
    with pytest.raises(ValueError, match="context_buckets"):
        EvaluateConfig(context_buckets=[0, 10])


# ---- the built-in engine's evaluate run ------------------------------------------------------

SWITCH = "{%- if add_generation_prompt and enable_thinking is defined and not enable_thinking -%}"


def switch_template(template: str) -> str:
    """The tiny template with a Qwen3-style thinking switch: the generation prompt opens a
    reasoning span, or with enable_thinking false closes an empty one."""
    head, tail = template.rsplit("{%- if add_generation_prompt -%}", 1)
    return (
        head
        + "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
        + "{%- if enable_thinking is defined and not enable_thinking -%}"
        + "{{- '<think></think>\\n' -}}{%- else -%}{{- '<think>' -}}{%- endif -%}{%- endif -%}"
    )


@pytest.fixture(scope="module")
def models_and_rows(trained_draft):
    from draftline.evaluate.acceptance import load_models

    cfg = EvaluateConfig(k=2, max_new_tokens=16, device="cpu", context_buckets=[48, 64])
    models = load_models(cfg, trained_draft.card, trained_draft.dir)
    rows = [{"id": f"c{i}", **c} for i, c in enumerate(trained_draft.conversations)]
    return cfg, models, rows


def test_evaluate_reports_buckets_and_spans_that_sum_to_its_rounds(
    tmp_path, trained_draft, models_and_rows
):
    from draftline.core.io import write_jsonl
    from draftline.evaluate.acceptance import evaluate_draft

    cfg, _, rows = models_and_rows
    write_jsonl(tmp_path / "eval.jsonl", rows)
    run = evaluate_draft(cfg, trained_draft.card, trained_draft.dir, tmp_path / "eval.jsonl", 4)
    report = run.report
    buckets = report["by_context"]["buckets"]
    assert sum(b["steps"] for b in buckets) == report["rounds"]
    assert [b["bucket"] for b in buckets] == ["<48", "48-64", ">=64"]
    # every step at least its prompt's length of context: a bucket below the shortest is empty
    shortest = min(len(ids) for ids in run.prompt_ids.values())
    for b in buckets:
        if b["to_tokens"] is not None and b["to_tokens"] <= shortest:
            assert b["steps"] == 0
    filled = [b for b in buckets if b["steps"]]
    weighted = sum(b["acceptance_length"] * b["steps"] for b in filled) / report["rounds"]
    assert weighted == pytest.approx(report["acceptance_length"], abs=1e-3)
    span = report["by_span"]
    if "skipped" not in span:
        assert span["reasoning"]["steps"] + span["answer"]["steps"] == report["rounds"]
    # the draft's meta.json here records no trained rows: said, not guessed
    assert report["trained_length"]["longest_trained_row"] is None
    assert run.plots["acceptance_vs_context.json"]


def test_a_thinking_switch_is_measured_on_and_off(trained_draft, models_and_rows):
    from draftline.evaluate.acceptance import Markup, thinking_switch

    cfg, models, rows = models_and_rows
    tokenizer = models.tokenizer
    markup = Markup.of(tokenizer, cfg.reasoning_markup)
    if markup is None:
        pytest.skip("the test tokenizer has no single-token <think> markup")
    plain = tokenizer.chat_template
    aux = trained_draft.card.aux_ids
    assert thinking_switch(models, cfg, aux, rows) is None  # the template reads no switch
    tokenizer.chat_template = switch_template(plain)
    try:
        import dataclasses

        switched = thinking_switch(dataclasses.replace(models, markup=markup), cfg, aux, rows)
    finally:
        tokenizer.chat_template = plain
    assert switched["switch"] == "enable_thinking"
    on, off = switched["on"], switched["off"]
    assert on["steps"] > 0 and off["steps"] > 0
    # on: the generation prompt opens the span, so decoding starts inside reasoning; off: closed
    assert on["by_span"]["reasoning"]["steps"] > 0
    assert off["by_span"]["reasoning"]["steps"] == 0
    for state in (on, off):
        spans = state["by_span"]
        assert spans["reasoning"]["steps"] + spans["answer"]["steps"] == state["steps"]


def test_a_history_row_is_decoded_whole_and_another_row_by_its_first_turn(tiny_tokenizer):
    from draftline.evaluate.prompts import eval_prompt_ids
    from draftline.tokens.chat import chat_prompt_ids

    messages = [
        {"role": "user", "content": "part one"},
        {"role": "assistant", "content": "got it"},
        {"role": "user", "content": "part two, and the question"},
    ]
    whole = eval_prompt_ids(tiny_tokenizer, {"messages": messages, "decode": "history"})
    first = eval_prompt_ids(tiny_tokenizer, {"messages": messages})
    assert whole == chat_prompt_ids(tiny_tokenizer, messages, None, {})
    assert first == chat_prompt_ids(tiny_tokenizer, messages[:1], None, {})
    assert len(whole) > len(first)
    # a trailing assistant turn is not part of what is asked
    answered = [*messages, {"role": "assistant", "content": "an answer"}]
    assert eval_prompt_ids(tiny_tokenizer, {"messages": answered, "decode": "history"}) == whole
    assert eval_prompt_ids(tiny_tokenizer, {"messages": messages, "prompt_ids": [5, 6]}) == [5, 6]


def test_long_rows_are_decoded_whole_and_reach_the_longer_buckets(trained_draft, models_and_rows):
    """The long-context set's rows (draftline/data/pydoc_long.py) through the eval sets' path: a
    history decoded once, whole, its steps in the buckets of its length, past the trained rows."""
    from draftline.data.pydoc_long import PydocLongConfig, build_rows
    from draftline.evaluate.compare import measure_rows

    cfg, models, _ = models_and_rows
    rows = list(build_rows(PydocLongConfig(lengths=[128, 256], per_length=1, turn_tokens=64)))
    kinds = {row["source"].split("-")[0] for row in rows}
    assert kinds == {"document", "history"} and all(r["decode"] == "history" for r in rows)
    figures = measure_rows(models, cfg, trained_draft.card.aux_ids, rows)
    assert figures["turns"] == len(rows)  # one prompt per row, however many user turns
    buckets = figures["by_context"]["buckets"]
    assert sum(b["steps"] for b in buckets) == figures["rounds"]
    assert sum(b["steps"] for b in buckets if b["from_tokens"] >= 64) > 0
