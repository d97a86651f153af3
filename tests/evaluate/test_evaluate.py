"""tau_sim (teacher-forced, speculators' own TTT forward) against independent counts, and the stage."""

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from transformers import DynamicCache

from draftline.core.io import read_json, write_json, write_jsonl
from draftline.draft.methods import chain
from draftline.draft.model import build_draft
from draftline.evaluate.acceptance import (
    NotLossless,
    acceptance_summary,
    simulated_acceptance,
    teacher_forced_sample,
    teacher_forced_sums,
)
from draftline.evaluate.specdec import (
    DraftRunner,
    SpecPair,
    greedy_generate,
    speculative_generate,
)
from draftline.targets.model import load_target
from draftline.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
PROMPT = [1, 40, 41, 42, 2, 1, 50, 51]


def tail_vocab_dir(path: Path, vocab: int, first: int) -> Path:
    """A draft vocabulary of target ids [first, vocab): draft id 0 is target id `first`."""
    path.mkdir()
    np.save(path / "d2t.npy", np.full(vocab - first, first, dtype=np.int64))
    t2d = np.zeros(vocab, dtype=bool)
    t2d[first:] = True
    np.save(path / "t2d.npy", t2d)
    return path


def test_tau_sim_counts_a_constant_draft(tmp_path, random_target):
    """A draft that always proposes T*: acc_s is the share of completion positions whose next
    s+1 target choices (argmax over the draft vocabulary, as speculators scores) are all T*."""
    model, _ = load_target(random_target)
    m = 24
    completion = greedy_generate(model, PROMPT, m, eos_ids={-1}).tokens
    star = Counter(completion[1:]).most_common(1)[0][0]
    vocab = random_target.vocab_size
    tail_vocab = tail_vocab_dir(tmp_path / "vocab", vocab, star)
    draft = build_draft(random_target, tail_vocab, TrainConfig()).eval()
    with torch.no_grad():
        draft.lm_head.weight.zero_()  # all logits equal: argmax = draft id 0 = target id T*

    sample = teacher_forced_sample(model, random_target.aux_ids, PROMPT, completion)
    sums = teacher_forced_sums(draft, sample, chain(3), "cpu")
    sim = simulated_acceptance(sums, chain(3))

    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + completion])).logits[0]  # (P + m, V)
    choice = [
        int(logits[len(PROMPT) + j - 1, star:].argmax()) + star for j in range(1, m + 1)
    ]  # target's pick for completion index j (m = after it)
    # the draft input is completion token i; step s must produce the pick for index i + 1 + s <= m
    expected = [
        sum(all(choice[i + t] == star for t in range(s + 1)) for i in range(m) if i + 1 + s <= m)
        / m
        for s in range(3)
    ]
    assert expected[0] > 0  # the check is not vacuous
    assert [sim["position_accuracy"][str(s + 1)] for s in range(3)] == [
        round(e, 4) for e in expected
    ]
    assert sim["tau_sim"] == round(1 + sum(round(e, 4) for e in expected), 4)


def test_teacher_forced_layout_matches_the_incremental_decoder(random_target, vocab_dir):
    """Step 0 of speculators' forward over the tau_sim sample proposes, at every completion
    position, the same token as the built-in decoder's draft given the same context."""
    from draftline.draft.forward import PackLayout, device_loss_config, pack_collate, run_batch
    from draftline.draft.methods import Forward

    model, _ = load_target(random_target)
    torch.manual_seed(3)
    draft = build_draft(random_target, vocab_dir, TrainConfig()).eval()
    completion = greedy_generate(model, PROMPT, 12, eos_ids={-1}).tokens
    sample = teacher_forced_sample(model, random_target.aux_ids, PROMPT, completion)
    layout = PackLayout(
        len(sample["input_ids"]) - 1, sample["verifier_last_hidden_states"].shape[-1]
    )
    with torch.no_grad():
        draft_tokens, _, _ = run_batch(
            draft,
            pack_collate(layout, torch.float32)([sample]),
            "cpu",
            Forward.for_training(TrainConfig()),
            device_loss_config("cpu"),
        )
    runner = DraftRunner(draft)
    ids, aux = sample["input_ids"].tolist(), sample["hidden_states"].unsqueeze(0)  # (1, L, 3H)
    p = len(PROMPT)
    forward_step0 = [
        int(runner._to_target_ids(draft_tokens[0][0, p + i - 1])) for i in range(len(completion))
    ]
    incremental = [
        runner.propose(DynamicCache(), ids[1 : p + i + 1], aux[:, : p + i], 0, 1)[0]
        for i in range(len(completion))
    ]
    assert forward_step0 == incremental


