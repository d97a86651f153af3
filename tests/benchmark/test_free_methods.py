"""Speculation that needs no trained draft (benchmark.free, draftline/draft/free.py): the
registry, the n-gram server's command (no draft model), the params checks, the servers the sweep
adds, the verdict's paired draft-vs-n-gram comparison on recorded passes (checked against scipy by
hand) and deploy.json naming the better one."""

from __future__ import annotations

import json
import math
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pytest
import yaml

from draftline.benchmark import intervals, verdict
from draftline.benchmark.commands import benchmark_serve_command, free_serve_command
from draftline.benchmark.config import BenchmarkConfig
from draftline.benchmark.engines import NoServer
from draftline.benchmark.run import deploy_free
from draftline.benchmark.server import sweep_modes
from draftline.benchmark.sweep import Level, Sweep, levels_from
from draftline.core.config import ParamsError
from draftline.core.io import read_json
from draftline.draft import free
from draftline.params import parse_params
from tests.engines.test_engines import (  # noqa: F401 - draft_dir: the fixture
    LOAD,
    draft_dir,
    run_benchmark_stage,
    stand_ins,
)

ROOT = Path(__file__).resolve().parents[2]


def spec_config(argv: list[str]) -> dict | None:
    if "--speculative-config" not in argv:
        return None
    return json.loads(argv[argv.index("--speculative-config") + 1])


# ---- the registry -------------------------------------------------------------------------------


def test_registry_names_the_methods_and_refuses_an_unknown_one():
    assert list(free.FREE_METHODS) == ["ngram", "suffix"]
    ngram = free.free_method("ngram")
    assert ngram.package is None and "vllm" in ngram.engines
    assert free.free_method("suffix").package == "arctic_inference"
    with pytest.raises(free.UnknownFreeMethod, match="registered free methods ngram, suffix"):
        free.free_method("lookahead")


def test_a_registered_method_is_served_with_no_other_file_touched(random_target):
    class Echo:
        name: ClassVar[str] = "echo"
        title: ClassVar[str] = "echo"
        engines: ClassVar[tuple[str, ...]] = ("vllm",)
        package: ClassVar[str | None] = None
        install: ClassVar[str] = "none"
        defaults: ClassVar[dict] = {"depth": 3}

        def problems(self, settings):
            return []

        def vllm_speculative(self, k, settings):
            return {"method": "echo", "num_speculative_tokens": k, **self.defaults, **settings}

    free.register(Echo())
    try:
        cfg = BenchmarkConfig(free={"echo": {"k": 3}})
        assert [m.name for m in sweep_modes(cfg, "/d", {})][-1] == "echo:k3"
        argv = free_serve_command("vllm", random_target, cfg, "echo", 3)
        assert spec_config(argv) == {"method": "echo", "num_speculative_tokens": 3, "depth": 3}
    finally:
        free.unregister("echo")


def test_no_module_but_the_registry_names_a_free_method():
    """Callers ask the registry: no other module of the package spells a method's name."""
    for path in (ROOT / "draftline").rglob("*.py"):
        if path.name == "free.py":
            continue
        text = path.read_text()
        for name in free.FREE_METHODS:
            assert f'"{name}"' not in text and f"'{name}'" not in text, (path, name)


# ---- the serve command --------------------------------------------------------------------------


def test_ngram_serve_command_has_no_draft_model(random_target):
    cfg = BenchmarkConfig(free={"ngram": {"k": 2}})
    argv = free_serve_command("vllm", random_target, cfg, "ngram", 2, 8123)
    assert spec_config(argv) == {
        "method": "ngram",
        "num_speculative_tokens": 2,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }
    # the rest of the command is the baseline's: the same target, flags and port
    baseline = benchmark_serve_command("vllm", random_target, cfg, None, 8123)
    assert argv[:-2] == baseline
    tuned = BenchmarkConfig(
        free={"ngram": {"k": 3, "speculative_config": {"prompt_lookup_max": 6}}}
    )
    spec = spec_config(free_serve_command("vllm", random_target, tuned, "ngram", 3))
    assert spec["prompt_lookup_max"] == 6 and spec["num_speculative_tokens"] == 3
    assert "model" not in spec
    with pytest.raises(NoServer, match="free method 'ngram' is not served"):
        free_serve_command("sglang", random_target, cfg, "ngram", 2)


