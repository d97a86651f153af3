"""The built-in speculative decoder is lossless: its output is the target's greedy output."""

from types import SimpleNamespace

import pytest
import torch

from draftline.core.config import TIE_TOLERANCE
from draftline.draft.model import build_draft
from draftline.evaluate.acceptance import acceptance_summary, compare_to_greedy
from draftline.evaluate.specdec import (
    DraftRunner,
    Generation,
    SpecPair,
    greedy_generate,
    speculative_generate,
)
from draftline.targets.model import load_target
from draftline.train.config import TrainConfig


def test_greedy_matches_hf_generate(random_target):
    model, _ = load_target(random_target)
    prompt = [1, 40, 41, 42, 2, 1, 50]
    ours = greedy_generate(model, prompt, 20, eos_ids={-1})
    ref = model.generate(
        torch.tensor([prompt]), max_new_tokens=20, do_sample=False, min_new_tokens=20
    )
    assert ours.tokens == ref[0, len(prompt) :].tolist()


def test_speculative_equals_greedy_with_untrained_draft(random_target, vocab_dir):
    model, _ = load_target(random_target)
    torch.manual_seed(1)
    draft = build_draft(random_target, vocab_dir, TrainConfig()).eval()
    for prompt in ([1, 40, 41, 42, 2, 1, 50], [7] * 30, [3, 99, 150, 12]):
        for k in (1, 3, 5):
            plain = greedy_generate(model, prompt, 40, eos_ids={-1})
            spec = speculative_generate(
                SpecPair(model, draft, random_target.aux_ids), prompt, 40, k, eos_ids={-1}
            )
            assert spec.tokens == plain.tokens
            assert sum(spec.accepted_per_round) + 1 >= len(
                spec.tokens
            )  # prefill gives the first token
            assert all(1 <= a <= k + 1 for a in spec.accepted_per_round)
            assert sum(spec.emitted_per_round) + 1 == len(spec.tokens)
            assert spec.emitted_per_round[:-1] == spec.accepted_per_round[:-1]


def test_speculative_equals_greedy_with_a_draft_that_accepts(trained_draft):
    """The lossless check where it bites: a trained draft whose tokens the target accepts, often
    several in a round, and still exactly the greedy output (float32: no near-tie excuse)."""
    from draftline.draft.checkpoint import load_draft

    model, _ = load_target(trained_draft.card)
    draft = load_draft(trained_draft.dir, trained_draft.card, "cpu")
    full_rounds = 0
    for prompt in trained_draft.prompts:
        plain = greedy_generate(model, prompt, 40, eos_ids={-1})
        for k in (1, 3):
            spec = speculative_generate(
                SpecPair(model, draft, trained_draft.card.aux_ids), prompt, 40, k, eos_ids={-1}
            )
            assert spec.tokens == plain.tokens
            accepted = sum(a - 1 for a in spec.accepted_per_round)  # draft tokens kept
            assert accepted >= 5, (k, spec.accepted_per_round)
            full_rounds += spec.accepted_per_round.count(k + 1) if k == 3 else 0
    assert full_rounds > 0  # rounds where all three draft tokens were accepted


def test_eos_stops_both(random_target, vocab_dir):
    model, _ = load_target(random_target)
    draft = build_draft(random_target, vocab_dir, TrainConfig()).eval()
    prompt = [1, 40, 41, 42]
    free = greedy_generate(model, prompt, 30, eos_ids={-1}).tokens
    stop = {free[5]}  # pretend the 6th generated token is end-of-turn
    plain = greedy_generate(model, prompt, 30, eos_ids=stop)
    spec = speculative_generate(
        SpecPair(model, draft, random_target.aux_ids), prompt, 30, 4, eos_ids=stop
    )
    assert plain.tokens == spec.tokens and plain.tokens[-1] in stop and len(plain.tokens) <= 6


