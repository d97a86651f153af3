"""The benchmark's lossless gate (draftline/benchmark/lossless.py): each speculative output judged
against the baseline's greedy reference (token ids, near-ties from the reference's top logprobs,
the text where ids are missing), the gate over every k and load; and the top logprobs read off the
wire as the servers send them."""

from __future__ import annotations

import pytest

from draftline.benchmark import lossless
from draftline.benchmark.loadgen import (
    ChunkTimer,
    LoadTarget,
    RequestResult,
    parse_openai_chunk,
    parse_sglang_chunk,
    request_body,
)


def result(prompt=0, ids=(), text="", top=(), ok=True) -> RequestResult:
    return RequestResult(
        prompt, ok=ok, token_ids=list(ids), text=text, top_logprobs=[dict(t) for t in top]
    )


# the reference: greedy 5 7 9, the runner-up at position 1 (token 8) 0.05 below, at 2 (token 4) 2.0
REF = result(
    ids=[5, 7, 9],
    text="a b c",
    top=[{5: -0.1, 6: -3.0}, {7: -0.5, 8: -0.55}, {9: -0.2, 4: -2.2}],
)


@pytest.mark.parametrize(
    "ids, tolerance, verdict",
    [
        ([5, 7, 9], 0.0, "identical"),
        ([5, 8, 9], 0.1, "near_tie"),  # first differs at 1, within 0.1 of the greedy token
        ([5, 8, 3], 0.1, "near_tie"),  # what follows a near-tie is the near-tie's continuation
        ([5, 8, 9], 0.0, "mismatch"),  # float32: no tolerance
        ([5, 7, 4], 0.1, "mismatch"),  # the runner-up, 2.0 below: beyond the tolerance
        ([5, 7, 4], 2.5, "near_tie"),
        ([5, 1, 9], 10.0, "mismatch"),  # not among the reference's top logprobs
        ([5, 7], 10.0, "mismatch"),  # stopped before the reference
        ([5, 7, 9, 2], 10.0, "mismatch"),  # went on past it
    ],
)
def test_judge_by_token_ids_and_the_references_top_logprobs(ids, tolerance, verdict):
    assert lossless.judge(result(ids=ids, text="other"), REF, tolerance) == verdict


def test_judge_falls_back_to_the_text_without_token_ids():
    """Where either side has no token ids (SGLang without output_ids) the texts are compared, and
    a difference is a mismatch: text alone cannot tell a near-tie."""
    assert lossless.judge(result(text="a b c"), REF, 0.0) == "identical"
    assert lossless.judge(result(text="a b d"), REF, 10.0) == "mismatch"
    text_ref = result(text="a b c")  # no ids, no logprobs
    assert lossless.judge(result(ids=[5, 7, 9], text="a b c"), text_ref, 0.0) == "identical"
    assert lossless.judge(result(ids=[5, 8, 9], text="a x c"), text_ref, 10.0) == "mismatch"
    # ids on both sides win over the text (vLLM may hold back a trailing partial character)
    assert lossless.judge(result(ids=[5, 7, 9], text="a b"), REF, 0.0) == "identical"
    # no top logprobs where they first differ: a mismatch, not a guess
    bare = result(ids=[5, 7, 9], top=[{5: -0.1}])
    assert lossless.judge(result(ids=[5, 8, 9]), bare, 10.0) == "mismatch"


def test_references_are_the_baselines_first_answer_per_prompt():
    first, second = result(0, ids=[1]), result(0, ids=[2])
    refs = lossless.references([result(1, ok=False), first, second, result(1, ids=[3])], 2)
    assert refs[0] is first and refs[1].token_ids == [3]
    with pytest.raises(lossless.LosslessError, match=r"no reference request for prompts \[1\]"):
        lossless.references([first, result(1, ok=False)], 2)
    with pytest.raises(lossless.LosslessError, match=r"prompts \[0\]"):
        lossless.references(None, 1)
    # failed requests are not judged (the load summary counts them)
    judged = lossless.judge_all([result(0, ids=[1]), result(0, ok=False)], {0: first}, 0.0)
    assert judged == ["identical"]


