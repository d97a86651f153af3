"""The train-serve parity gate on outputs (draftline/evaluate/vllm_engine.py): vLLM's speculative
outputs judged against the built-in engine's greedy ones by the lossless rule, and the prompt ids it
decoded, beside the aggregate acceptance it already compares."""

from draftline.evaluate.acceptance import EvaluationRun
from draftline.evaluate.config import EvaluateConfig
from draftline.evaluate.vllm_engine import check_parity, output_verdicts

GREEDY = {"p0": [5, 6, 7, 8], "p1": [9, 10, 11, 12]}
# greedy's near-ties per token: at p1's token 2, token 20 was within 0.3 of greedy's 11
RUNNER_UPS = {"p0": [{1: 2.0}] * 4, "p1": [{1: 2.0}, {1: 2.0}, {20: 0.3}, {1: 2.0}]}
BUILTIN = {"acceptance_length": 2.5, "rounds": 4, "position_acceptance": {"1": 0.75, "2": 0.5}}


def reference() -> EvaluationRun:
    return EvaluationRun({}, {}, {"p0": [1], "p1": [2]}, GREEDY, RUNNER_UPS)


def vllm_result(outputs: dict, ids_match: int = 2, tolerance: float = 0.0) -> dict:
    """vLLM's report as evaluate_with_vllm makes it, its acceptance equal to the built-in one's."""
    return {
        **BUILTIN,
        "prompts": 2,
        "prompt_ids_match": ids_match,
        "prompt_ids_differing": ["p1"][: 2 - ids_match],
        "read": {},
        "outputs": output_verdicts(outputs, reference(), tolerance),
    }


def gate(vllm: dict, dtype: str = "float32", **cfg):
    config = EvaluateConfig(engine="vllm", dtype=dtype, **cfg)
    return check_parity(config, None, "draft", BUILTIN, vllm)


def test_equal_outputs_pass():
    block, failure = gate(vllm_result(dict(GREEDY)))
    assert failure is None and block["passed"]
    assert block["outputs"]["identical"] == 2 and block["prompt_ids_match"] == 2


def test_an_output_that_differs_from_greedy_fails_with_equal_acceptance():
    """The aggregate gap is 0 (the acceptance counters agree), yet p0's output left greedy's at
    token 2: the gate fails naming the prompt and the position."""
    seeded = {**GREEDY, "p0": [5, 6, 99, 8]}
    block, failure = gate(vllm_result(seeded))
    assert block["gap"] == 0 and not block["passed"]
    assert "p0 from token 2" in failure and "not at a near-tie" in failure
    assert block["outputs"]["mismatch"] == 1
    # an output cut short is no near-tie either
    block, failure = gate(vllm_result({**GREEDY, "p1": [9, 10]}))
    assert "p1 from token 2" in failure


def test_a_near_tie_divergence_within_the_tolerance_is_counted_not_failed():
    flipped = {**GREEDY, "p1": [9, 10, 20, 3]}  # greedy's runner-up at token 2, within 0.3
    block, failure = gate(
        vllm_result(flipped, tolerance=0.5), dtype="bfloat16", max_near_tie_share=0.5
    )
    assert failure is None and block["outputs"]["near_tie"] == 1
    # past the share of near-ties the check no longer covers the outputs
    block, failure = gate(
        vllm_result(flipped, tolerance=0.5), dtype="bfloat16", max_near_tie_share=0.25
    )
    assert "above evaluate.max_near_tie_share 0.25" in failure
    # in float32 there is no tolerance: the same flip is a mismatch
    block, failure = gate(vllm_result(flipped, tolerance=0.0))
    assert "not at a near-tie" in failure


def test_prompt_ids_vllm_did_not_decode_as_given_fail():
    block, failure = gate(vllm_result(dict(GREEDY), ids_match=1))
    assert not block["passed"] and "1 of 2 prompts from other token ids" in failure


def test_the_stage_path_feeds_vllms_outputs_to_the_gate(monkeypatch):
    """with_vllm as the stage calls it, vLLM's process replaced by its result: counters that give
    exactly the built-in acceptance, p0's output seeded off greedy at token 1. The outputs reach the
    gate through evaluate_with_vllm, and the run fails naming the prompt."""
    from types import SimpleNamespace

    from draftline.evaluate import vllm_engine

    positions = {"1": 0.75, "2": 0.5, "3": 0.25}
    result = {
        "outputs": [[5, 99, 7, 8], GREEDY["p1"]],  # in the order of the prompts given
        "prompt_ids_match": [True, True],
        # 4 drafts, 6 tokens accepted (3, 2, 1 at positions 1-3): 2.5, as the built-in engine
        "counters": {"drafts": 4, "accepted_tokens": 6, "accepted_per_pos": [3, 2, 1]},
        # both one-token prompts in the shortest context bucket, the three others empty
        "group_counters": [
            {"drafts": 4, "accepted_tokens": 6, "accepted_per_pos": [3, 2, 1]},
            None,
            None,
            None,
        ],
        "read": {},
        "load_s": 1.0,
        "generate_s": 1.0,
        "wall_s": 2.0,
    }
    monkeypatch.setattr(vllm_engine, "run_vllm_generate", lambda *args, **kw: result)
    builtin = {"acceptance_length": 2.5, "rounds": 4, "position_acceptance": positions}
    builtin_contexts = {"basis": "verification step context"}  # the built-in engine's own
    run = EvaluationRun(
        {**builtin, "engine": "hf", "by_context": builtin_contexts},
        {"acceptance_vs_samples.json": [{"samples": 1}]},
        {"p0": [1], "p1": [2]},
        GREEDY,
        RUNNER_UPS,
    )
    card = SimpleNamespace(model="target", revision=None, trust_remote_code=False)
    config = EvaluateConfig(engine="vllm", dtype="float32")
    done, failure = vllm_engine.with_vllm(run, config, card, "draft", None)
    gate = done.report["parity"]
    assert gate["gap"] == 0 and not gate["passed"] and done.report["engine"] == "vllm"
    assert "p0 from token 1" in failure
    assert done.report["engines"]["vllm"]["outputs_equal_to_builtin_greedy"] == 1
    # vLLM's by_context sits with its engine; the built-in engine's stays the report's
    contexts = done.report["engines"]["vllm"]["by_context"]
    assert done.report["by_context"] is builtin_contexts
    assert [b["prompts"] for b in contexts["buckets"]] == [2, 0, 0, 0]
    assert contexts["buckets"][0]["acceptance_length"] == 2.5