def test_acceptance_summary_per_position_and_histogram():
    s = acceptance_summary([4, 4, 2, 1, 3], k=3)
    assert s["acceptance_length"] == 2.8
    assert s["position_acceptance"] == {"1": 0.8, "2": 0.6, "3": 0.4}
    assert s["histogram"] == {"1": 1, "2": 1, "3": 1, "4": 2}


def test_tokens_per_step_counts_what_the_steps_emitted():
    # prompt 1 stopped mid-step in its last round (a+1 = 3, 1 emitted), prompt 2 at a step's end
    rounds, emitted = [4, 4, 3, 2, 2], [4, 4, 1, 2, 2]
    s = acceptance_summary(rounds, k=3, emitted=emitted)
    assert s["acceptance_length"] == 3.0 and s["tokens_per_step"] == 2.6
    assert s["emitted_position_acceptance"] == {"1": 0.8, "2": 0.4, "3": 0.4}
    assert s["emitted_histogram"] == {"1": 1, "2": 2, "3": 0, "4": 2}
    assert s["tokens_per_step"] == round(1 + sum(s["emitted_position_acceptance"].values()), 4)
    with pytest.raises(ValueError):
        acceptance_summary(rounds, k=3, emitted=[4, 4, 4, 2, 2])  # more than the round's a+1


@pytest.mark.parametrize(
    ("dtype", "engine", "flags"), [("float32", "hf", []), ("bfloat16", "vllm", ["--dev"])]
)
def test_evaluate_stage_writes_flat_metrics(tmp_path, trained_draft, dtype, engine, flags):
    """The stage on a draft that has learned its target (conftest): its acceptance and lossless
    figures equal those of the built-in decoder run here on the same prompts. The dev split
    (`--dev`) with engine vllm measures with the built-in engine alone: its vLLM, an interpreter
    that does not exist here, is never started."""
    from draftline.core.config import TIE_TOLERANCE
    from draftline.draft.checkpoint import load_draft
    from draftline.evaluate.acceptance import compare_to_greedy, eos_ids
    from draftline.tokens.chat import first_turn_ids

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["evaluate"].update(
        engine=engine, k=2, max_new_tokens=10, prompts=3, device="cpu", dtype=dtype, sets=[]
    )
    raw["engines"]["vllm"]["python"] = str(tmp_path / "no-vllm" / "python")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    card = trained_draft.card
    card.write(tmp_path / "card.json")
    rows = [
        {"id": f"e{i}", "source": "ab"[i % 2], **c}
        for i, c in enumerate(trained_draft.conversations)
    ]
    rows[0]["source_detail"] = rows[2]["source_detail"] = (
        "upstream"  # a blended dataset's own column
    )
    write_jsonl(tmp_path / "eval.jsonl", rows)
    write_json(
        tmp_path / "meta.json", {"stage": "mix", "counts": {"train": 1092, "eval": 4}}
    )  # fewer than `samples`
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stages.evaluate",
            "card.json",
            str(trained_draft.dir),
            "eval.jsonl",
            "acc.json",
            "plots",
            *flags,
        ],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = read_json(tmp_path / "acc.detail.json")
    assert "engines" not in report and "parity" not in report  # the built-in engine alone
    assert read_json(tmp_path / "acc.json") == {
        "acceptance_length": report["acceptance_length"],
        "tau_sim": report["tau_sim"],
        "tokens_per_step": report["tokens_per_step"],
        "engine": "hf",  # the engine that measured the headline
    }
    assert 1.0 <= report["tokens_per_step"] <= report["acceptance_length"]
    assert sum(report["emitted_histogram"].values()) == report["rounds"]
    assert set(report["emitted_position_acceptance"]) == {"1", "2"}
    assert all(
        s["tokens_per_step"] <= s["acceptance_length"] for s in report["per_source"].values()
    )
    assert report["prompts"] == 3 and report["k"] == 2

    # the same decoding here: rounds, acceptance and each prompt's verdict
    model, tokenizer = load_target(card, dtype=getattr(torch, dtype))
    draft = load_draft(trained_draft.dir, card, "cpu")
    stop, tolerance = eos_ids(tokenizer, model), TIE_TOLERANCE[dtype]
    rounds, verdicts = [], []
    for row in rows[:3]:
        ids = first_turn_ids(tokenizer, row)
        spec = speculative_generate(SpecPair(model, draft, card.aux_ids), ids, 10, 2, stop)
        plain = greedy_generate(model, ids, 10, stop, margins=True, tie_tolerance=tolerance)
        rounds += spec.accepted_per_round
        verdicts.append(compare_to_greedy(spec.tokens, plain, tolerance))
    assert report["rounds"] == len(rounds)
    assert report["acceptance_length"] == acceptance_summary(rounds, 2)["acceptance_length"] > 1.3
    assert report["histogram"] == {str(n): rounds.count(n) for n in range(1, 4)}
    assert report["lossless_checked_prompts"] == verdicts.count("identical")
    assert report["near_tie_divergences"] == verdicts.count("near_tie")
    assert report["near_tie_share"] == round(verdicts.count("near_tie") / 3, 4)
    if dtype == "float32":
        assert report["lossless_checked_prompts"] == 3  # no tolerance: token for token
    # tau_sim is 1 + the per-position accuracies it reports, each at most the one before
    accuracy = [report["sim_position_accuracy"][p] for p in ("1", "2")]
    assert report["tau_sim"] == round(1 + sum(accuracy), 4) and 1 > accuracy[0] >= accuracy[1] > 0
    assert set(report["position_acceptance"]) == set(report["sim_position_accuracy"]) == {"1", "2"}
    assert sum(report["histogram"].values()) == report["rounds"]
    assert set(report["per_source"]) == {"a", "b"} and report["per_source"]["a"]["prompts"] == 2
    assert report["per_source_detail"] == {
        "a/upstream": {**report["per_source"]["a"]}
    }  # rows 0 and 2: all of a
    # every value is a number or a dict of numbers: `dvc metrics diff` shows each under a dotted key;
    # but the context sections, lists of buckets (their plot and reports/evaluate/context.json show
    # them), and the engine's name beside the figures
    context = {"by_context", "by_span", "trained_length", "thinking_switch"}
    assert sum(b["steps"] for b in report["by_context"]["buckets"]) == report["rounds"]
    for key, value in report.items():
        if key == "engine" or key in context:
            continue
        assert isinstance(value, (int, float)) or all(
            isinstance(v, (int, float, dict)) for v in value.values()
        )
    scaling = read_json(tmp_path / "plots/acceptance_vs_samples.json")
    # the scaling point is at the train prompts mix drew (mix.allow_shortfall), not at the `samples` asked
    assert scaling == [
        {
            "samples": 1092,
            "samples_requested": raw["samples"],
            "k": 2,  # the acceptance's k: the benchmark's samples forecast reads it
            "acceptance_length": report["acceptance_length"],
            "tau_sim": report["tau_sim"],
        }
    ]
    positions = read_json(tmp_path / "plots/position_acceptance.json")
    assert [p["position"] for p in positions] == [1, 2]