def test_a_prompt_cut_at_max_new_tokens_mid_step(monkeypatch, random_target, vocab_dir):
    """A draft that always proposes the target's greedy tokens: every round accepts all k = 3 and
    emits 4; max_new_tokens = 10 (prefill 1 + 4 + 4 + 1) keeps 1 of the third round's 4 tokens."""
    model, _ = load_target(random_target)
    draft = build_draft(random_target, vocab_dir, TrainConfig()).eval()
    prompt = [1, 40, 41, 42, 2, 1, 50]
    greedy = greedy_generate(model, prompt, 30, eos_ids={-1}).tokens

    def oracle(self, cache, next_inputs, aux, first_pos, k):
        pending = first_pos + len(next_inputs) - len(prompt)  # index of x_{n+1} in the answer
        return greedy[pending + 1 : pending + 1 + k]

    monkeypatch.setattr(DraftRunner, "propose", oracle)
    spec = speculative_generate(
        SpecPair(model, draft, random_target.aux_ids), prompt, 10, 3, eos_ids={-1}
    )
    assert spec.tokens == greedy[:10]
    assert spec.accepted_per_round == [4, 4, 4] and spec.emitted_per_round == [4, 4, 1]
    summary = acceptance_summary(spec.accepted_per_round, 3, spec.emitted_per_round)
    assert summary["acceptance_length"] == 4.0  # vLLM's count: every round whole
    assert summary["tokens_per_step"] == 3.0  # 9 tokens emitted by 3 verification steps
    # SGLang's accept_length: completion tokens (the prefill's included) / verify steps
    assert len(spec.tokens) / spec.target_forwards == 10 / 3


class ScriptedTarget(torch.nn.Module):
    """A stand-in target whose logits for generated token t are rows[t], whatever the input."""

    def __init__(self, rows: torch.Tensor):
        super().__init__()
        self.rows, self.step = rows, 0
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # TargetRunner reads the device off it

    def forward(self, input_ids, **_):
        logits = torch.zeros(1, input_ids.shape[1], self.rows.shape[1])
        logits[0, -1] = self.rows[self.step]
        self.step += 1
        return SimpleNamespace(logits=logits, hidden_states=None)


def greedy_on(logits: torch.Tensor, tie_tolerance: float) -> Generation:
    """greedy_generate over scripted logits (T, V), margins recorded at tie_tolerance."""
    return greedy_generate(
        ScriptedTarget(logits), [1], len(logits), {-1}, margins=True, tie_tolerance=tie_tolerance
    )


def test_compare_to_greedy_tells_near_ties_from_mismatches():
    # 50 tokens, all distinct below -1, then per position: a clear winner (token 5, 4 above the
    # next), three close ones (6 at 2.0, 9 at 1.95, 3 at 1.9), a clear winner (7), an exact tie
    logits = -1 - 0.01 * torch.arange(50.0).repeat(4, 1)
    logits[0, 5] = 4.0
    logits[1, [6, 9, 3]] = torch.tensor([2.0, 1.95, 1.9])
    logits[2, 7] = 3.0
    logits[3, [8, 2]] = 1.0

    def verdict(spec_tokens, tie_tolerance):  # greedy recorded at the tolerance it is judged by
        return compare_to_greedy(spec_tokens, greedy_on(logits, tie_tolerance), tie_tolerance)

    plain = greedy_on(logits, 0.1)
    assert plain.tokens[:3] == [5, 6, 7] and plain.margins[1] == pytest.approx(0.05)
    assert set(plain.runner_ups[1]) == {9} and set(plain.runner_ups[0]) == {0}  # runner-up kept
    end = plain.tokens[3]
    assert verdict(plain.tokens, 0.0) == "identical"
    # the first difference is greedy's runner-up, 0.05 below: a 16-bit reordering
    assert verdict([5, 9, 7, end], 0.1) == "near_tie"
    assert verdict([5, 9, 7, end], 0.0) == "mismatch"  # float32: no tolerance
    # the third of three close tokens: within a tolerance of 0.2, not of 0.07
    assert verdict([5, 3, 7, end], 0.2) == "near_tie"
    assert verdict([5, 3, 7, end], 0.07) == "mismatch"
    # a near-tie position (greedy's top two 0.05 apart) but a token 3 below greedy's: a real
    # divergence, though greedy's own margin is within the tolerance
    assert verdict([5, 0, 7, end], 0.1) == "mismatch"
    assert verdict([9, 6, 7, end], 0.1) == "mismatch"  # a clear winner replaced
    assert verdict([5, 6], 0.1) == "mismatch"  # stopped early
    assert verdict(plain.tokens + [2], 0.1) == "mismatch"  # past greedy's end
    # the exact tie: the other of the two is excused even at no tolerance
    assert verdict([5, 6, 7, ({2, 8} - {end}).pop()], 0.0) == "near_tie"
    # a Generation without runner-ups (greedy made without margins) excuses nothing
    bare = Generation(tokens=plain.tokens, margins=plain.margins)
    assert compare_to_greedy([5, 9, 7, end], bare, 0.1) == "mismatch"


