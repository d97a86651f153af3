"""The built-in speculative decoder is lossless: its output is the target's greedy output."""

import torch

from draftline.config import TIE_TOLERANCE
from draftline.draft_model import build_draft
from draftline.evaluation import acceptance_summary, compare_to_greedy
from draftline.specdec import DraftRunner, Generation, greedy_generate, speculative_generate
from draftline.target import load_target


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
    draft = build_draft(random_target, vocab_dir, num_layers=1, ttt_steps=3).eval()
    for prompt in ([1, 40, 41, 42, 2, 1, 50], [7] * 30, [3, 99, 150, 12]):
        for k in (1, 3, 5):
            plain = greedy_generate(model, prompt, 40, eos_ids={-1})
            spec = speculative_generate(
                model, draft, random_target.aux_ids, prompt, 40, k, eos_ids={-1}
            )
            assert spec.tokens == plain.tokens
            assert sum(spec.accepted_per_round) + 1 >= len(
                spec.tokens
            )  # prefill gives the first token
            assert all(1 <= a <= k + 1 for a in spec.accepted_per_round)
            assert sum(spec.emitted_per_round) + 1 == len(spec.tokens)
            assert spec.emitted_per_round[:-1] == spec.accepted_per_round[:-1]


def test_eos_stops_both(random_target, vocab_dir):
    model, _ = load_target(random_target)
    draft = build_draft(random_target, vocab_dir, num_layers=1, ttt_steps=3).eval()
    prompt = [1, 40, 41, 42]
    free = greedy_generate(model, prompt, 30, eos_ids={-1}).tokens
    stop = {free[5]}  # pretend the 6th generated token is end-of-turn
    plain = greedy_generate(model, prompt, 30, eos_ids=stop)
    spec = speculative_generate(model, draft, random_target.aux_ids, prompt, 30, 4, eos_ids=stop)
    assert plain.tokens == spec.tokens and plain.tokens[-1] in stop and len(plain.tokens) <= 6


def test_a_prompt_cut_at_max_new_tokens_mid_step(monkeypatch, random_target, vocab_dir):
    """A draft that always proposes the target's greedy tokens: every round accepts all k = 3 and
    emits 4; max_new_tokens = 10 (prefill 1 + 4 + 4 + 1) keeps 1 of the third round's 4 tokens."""
    model, _ = load_target(random_target)
    draft = build_draft(random_target, vocab_dir, num_layers=1, ttt_steps=3).eval()
    prompt = [1, 40, 41, 42, 2, 1, 50]
    greedy = greedy_generate(model, prompt, 30, eos_ids={-1}).tokens

    def oracle(self, cache, next_inputs, aux, first_pos, k):
        pending = first_pos + len(next_inputs) - len(prompt)  # index of x_{n+1} in the answer
        return greedy[pending + 1 : pending + 1 + k]

    monkeypatch.setattr(DraftRunner, "propose", oracle)
    spec = speculative_generate(model, draft, random_target.aux_ids, prompt, 10, 3, eos_ids={-1})
    assert spec.tokens == greedy[:10]
    assert spec.accepted_per_round == [4, 4, 4] and spec.emitted_per_round == [4, 4, 1]
    summary = acceptance_summary(spec.accepted_per_round, 3, spec.emitted_per_round)
    assert summary["acceptance_length"] == 4.0  # vLLM's count: every round whole
    assert summary["tokens_per_step"] == 3.0  # 9 tokens emitted by 3 verification steps
    # SGLang's accept_length: completion tokens (the prefill's included) / verify steps
    assert len(spec.tokens) / spec.target_forwards == 10 / 3


def test_compare_to_greedy_tells_near_ties_from_mismatches():
    plain = Generation(tokens=[5, 6, 7, 8], margins=[4.0, 0.05, 3.0, 0.0])
    assert compare_to_greedy([5, 6, 7, 8], plain, 0.0) == "identical"
    assert (
        compare_to_greedy([5, 9, 1, 1], plain, 0.1) == "near_tie"
    )  # first difference at a 0.05 gap
    assert compare_to_greedy([5, 9, 1, 1], plain, 0.0) == "mismatch"  # float32: no tolerance
    assert compare_to_greedy([9, 6, 7, 8], plain, 0.1) == "mismatch"  # a clear winner replaced
    assert compare_to_greedy([5, 6], plain, 0.1) == "mismatch"  # stopped early at a 3.0 gap
    assert (
        compare_to_greedy([5, 6, 7, 8, 2], plain, 0.1) == "mismatch"
    )  # past greedy's end: no margin to excuse it


def test_bfloat16_target_diverges_from_greedy_only_at_near_ties(random_target, vocab_dir):
    model, _ = load_target(random_target, dtype=torch.bfloat16)
    torch.manual_seed(1)
    draft = build_draft(
        random_target, vocab_dir, num_layers=1, ttt_steps=3
    ).eval()  # float32: aux is cast
    verdicts = []
    for prompt in ([1, 40, 41, 42, 2, 1, 50], [7] * 30, [3, 99, 150, 12], list(range(20, 60))):
        plain = greedy_generate(model, prompt, 40, eos_ids={-1}, margins=True)
        assert len(plain.margins) == len(plain.tokens) and min(plain.margins) >= 0
        for k in (1, 3):
            spec = speculative_generate(
                model, draft, random_target.aux_ids, prompt, 40, k, eos_ids={-1}
            )
            verdicts.append(compare_to_greedy(spec.tokens, plain, TIE_TOLERANCE["bfloat16"]))
    # 16-bit rounding does reorder near-ties here (a float32 target never diverged above), and never more
    assert "near_tie" in verdicts and "mismatch" not in verdicts, verdicts


def test_a_target_placed_by_device_map_decodes_the_same(random_target, vocab_dir):
    """The device_map path of the loader (on GPUs: "auto"; here accelerate's "cpu") gives the same decoding."""
    from draftline.target import load_target_model

    placed = load_target_model(random_target, device_map="cpu")
    plain, _ = load_target(random_target)
    draft = build_draft(random_target, vocab_dir, num_layers=1, ttt_steps=3).eval()
    prompt = [1, 40, 41, 42, 2, 1, 50]
    ours = speculative_generate(placed, draft, random_target.aux_ids, prompt, 20, 3, eos_ids={-1})
    assert ours.tokens == greedy_generate(plain, prompt, 20, eos_ids={-1}).tokens
    assert (
        ours.accepted_per_round
        == speculative_generate(
            plain, draft, random_target.aux_ids, prompt, 20, 3, eos_ids={-1}
        ).accepted_per_round
    )
