"""params.yaml `evaluate`: the engine that measures acceptance and what it decodes."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from draftline.core.config import TIE_TOLERANCE, Section, TargetPlacement, operational, shaping


class EvaluateVllmConfig(Section):
    """evaluate.engine: vllm (draftline/evaluate/vllm_engine.py)."""

    # keyword arguments of vLLM's LLM(...): its parallelism and memory, e.g.
    # {tensor_parallel_size: 8, max_model_len: 8192} (how it runs, not what it measures);
    # enforce_eager: a few dozen prompts cost less uncompiled than compiling takes
    engine_args: dict[str, int | float | str | bool] = operational({"enforce_eager": True})
    # the built-in engine evaluates the draft too and the stage fails when the two disagree beyond
    # parity_tolerance (null = by dtype, vllm_evaluation.PARITY_TOLERANCE); false for a target the
    # built-in engine cannot hold (then vLLM alone measures, and tau_sim is not computed)
    parity: bool = shaping(True)
    parity_tolerance: float | None = operational(None, ge=0)


class EvaluateConfig(TargetPlacement):
    # builtin decoder in this process (hf) | vllm: vLLM's offline engine with the draft, in the
    # engines.vllm environment, acceptance from its spec-decode counters
    engine: Literal["hf", "vllm"] = shaping("vllm")
    vllm: EvaluateVllmConfig = shaping(EvaluateVllmConfig())
    k: int = shaping(3, ge=1)  # draft tokens per verification step
    max_new_tokens: int = shaping(64, ge=1)
    prompts: int | None = shaping(None, ge=1)  # null = every eval prompt
    tie_tolerance: float | None = shaping(None, ge=0)  # null = by dtype (TIE_TOLERANCE)
    # Most prompts (a share) whose output may diverge from greedy at a near-tie (greedy's runner-up
    # taken where its top two were within tie_tolerance) before the stage fails: such a prompt is
    # checked only up to that token. float32 has no tolerance, so its share is 0; for 16-bit
    # targets a quarter lets the odd reordered tie of a 64-96-token answer through and fails a
    # check that covers less than three prompts in four to the end.
    max_near_tie_share: float = operational(0.25, ge=0, le=1)
    # Eval sets beside the held-out split: names of `datasets` whose rows all go to evaluation (a
    # standard benchmark preset such as mt_bench, gsm8k_test, math500, speculator_benchmarks, or a
    # local file). `mix` keeps them out of train by content like the split; the detail report and
    # reports/evaluate/sets.md give acceptance per set (docs/evaluation.md)
    sets: list[str] = shaping([])
    # Drafts measured beside the trained one on the same prompts by the same engine: name -> an
    # EAGLE-3 checkpoint directory or hub id (e.g. a public drafter). A draft that does not fit the
    # target (aux layers, hidden size, vocabulary, d2t) is refused before anything is measured
    compare: dict[str, str] = shaping({})
    # when fine-tuning (train.init set), the draft it started from is measured beside it as "init"
    compare_init: bool = shaping(True)
    # Acceptance by context length (draftline/evaluate/context.py): bucket edges in tokens; the
    # built-in engine buckets every verification step by its context (prompt + generated), vLLM
    # each request by its prompt length. [] = one bucket
    context_buckets: list[int] = shaping([256, 1024, 4096])
    # of each bucket's (and span's) acceptance interval over prompts
    confidence: float = shaping(0.9, gt=0, lt=1)
    # the verdict names a collapse when the longest bucket measured falls below this share of the
    # shortest one's acceptance length
    collapse_share: float = shaping(0.8, gt=0, le=1)
    # the tokens that open and close a reasoning span in the target's output (one token each):
    # acceptance inside reasoning vs in the answer; not single tokens of the target: no split
    reasoning_markup: list[str] = shaping(["<think>", "</think>"])
    # a chat-template switch for thinking (passed as chat_template_kwargs): where the target's
    # template reads it, the prompts are also decoded with it on and with it off (acceptance of
    # each, built-in engine); null = no switch measured
    thinking_switch: str | None = shaping("enable_thinking")

    def resolved_tie_tolerance(self) -> float:
        return TIE_TOLERANCE[self.dtype] if self.tie_tolerance is None else self.tie_tolerance

    @model_validator(mode="after")
    def _buckets_increase(self):
        from draftline.evaluate.context import ContextBucketsError, check_edges

        try:
            check_edges(self.context_buckets)
        except ContextBucketsError as err:
            raise ValueError(str(err).removeprefix("error: ")) from None
        return self

    @model_validator(mode="after")
    def _plain_compare_names(self):
        if "trained" in self.compare or "init" in self.compare:
            raise ValueError(
                "compare: the names 'trained' (this run's draft) and 'init' (train.init) are taken"
            )
        if len(set(self.sets)) != len(self.sets):
            raise ValueError(f"sets: a set is named twice in {self.sets}")
        return self
