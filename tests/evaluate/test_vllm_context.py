"""vLLM's acceptance by context length without vLLM: the job's groups (one per context bucket),
the per-group counters vllm_generate.py takes as differences of cumulative snapshots, and the
by_context section vllm_engine.py builds from them. The real engine's run is asserted in
tests/evaluate/test_vllm.py."""

from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace

import pytest

from draftline.evaluate import vllm_generate
from draftline.evaluate.config import EvaluateConfig
from draftline.evaluate.vllm_engine import context_groups, vllm_by_context
from draftline.evaluate.vllm_generate import check_groups, counters_since


def counts(drafts, draft_tokens, accepted, per_pos):
    return {
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted,
        "accepted_per_pos": per_pos,
    }


def test_counters_since_takes_the_difference_per_counter_and_position():
    first = counts(4, 12, 6, [3, 2, 1])
    assert counters_since(None, first) == first  # nothing counted before the first call
    later = counts(10, 30, 11, [7, 3, 1])
    assert counters_since(first, later) == counts(6, 18, 5, [4, 1, 0])
    # a per-position list that grew since (a position first reached in the later call)
    grown = counters_since(counts(1, 3, 1, [1]), counts(3, 9, 4, [2, 1, 1]))
    assert grown["accepted_per_pos"] == [1, 1, 1]
    assert counters_since(first, None) is None  # no spec-decode counters: no draft


def test_groups_must_cover_every_prompt_once():
    check_groups([[2, 0], [], [1]], 3)
    with pytest.raises(ValueError, match=r"missing \[2\], repeated \[1\]"):
        check_groups([[0, 1], [1]], 3)
    with pytest.raises(ValueError, match=r"not a prompt index \[3\]"):
        check_groups([[0, 1, 2, 3]], 3)


def test_context_groups_bucket_the_prompts_by_length():
    prompts = [[1] * 5, [1] * 300, [1] * 10, [1] * 256, [1] * 5000]
    assert context_groups(prompts, [256, 1024, 4096]) == [[0, 2], [1, 3], [], [4]]
    assert context_groups(prompts, []) == [[0, 1, 2, 3, 4]]  # no edges: one bucket


class FakeLLM:
    """vLLM's LLM as vllm_generate.run uses it: generate echoes the prompt's length as its
    output and counts 2 drafts per request with 1 token accepted at position 1, cumulatively (as
    LLM.get_metrics does)."""

    def __init__(self, **kwargs):
        self.drafts = 0
        self.calls = []
        self.llm_engine = SimpleNamespace(
            vllm_config=SimpleNamespace(
                model_config=SimpleNamespace(dtype="torch.float32"), speculative_config=None
            )
        )

    def generate(self, requests, params, use_tqdm):
        self.calls.append([r["prompt_token_ids"] for r in requests])
        self.drafts += 2 * len(requests)
        return [
            SimpleNamespace(
                prompt_token_ids=r["prompt_token_ids"],
                outputs=[
                    SimpleNamespace(token_ids=[len(r["prompt_token_ids"])], finish_reason="length")
                ],
            )
            for r in requests
        ]

    def get_metrics(self):
        metric = SimpleNamespace
        return [
            metric(name="vllm:spec_decode_num_drafts", value=self.drafts),
            metric(name="vllm:spec_decode_num_draft_tokens", value=3 * self.drafts),
            metric(name="vllm:spec_decode_num_accepted_tokens", value=self.drafts // 2),
            metric(name="vllm:spec_decode_num_accepted_tokens_per_pos", values=[self.drafts // 2]),
        ]


@pytest.fixture
def fake_vllm(monkeypatch):
    module = ModuleType("vllm")
    made = []

    def llm(**kwargs):
        made.append(FakeLLM(**kwargs))
        return made[-1]

    module.LLM = llm
    module.SamplingParams = lambda **kw: kw
    monkeypatch.setitem(sys.modules, "vllm", module)
    return made


def test_run_generates_each_group_alone_and_counts_it(fake_vllm):
    """Groups [[1, 3], [], [0, 2]]: two generate calls in that order, outputs back in the prompts'
    order, one counter set per group (None for the empty one), summing to the run's."""
    prompts = [[1] * 3, [1] * 7, [1] * 4, [1] * 9]
    job = {"model": "m", "draft": "d", "k": 3, "dtype": "float32", "max_tokens": 4}
    result = vllm_generate.run({**job, "prompts": prompts, "groups": [[1, 3], [], [0, 2]]})
    assert fake_vllm[0].calls == [[prompts[1], prompts[3]], [prompts[0], prompts[2]]]
    assert result["outputs"] == [[3], [7], [4], [9]] and all(result["prompt_ids_match"])
    assert result["group_counters"] == [counts(4, 12, 2, [2]), None, counts(4, 12, 2, [2])]
    assert result["counters"] == counts(8, 24, 4, [4])
    # without groups: one call of every prompt, no group_counters, the same total
    plain = vllm_generate.run({**job, "prompts": prompts})
    assert fake_vllm[1].calls == [prompts] and "group_counters" not in plain
    assert plain["outputs"] == result["outputs"] and plain["counters"] == result["counters"]


def test_by_context_from_the_groups_counters():
    """Two buckets measured, one empty: each bucket's acceptance from its own counters, its
    prompts and emitted tokens from its requests; counters that do not add up to the run's fail."""
    cfg = EvaluateConfig(engine="vllm", context_buckets=[8, 16])
    prompts = [[1] * 4, [1] * 20, [1] * 5]
    result = {
        "outputs": [[2, 3], [4, 5, 6], [7]],
        "group_counters": [counts(3, 9, 6, [3, 2, 1]), None, counts(2, 6, 1, [1, 0, 0])],
        "counters": counts(5, 15, 7, [4, 2, 1]),
    }
    assert context_groups(prompts, cfg.context_buckets) == [[0, 2], [], [1]]
    section = vllm_by_context(result, prompts, cfg)
    short, middle, long = section["buckets"]
    assert (short["bucket"], short["prompts"], short["steps"]) == ("<8", 2, 3)
    # each output's first token is the prefill's, which no step verified: (2 - 1) + (1 - 1)
    assert short["acceptance_length"] == 3.0 and short["emitted_tokens"] == 1
    assert (middle["prompts"], middle["steps"], middle["acceptance_length"]) == (0, 0, None)
    assert (long["bucket"], long["prompts"], long["acceptance_length"]) == (">=16", 1, 1.5)
    assert section["collapse"]["ratio"] == 0.5 and section["collapse"]["collapses"]
    with pytest.raises(RuntimeError, match="buckets count 5 drafts, its whole run 6"):
        vllm_by_context({**result, "counters": counts(6, 18, 7, [4, 2, 1])}, prompts, cfg)