def test_the_sweep_serves_each_free_method_beside_the_drafts_ks():
    cfg = BenchmarkConfig(k=[1, 3], free={"ngram": {"k": 2}}, compare={"other": "drafts/o"})
    modes = sweep_modes(cfg, "/d", {"other": "/o"})
    assert [m.name for m in modes] == ["baseline", "k1", "k3", "ngram:k2", "other:k1", "other:k3"]
    ngram = modes[3]
    assert ngram.free and ngram.speculative and ngram.draft_path is None and ngram.k == 2
    assert ngram.free_method == "ngram" and modes[1].free_method is None
    assert not modes[0].speculative
    # an engine that serves no free method measures none (its report says so)
    hf = BenchmarkConfig(engine="hf", free={"ngram": {"k": 2}})
    assert hf.measured_free == {}
    # nor beside servers already running elsewhere
    running = BenchmarkConfig(
        k=2, endpoints={"baseline": "http://h:1", "speculative": "http://h:2"}
    )
    assert running.measured_free == {} and [m.name for m in sweep_modes(running, "/d", {})] == [
        "baseline",
        "k2",
    ]


# ---- params -------------------------------------------------------------------------------------


def test_params_refuse_unknown_methods_and_bad_settings():
    with pytest.raises(ValueError, match="'nope' is none of the registered free methods ngram"):
        BenchmarkConfig(free={"nope": {}})
    with pytest.raises(ValueError, match="prompt_lookup_min 5 > prompt_lookup_max 4"):
        BenchmarkConfig(free={"ngram": {"speculative_config": {"prompt_lookup_min": 5}}})
    with pytest.raises(ValueError, match=r"speculative_config.depth: not a field of ngram"):
        BenchmarkConfig(free={"ngram": {"speculative_config": {"depth": 1}}})
    with pytest.raises(ValueError, match="k"):
        BenchmarkConfig(free={"ngram": {"k": 0}})
    with pytest.raises(ValueError, match="ngram also named in free"):
        BenchmarkConfig(free={"ngram": {}}, compare={"ngram": "drafts/x"})


def test_default_params_measure_ngram_at_one_k():
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    cfg = BenchmarkConfig.model_validate(raw["benchmark"])
    assert list(cfg.measured_free) == ["ngram"] and cfg.free["ngram"].k >= 1


def test_suffix_without_its_package_is_refused_before_any_stage(monkeypatch):
    """The interpreter that serves (engines.vllm.python) cannot import arctic_inference: the whole
    params check refuses, naming the package and how to get it."""
    assert free.unavailable("ngram", sys.executable) is None  # nothing to import
    why = free.unavailable("suffix", sys.executable)
    assert why and "arctic_inference" in why and "pip install arctic-inference" in why
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["benchmark"]["free"] = {"suffix": {"k": 4}}
    raw.setdefault("engines", {}).setdefault("vllm", {})["python"] = sys.executable
    with pytest.raises(
        ParamsError, match="benchmark.free: suffix decoding needs .*arctic_inference"
    ):
        parse_params(raw)
    # where it installs, suffix is served like ngram (vLLM's own suffix_decoding_* defaults)
    monkeypatch.setattr(free, "importable", lambda python, module: True)
    assert free.unavailable("suffix", sys.executable) is None
    params = parse_params(raw)
    assert list(params.benchmark.measured_free) == ["suffix"]


# ---- the verdict --------------------------------------------------------------------------------

# paired ratios to the baseline pass of the same round, round = list index
DRAFT = {1: [1.30, 1.25, 1.36, 1.28, 1.33, 1.27], 2: [1.42, 1.35, 1.50, 1.38, 1.47, 1.40]}
NGRAM_SLOW = [0.80, 0.77, 0.83, 0.79, 0.81, 0.76]  # draft beats it
NGRAM_FAST = [1.70, 1.62, 1.80, 1.66, 1.75, 1.69]  # beats the draft


def levels_with(ngram: list[float], loads=(1, 4)) -> dict[int, Level]:
    levels = {}
    for c in loads:
        spec = {
            k: {"output_tokens_per_s": 100 * r[0], "paired_speedups": r} for k, r in DRAFT.items()
        }
        level = Level({"output_tokens_per_s": 100.0}, spec, {k: ["same"] for k in DRAFT})
        level.free["ngram"] = {
            "k": 2,
            "output_tokens_per_s": 100 * ngram[0],
            "acceptance_length": 1.4,
            "paired_speedups": ngram,
        }
        levels[c] = level
    return levels