# ---- the near-tie rule and its ceiling


def test_lossless_summary_counts_and_caps_near_ties():
    from draftline.evaluate.acceptance import NotLossless, lossless_summary

    one_in_four = {"a": "identical", "b": "near_tie", "c": "identical", "d": "identical"}
    assert lossless_summary(one_in_four, 0.5, "bfloat16", 0.25) == {
        "lossless_checked_prompts": 3,
        "near_tie_divergences": 1,
        "near_tie_share": 0.25,
    }
    with pytest.raises(
        NotLossless, match=r"^error: 1 of 4 prompts \(25%\).*max_near_tie_share 0.2"
    ):
        lossless_summary(one_in_four, 0.5, "bfloat16", 0.2)
    with pytest.raises(NotLossless, match="differed from greedy target output on 1 prompts"):
        lossless_summary({**one_in_four, "e": "mismatch"}, 0.5, "bfloat16", 1.0)


def seed_divergence(monkeypatch, pick: str, prompts: int, tie_tolerance: float) -> list[dict]:
    """Make the speculative decoder of evaluate diverge from greedy on the first `prompts`
    prompts at their closest near-tie among the first 5 tokens: with greedy's runner-up
    (pick="runner_up") or with the token greedy put last (pick="far"). Returns what was seeded."""
    from draftline.evaluate import specdec

    real, seeded = speculative_generate, []  # the decoder itself, not an earlier seeding

    def diverging(pair, prompt, max_new_tokens, k, stop):
        gen = real(pair, prompt, max_new_tokens, k, stop)
        if len(seeded) == prompts:
            return gen
        target = pair.target
        plain = specdec.greedy_generate(target, prompt, max_new_tokens, stop, True, tie_tolerance)
        i = min(range(5), key=lambda j: plain.margins[j])
        with torch.no_grad():
            logits = target(torch.tensor([prompt + plain.tokens[:i]])).logits[0, -1]
        runner_up = min(plain.runner_ups[i], key=plain.runner_ups[i].get)
        token = runner_up if pick == "runner_up" else int(logits.argmin())
        seeded.append(
            {"margin": plain.margins[i], "gap": float(logits.max() - logits[token]), "token": token}
        )
        # its tokens past the divergence are moot; their count stays (tokens per step)
        gen.tokens = plain.tokens[:i] + [token] + gen.tokens[i + 1 :]
        return gen

    monkeypatch.setattr(specdec, "speculative_generate", diverging)
    return seeded


