"""The whole params.yaml: every phase's section, and the checks across sections (the aux layer
ids against the target, the mix weights against the datasets). The `check_params` stage validates
it before any other stage runs; a stage reads only its own sections (core/config.load_sections)."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError, model_validator

from draftline.benchmark.config import BenchmarkConfig
from draftline.core.config import (
    ParamsError,
    ResumeConfig,
    Section,
    credential_problems,
    operational,
    redact_url,
    shaping,
)
from draftline.data.config import Datasets, MixConfig, check_eval_sets, check_weights
from draftline.draft.free import unavailable
from draftline.draft.params import method_named, serving, titles
from draftline.engines.config import EnginesConfig
from draftline.evaluate.config import EvaluateConfig
from draftline.hidden_states.config import HiddenStatesConfig
from draftline.regenerate.config import RegenerateConfig
from draftline.targets.config import TargetConfig
from draftline.tokens.config import TokenizeConfig, VocabConfig
from draftline.train.config import TrainConfig


class Params(Section):
    samples: int = shaping(ge=1)  # training prompts drawn by `mix`
    seed: int = shaping(0)
    target: TargetConfig = shaping()
    datasets: Datasets = shaping()
    mix: MixConfig = shaping()
    regenerate: RegenerateConfig = shaping(RegenerateConfig())
    tokenize: TokenizeConfig = shaping(TokenizeConfig())
    vocab: VocabConfig = shaping(VocabConfig())
    hidden_states: HiddenStatesConfig = shaping(HiddenStatesConfig())
    train: TrainConfig = shaping(TrainConfig())
    evaluate: EvaluateConfig = shaping(EvaluateConfig())
    benchmark: BenchmarkConfig = shaping(BenchmarkConfig())
    engines: EnginesConfig = operational(EnginesConfig())  # where each engine's software is
    resume: ResumeConfig = operational(ResumeConfig())  # how kept work is checked on a rerun

    @model_validator(mode="after")
    def _method_fits_engines(self):
        # the built-in decoders (evaluate and benchmark engine hf) and SGLang run the drafters
        # that say so; vLLM serves every one (draftline/draft/params/)
        method = method_named(self.train.method)
        if self.evaluate.engine == "hf" and not method.serves("hf"):
            raise ValueError(
                f"evaluate.engine: hf decodes {titles(serving('hf'))} drafts only; a train.method "
                f"{method.name} draft is measured by vLLM (evaluate.engine: vllm)"
            )
        engine = self.benchmark.engine
        if not method.serves(engine):
            raise ValueError(
                f"benchmark.engine: {engine} serves {titles(serving(engine))} drafts only here; "
                f"a train.method {method.name} draft is served by vLLM (benchmark.engine: vllm)"
            )
        return self

    @model_validator(mode="after")
    def _free_methods_install(self):
        # a benchmark.free method whose package vLLM's interpreter lacks (suffix:
        # arctic-inference) is refused here, before any stage runs, not when its server starts
        for name in self.benchmark.measured_free:
            if why := unavailable(name, self.engines.vllm.resolved_python()):
                raise ValueError(f"benchmark.free: {why}")
        return self

    @model_validator(mode="after")
    def _weights_match_datasets(self):
        check_eval_sets(self.datasets, self.evaluate.sets)
        check_weights(self.datasets, self.mix, self.evaluate.sets)
        return self


def parse_params(raw: dict) -> Params:
    lines = credential_problems(raw)
    try:
        params = Params.model_validate(raw)
    except ValidationError as err:
        for e in err.errors():
            key = ".".join(str(p) for p in e["loc"]) or "<top level>"
            lines.append(f"  {key}: {redact_url(e['msg'])}")
        params = None
    if lines:
        raise ParamsError("error: invalid params.yaml:\n" + "\n".join(lines)) from None
    return params


def load_params(path: str | Path = "params.yaml") -> Params:
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    if not isinstance(raw, dict):
        raise ParamsError(f"error: {path}: top level must be a mapping")
    return parse_params(raw)