def test_near_tie_flip_is_elementwise_on_tensors():
    from draftline.evaluate.acceptance import near_tie_flip

    chosen = torch.tensor([1, 2, 3, 4])
    greedy = torch.tensor([1, 5, 6, 7])
    chosen_gap = torch.tensor([0.0, 0.1, 0.9, 0.5])
    assert near_tie_flip(chosen, greedy, chosen_gap, 0.5).tolist() == [
        False,  # no difference
        True,  # 0.1 below greedy's logit
        False,  # 0.9 below
        True,  # at the tolerance
    ]
    assert near_tie_flip(2, 5, 0.1, 0.5) is True and near_tie_flip(2, 5, 0.6, 0.5) is False


def test_bfloat16_target_diverges_from_greedy_only_at_near_ties(random_target, vocab_dir):
    model, _ = load_target(random_target, dtype=torch.bfloat16)
    torch.manual_seed(1)
    draft = build_draft(random_target, vocab_dir, TrainConfig()).eval()  # float32: aux is cast
    verdicts = []
    for prompt in ([1, 40, 41, 42, 2, 1, 50], [7] * 30, [3, 99, 150, 12], list(range(20, 60))):
        plain = greedy_generate(
            model, prompt, 40, {-1}, margins=True, tie_tolerance=TIE_TOLERANCE["bfloat16"]
        )
        assert len(plain.margins) == len(plain.tokens) and min(plain.margins) >= 0
        for k in (1, 3):
            spec = speculative_generate(
                SpecPair(model, draft, random_target.aux_ids), prompt, 40, k, eos_ids={-1}
            )
            verdicts.append(compare_to_greedy(spec.tokens, plain, TIE_TOLERANCE["bfloat16"]))
    # 16-bit rounding does reorder near-ties here (a float32 target never diverged above), and never more
    assert "near_tie" in verdicts and "mismatch" not in verdicts, verdicts


def test_a_target_placed_by_device_map_decodes_the_same(random_target, vocab_dir):
    """The device_map path of the loader (on GPUs: "auto"; here accelerate's "cpu") gives the same decoding."""
    from draftline.targets.model import load_target_model

    placed = load_target_model(random_target, device_map="cpu")
    plain, _ = load_target(random_target)
    draft = build_draft(random_target, vocab_dir, TrainConfig()).eval()
    prompt = [1, 40, 41, 42, 2, 1, 50]
    ours = speculative_generate(
        SpecPair(placed, draft, random_target.aux_ids), prompt, 20, 3, eos_ids={-1}
    )
    assert ours.tokens == greedy_generate(plain, prompt, 20, eos_ids={-1}).tokens
    assert (
        ours.accepted_per_round
        == speculative_generate(
            SpecPair(plain, draft, random_target.aux_ids), prompt, 20, 3, eos_ids={-1}
        ).accepted_per_round
    )


def test_acceptance_at_every_k_from_one_pass_equals_direct_runs(trained_draft):
    """acceptance_runs at k = 4, walked at k' = 1, 2, 3, 4, gives exactly the rounds that
    speculative decoding at k' takes (a run of a draft that accepts, cut by max_new_tokens and by
    eos alike)."""
    from draftline.draft.checkpoint import load_draft
    from draftline.evaluate.specdec import acceptance_runs, walk_rounds

    model, _ = load_target(trained_draft.card)
    draft = load_draft(trained_draft.dir, trained_draft.card, "cpu")
    aux, compared, accepted = trained_draft.card.aux_ids, 0, 0
    for prompt in trained_draft.prompts:
        plain = greedy_generate(model, prompt, 30, eos_ids={-1})
        for stop in ({-1}, {plain.tokens[17]}):  # cut at max_new_tokens, then at an "eos" midway
            tokens, runs = acceptance_runs(SpecPair(model, draft, aux), prompt, 30, 4, stop)
            for k in (1, 2, 3, 4):
                direct = speculative_generate(SpecPair(model, draft, aux), prompt, 30, k, stop)
                assert tokens == direct.tokens
                assert walk_rounds(runs, len(tokens), k) == direct.accepted_per_round, (k, stop)
                compared += 1
            accepted += sum(runs)
    assert compared >= 8 and accepted >= 10  # the draft accepts: the walk is not all ones