def test_the_gate_over_every_k_and_load():
    levels = {
        1: {1: ["identical"] * 4, 3: ["identical", "near_tie", "mismatch", "mismatch"]},
        4: {1: ["identical"] * 4, 3: ["near_tie"] * 3 + ["mismatch"]},
    }
    gate = lossless.gate(levels, 0.0, 0.1)
    assert gate == {
        "compared_outputs": 16,
        "identical": 9,
        "near_tie": 4,
        "mismatch": 3,
        "identical_output_share": round(9 / 16, 4),
        "lossless_share": round(1 - 3 / 16, 4),
        "mismatch_share": round(3 / 16, 4),
        "max_output_mismatch_share": 0.0,
        "tie_tolerance": 0.1,
        "mismatches_at": ["c1 k=3: 2 of 4", "c4 k=3: 1 of 4"],
        "passed": False,
    }
    assert lossless.gate(levels, 0.2, 0.1)["passed"] is True  # 0.1875 allowed
    assert lossless.gate(levels, 0.18, 0.1)["passed"] is False
    clean = lossless.gate({1: {2: ["identical", "near_tie"]}}, 0.0, 0.5)
    assert clean["passed"] and clean["lossless_share"] == 1.0 and clean["mismatches_at"] == []
    assert clean["identical_output_share"] == 0.5
    assert lossless.tally(["near_tie", "identical", "near_tie"]) == {
        "identical": 1,
        "near_tie": 2,
        "mismatch": 0,
    }


# ---- the reference's wire format --------------------------------------------------------------


def test_the_reference_request_asks_for_ids_and_top_logprobs_by_id():
    vllm = LoadTarget("http://x", "openai-completions", model="m", token_ids=True, top_logprobs=5)
    _, body = request_body(vllm, [1, 2], 8)
    assert body["return_token_ids"] is True and body["logprobs"] == 5
    assert body["return_tokens_as_token_ids"] is True
    _, timed = request_body(LoadTarget("http://x", "openai-completions", model="m"), [1], 8)
    assert not {"return_token_ids", "logprobs", "return_tokens_as_token_ids"} & set(timed)
    sglang = LoadTarget("http://x", "sglang-generate", top_logprobs=5)
    _, body = request_body(sglang, [1, 2], 8)
    assert body["return_logprob"] is True and body["top_logprobs_num"] == 5


def test_top_logprobs_are_read_by_token_id_from_either_server():
    """vLLM 0.32 (completion/serving.py): per chunk `token_ids` (return_token_ids) and
    logprobs.top_logprobs keyed "token_id:<id>" (return_tokens_as_token_ids); SGLang:
    cumulative output_ids and meta_info.output_top_logprobs as [logprob, id, text] triples."""
    r, timer = RequestResult(0), ChunkTimer(0.0)
    seen = 0
    for i, (ids, tops) in enumerate(
        [([5], [{5: -0.1, 6: -3.0}]), ([7, 9], [{7: -0.5}, {9: -0.2}])]
    ):
        chunk = {
            "choices": [
                {
                    "text": " ".join(map(str, ids)),
                    "token_ids": ids,
                    "logprobs": {
                        "tokens": [f"token_id:{t}" for t in ids],
                        "token_logprobs": [top[t] for t, top in zip(ids, tops)],
                        "top_logprobs": [
                            {f"token_id:{t}": lp for t, lp in top.items()} for top in tops
                        ],
                    },
                    "finish_reason": None,
                }
            ],
            "usage": {"completion_tokens": seen + len(ids)},
        }
        seen = parse_openai_chunk(chunk, r, timer, 0.1 * (i + 1), seen, True)
    assert r.token_ids == [5, 7, 9] and r.output_tokens == 3
    assert r.top_logprobs == [{5: -0.1, 6: -3.0}, {7: -0.5}, {9: -0.2}]

    s = RequestResult(0)
    meta = {
        "completion_tokens": 2,
        "output_top_logprobs": [[[-0.1, 5, "a"], [-3.0, 6, "b"]], [[-0.5, 7, "c"]]],
    }
    parse_sglang_chunk(
        {"text": "a c", "output_ids": [5, 7], "meta_info": meta}, s, ChunkTimer(0.0), 0.1, 0
    )
    assert s.token_ids == [5, 7] and s.top_logprobs == [{5: -0.1, 6: -3.0}, {7: -0.5}]