def evaluate_in_process(tmp_path, random_target, vocab_dir, prompts: int, **cfg):
    from draftline.evaluate.acceptance import evaluate_draft
    from draftline.evaluate.config import EvaluateConfig
    from draftline.targets.corpus import generate_conversations

    torch.manual_seed(0)
    build_draft(random_target, vocab_dir, TrainConfig(ttt_steps=2)).save_pretrained(
        tmp_path / "draft"
    )
    rows = [{"id": f"e{i}", **c} for i, c in enumerate(generate_conversations(prompts, 5))]
    write_jsonl(tmp_path / "eval.jsonl", rows)
    config = EvaluateConfig(k=2, max_new_tokens=10, device="cpu", **cfg)
    return evaluate_draft(config, random_target, tmp_path / "draft", tmp_path / "eval.jsonl", 10)


def test_a_divergence_at_a_near_tie_to_a_token_that_was_no_contender_fails(
    tmp_path, random_target, vocab_dir, monkeypatch
):
    """Greedy's top two were within the tolerance there, but the speculative token is the one
    greedy put last: not a reordering of a near-tie, so evaluate fails."""
    seeded = seed_divergence(monkeypatch, "far", 1, 0.1)
    with pytest.raises(NotLossless, match="differed from greedy target output on 1 prompts"):
        evaluate_in_process(tmp_path, random_target, vocab_dir, 3, tie_tolerance=0.1)
    assert seeded[0]["margin"] <= 0.1 < seeded[0]["gap"]  # the premise: a near-tie, a far token


def test_near_ties_past_the_share_fail_and_within_it_are_reported(
    tmp_path, random_target, vocab_dir, monkeypatch
):
    seeded = seed_divergence(monkeypatch, "runner_up", 1, 0.1)
    run = evaluate_in_process(
        tmp_path, random_target, vocab_dir, 4, tie_tolerance=0.1, max_near_tie_share=0.25
    )
    assert seeded[0]["margin"] <= 0.1  # greedy's runner-up, at a near-tie
    assert seeded[0]["gap"] == pytest.approx(seeded[0]["margin"], abs=1e-4)
    assert (
        run.report["near_tie_divergences"],
        run.report["near_tie_share"],
        run.report["lossless_checked_prompts"],
    ) == (1, 0.25, 3)
    (tmp_path / "more").mkdir()
    seed_divergence(monkeypatch, "runner_up", 2, 0.1)
    with pytest.raises(NotLossless, match=r"2 of 4 prompts \(50%\).*max_near_tie_share 0.25"):
        evaluate_in_process(
            tmp_path / "more",
            random_target,
            vocab_dir,
            4,
            tie_tolerance=0.1,
            max_near_tie_share=0.25,
        )


def test_vllm_runs_its_engine_in_process_unless_parallel():
    """evaluate.engine vllm: one process for the engine where nothing is parallel (its start-up is
    mostly imports, paid once instead of three times on the CPU build); vLLM's defaults with tensor
    or pipeline parallelism, and what the environment says always wins."""
    from draftline.engines.config import VllmEngineConfig
    from draftline.evaluate.vllm_engine import generate_env

    engine = VllmEngineConfig()
    flag = "VLLM_ENABLE_V1_MULTIPROCESSING"
    assert generate_env({"engine_args": {"enforce_eager": True}}, engine, {})[flag] == "0"
    assert generate_env({"engine_args": {"tensor_parallel_size": 1}}, engine, {})[flag] == "0"
    for parallel in ({"tensor_parallel_size": 8}, {"pipeline_parallel_size": 2}):
        assert flag not in generate_env({"engine_args": parallel}, engine, {})
    assert generate_env({"engine_args": {}}, engine, {flag: "1"})[flag] == "1"
    env = generate_env({"engine_args": {}}, engine, {"PATH": "/bin"})
    assert env["PATH"] == "/bin" and env["VLLM_CPU_KVCACHE_SPACE"] and env["PYTHONPATH"]
