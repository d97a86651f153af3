"""Speculation with no draft, replayed over greedy outputs (draftline/evaluate/lookup.py): the
n-gram proposer follows vLLM's rule (checked against vLLM's own proposer where .venv-vllm is
installed), the replay counts steps as the draft's are counted, and a method with no offline
replay says so."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest

from draftline.benchmark.config import FreeBenchConfig
from draftline.draft.free import Ngram, Suffix
from draftline.engines.config import VLLM_VENV
from draftline.evaluate.lookup import free_acceptance, replay

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / VLLM_VENV / "bin" / "python"
SIZES = {"prompt_lookup_min": 2, "prompt_lookup_max": 3}


def test_the_longest_ngram_wins_and_its_earliest_occurrence_proposes():
    context = [5, 2, 3, 7, 1, 2, 3, 8, 1, 2, 3]
    # [1, 2, 3] occurred at 4 (and at 8, the tail itself): the tokens after position 4's
    assert Ngram().propose(context, 2, SIZES) == [8, 1]
    # n capped at 2: [2, 3] occurred first at 1
    assert Ngram().propose(context, 2, {"prompt_lookup_min": 2, "prompt_lookup_max": 2}) == [7, 1]
    # fewer than k tokens after the match: what there is
    assert Ngram().propose([4, 1, 2, 9, 1, 2], 5, SIZES) == [9, 1, 2]
    # no earlier occurrence of any n in range, or a context shorter than the smallest n
    assert Ngram().propose([1, 2, 3, 4, 5], 3, SIZES) == []
    assert Ngram().propose([1], 3, SIZES) == []


def test_the_replay_accepts_the_proposals_leading_tokens_that_the_output_has():
    prompt = [1, 2, 3, 4, 9]
    output = [1, 2, 3, 4, 6]  # the target repeats the prompt, then leaves it
    rounds, emitted, drafted = replay(Ngram(), SIZES, prompt, output, 3)
    # step 1: [4, 9] never occurred before: a plain step (1)
    # step 2: [9, 1] neither: a plain step (2)
    # step 3: context ...9, 1, 2: [1, 2] first at 0 proposes [3, 4, 9]: 3 and 4 accepted, 9 is
    # not the output's 6, which the target adds (3 emitted)
    assert rounds == [1, 1, 3]
    assert emitted == [1, 1, 3]
    assert drafted == [False, False, True]


def test_a_proposal_past_the_end_of_the_output_is_judged_on_what_the_output_has():
    prompt = [7, 8, 1, 2, 3, 4, 5]
    output = [1, 2, 3]  # stopped (eos or max_new_tokens) while the lookup would go on
    rounds, emitted, drafted = replay(Ngram(), SIZES, prompt, output, 3)
    # [4, 5] and then [5, 1] unseen: two plain steps; then [1, 2] (first at 2) proposes [3, 4, 5]:
    # 3 is the output's last token, accepted; 4 and 5 go past the end, neither counted
    assert rounds == [1, 1, 2]
    assert emitted == [1, 1, 1]
    assert drafted == [False, False, True]


def test_free_acceptance_reports_each_method_and_says_which_cannot_replay():
    free = {
        "ngram": FreeBenchConfig(k=2, speculative_config=SIZES),
        "suffix": FreeBenchConfig(k=2),
    }
    prompts = {"a": [1, 2, 3, 4, 9], "b": [5, 6, 7]}
    greedy = {"a": [1, 2, 3, 4, 6], "b": [8, 8]}
    out = free_acceptance(free, prompts, greedy, 3)
    ngram = out["ngram"]
    assert ngram["replayed"] and ngram["k"] == 3 and ngram["prompts"] == 2
    # a: rounds [1, 1, 3]; b: two plain steps
    assert ngram["rounds"] == 5
    assert ngram["acceptance_length"] == pytest.approx((1 + 1 + 3 + 1 + 1) / 5, abs=1e-4)
    assert ngram["proposal_share"] == pytest.approx(1 / 5)
    assert ngram["acceptance_length_drafted"] == 3
    assert ngram["per_prompt"] == {"a": pytest.approx(5 / 3, abs=1e-4), "b": 1.0}
    assert out["suffix"] == {"replayed": False, "why": "suffix decoding has no offline replay"}
    # a prompt the target answered with nothing has no step: no per-prompt figure, no round
    empty = free_acceptance(free, {**prompts, "c": [1, 2]}, {**greedy, "c": []}, 3)["ngram"]
    assert "c" not in empty["per_prompt"] and empty["rounds"] == 5 and empty["prompts"] == 3
    assert Suffix().propose([1, 2, 1, 2], 2, {}) is None


VLLM_CHECK = """
import json, sys
import numpy as np
from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as f
cases = json.load(sys.stdin)
print(json.dumps([
    f(np.array(c["context"], dtype=np.int32), c["lo"], c["hi"], 1 << 20, c["k"]).tolist()
    for c in cases
]))
"""


@pytest.mark.skipif(not VLLM_PYTHON.is_file(), reason=f"no {VLLM_VENV}: make setup-vllm")
def test_ngram_proposals_equal_vllms_own_proposer():
    rng = random.Random(0)
    cases = []
    for _ in range(300):
        vocab = rng.choice([3, 5, 12])  # small vocabularies repeat n-grams often
        lo = rng.randint(1, 3)
        cases.append(
            {
                "context": [rng.randrange(vocab) for _ in range(rng.randint(1, 60))],
                "lo": lo,
                "hi": rng.randint(lo, 5),
                "k": rng.randint(1, 4),
            }
        )
    done = subprocess.run(
        [str(VLLM_PYTHON), "-c", VLLM_CHECK],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    ours = [
        Ngram().propose(
            c["context"], c["k"], {"prompt_lookup_min": c["lo"], "prompt_lookup_max": c["hi"]}
        )
        for c in cases
    ]
    differ = [(c, o, t) for c, o, t in zip(cases, ours, theirs, strict=True) if o != t]
    assert not differ, differ[:3]
    assert sum(bool(t) for t in theirs) > 100  # the cases exercise proposals, not only misses