def by_hand(a: list[float], b: list[float], level: float) -> tuple[float, float, float]:
    """The paired t interval of a over b, with scipy."""
    import numpy as np
    from scipy import stats

    d = np.log(a) - np.log(b)
    half = stats.t.ppf(1 - (1 - level) / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    return math.exp(d.mean()), math.exp(d.mean() - half), math.exp(d.mean() + half)


def compared(ngram: list[float]):
    levels = levels_with(ngram)
    # the schedule's statements plus two per load (ngram's speedup, the draft over it), one family
    rule = intervals.Rule(confidence=0.9, loads=2, ks=2, looks=1, extra=2 * 2)
    decided = {
        c: intervals.decide_load({k: s["paired_speedups"] for k, s in lv.speculative.items()}, rule)
        for c, lv in levels.items()
    }
    cfg = BenchmarkConfig(k=[1, 2], concurrency=[1, 4], free={"ngram": {"k": 2}})
    return levels, rule, decided, verdict.free_comparisons(levels, decided, rule, cfg, 4)["free"]


def test_the_draft_against_ngram_is_a_paired_interval_over_the_enlarged_family():
    levels, rule, decided, out = compared(NGRAM_SLOW)
    # 2 loads x (2 ks + their pair) + 2 loads x (ngram's speedup, the draft over it)
    level = 1 - 0.1 / (2 * 3 + 2 * 2)
    assert out["level"] == pytest.approx(level, abs=1e-6) == rule.level
    assert verdict.rule_of(SimpleNamespace(confidence=0.9), levels).extra == 4
    for c in (1, 4):
        cmp = out["methods"]["ngram"]["by_load"][str(c)]
        k = decided[c]["k"] if decided[c]["k"] is not None else decided[c]["best_k"]
        assert cmp["draft_k"] == k and cmp["paired"] and cmp["n"] == 6
        ratio, low, high = by_hand(DRAFT[k], NGRAM_SLOW, level)
        assert cmp["ratio"] == pytest.approx(ratio, abs=1e-4)
        assert cmp["low"] == pytest.approx(low, abs=1e-4)
        assert cmp["high"] == pytest.approx(high, abs=1e-4)
        assert cmp["better"] == "draft" and cmp["free_k"] == 2
        # ngram's own speedup interval, on the same baseline passes
        geo = math.exp(sum(math.log(r) for r in NGRAM_SLOW) / 6)
        assert cmp["free_speedup"] == pytest.approx(geo, abs=1e-4) and cmp["free_high"] < 1
    assert out["better_at_serve"] == "draft"
    assert "trained draft beats ngram (k=2)" in out["words"]


def test_ngram_that_beats_the_draft_is_named_and_a_close_one_cannot_be_told():
    _, _, _, out = compared(NGRAM_FAST)
    assert out["better_at_serve"] == "ngram"
    assert out["methods"]["ngram"]["by_load"]["4"]["high"] < 1
    assert "ngram (k=2, no draft) beats the trained draft" in out["words"]
    # ngram's ratios about the draft's k=2 ones, each round within a few percent either side
    close = [r * f for r, f in zip(DRAFT[2], (1.03, 0.96, 1.02, 0.98, 1.04, 0.97), strict=True)]
    _, _, _, tied = compared(close)
    assert tied["better_at_serve"] is None and "cannot tell" in tied["words"]


def test_the_verdict_and_the_sweep_json_carry_ngram():
    levels = levels_with(NGRAM_SLOW)
    cfg = BenchmarkConfig(
        k=[1, 2], concurrency=[1, 4], serve_concurrency=4, free={"ngram": {"k": 2}}
    )
    v = verdict.decide(levels, cfg, "vllm", [])
    assert v["free"]["better_at_serve"] == "draft"
    # the detail report's levels keep ngram's entry, and a recorded sweep reads it back
    decided = {int(c): d for c, d in v["decisions"].items()}
    detail = Sweep(levels, {1: None, 2: None}).to_json(decided)
    assert detail["levels"]["c4"]["free"]["ngram"]["k"] == 2
    assert levels_from(detail)[4].free["ngram"]["paired_speedups"] == NGRAM_SLOW
    # an engine that serves no free method says it did not measure it
    hf = verdict.free_comparisons(
        {1: Level({"output_tokens_per_s": 1.0}, {})}, {}, intervals.Rule(), cfg, 1
    )
    assert "not in the sweep measured" in hf["free"]["not_measured"]["ngram"]
    hf_cfg = BenchmarkConfig(engine="hf")
    hf = verdict.free_comparisons(
        {1: Level({"output_tokens_per_s": 1.0}, {})}, {}, intervals.Rule(), hf_cfg, 1
    )
    assert hf["free"]["not_measured"] == {"ngram": "benchmark.engine hf does not serve it"}


def test_deploy_json_names_the_better_one(random_target):
    cfg = BenchmarkConfig(
        k=[1, 2], concurrency=[1, 4], serve_concurrency=4, free={"ngram": {"k": 2}}
    )
    for ngram, better in ((NGRAM_SLOW, "draft"), (NGRAM_FAST, "ngram")):
        v = verdict.decide(levels_with(ngram), cfg, "vllm", [])
        deploy: dict = {}
        deploy_free(cfg, random_target, deploy, v)
        out = deploy["free"]
        assert out["better"] == better and out["serve_concurrency"] == 4
        assert out["words"] == v["free"]["words"]
        ngram_deploy = out["methods"]["ngram"]
        served = spec_config(shlex.split(ngram_deploy["commands"]["vllm"]))
        assert served["method"] == "ngram" and "model" not in served
        assert "--port" not in ngram_deploy["commands"]["vllm"]  # the deployment command
        low, high = ngram_deploy["draft_over_it_interval"]
        assert (low > 1) if better == "draft" else (high < 1)
    # no free method configured or measured: neither the verdict nor deploy.json has `free`
    plain = BenchmarkConfig(k=[1, 2], concurrency=[1, 4], serve_concurrency=4, free={})
    levels = levels_with(NGRAM_SLOW)
    for level in levels.values():
        level.free.clear()
    v = verdict.decide(levels, plain, "vllm", [])
    deploy = {}
    deploy_free(plain, random_target, deploy, v)
    assert "free" not in v and "free" not in deploy


def test_the_comparison_says_whether_the_two_servers_shared_their_baseline_passes():
    levels, rule, decided, _ = compared(NGRAM_SLOW)
    cfg = BenchmarkConfig(k=[1, 2], concurrency=[1, 4], free={"ngram": {"k": 2}})
    for groups, same in (([["k1", "k2", "ngram:k2"]], True), ([["k1", "k2"], ["ngram:k2"]], False)):
        out = verdict.free_comparisons(levels, decided, rule, cfg, 4, {"groups": groups})
        assert {
            cmp["same_group"] for cmp in out["free"]["methods"]["ngram"]["by_load"].values()
        } == {same}
    out = verdict.free_comparisons(levels, decided, rule, cfg, 4, {"layout": "sequential"})
    assert out["free"]["methods"]["ngram"]["by_load"]["4"]["same_group"] is None


# ---- the stage, against the stand-in vLLM ---------------------------------------------------------


def test_the_stage_serves_ngram_beside_the_draft_and_deploy_names_the_better_one(
    tmp_path,
    random_target,
    draft_dir,  # noqa: F811 - the fixture imported above
):
    """benchmark.free ngram at k=2 beside the draft's k1 and k3 (vLLM stand-ins): its server runs
    with no draft model in the same rounds against the same baseline, its spec-decode counters
    count it as speculative, and the verdict and deploy.json compare the draft with it."""
    overrides = {**LOAD, **stand_ins("vllm"), "free": {"ngram": {"k": 2}}}
    proc = run_benchmark_stage(tmp_path, random_target, draft_dir, overrides)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = read_json(tmp_path / "bench.detail.json")
    assert report["verdict"]["design"]["servers"] == ["baseline", "k1", "k3", "ngram:k2"]
    for c in ("c1", "c4"):
        ngram = report["levels"][c]["free"]["ngram"]
        assert ngram["k"] == 2 and ngram["acceptance_length"] > 1 and ngram["drafts"] > 0
        assert len(ngram["paired_speedups"]) == LOAD["repeats"]
        assert ngram["output_verdicts"]["mismatch"] == 0
    free_verdict = report["verdict"]["free"]
    assert set(free_verdict["methods"]["ngram"]["by_load"]) == {"1", "4"}
    deploy = read_json(tmp_path / "deploy.json")
    served = deploy["benchmark"]["serve_commands"]["ngram:k2"]
    spec = spec_config(shlex.split(served))
    assert spec["method"] == "ngram" and "model" not in spec
    assert deploy["free"]["better"] == free_verdict["better_at_serve"]
    assert deploy["free"]["words"] == free_verdict["words"]
