"""Each train.method's deployment command, checked against what vLLM's config accepts: the
command preflight writes into reports/deploy.json, its --speculative-config handed to vLLM's own
SpeculativeConfig (in the vLLM environment, as `vllm serve` builds it before loading weights),
and the wrong settings preflight refuses before any server starts."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from draftline.benchmark.config import BenchmarkConfig
from draftline.benchmark.preflight import preflight_engines
from draftline.draft.model import build_draft, save_draft
from draftline.engines.config import VLLM_VENV
from draftline.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / VLLM_VENV / "bin" / "python"
METHOD_PARAMS = {
    "eagle3": {},
    "peagle": {"method": "peagle", "peagle": {"depths": 4}},
    "dflash": {"method": "dflash", "dflash": {"block_size": 5}},
}


@pytest.fixture(scope="module")
def drafts(tmp_path_factory, random_target, vocab_dir):
    root = tmp_path_factory.mktemp("method_drafts")
    out = {}
    for method, params in METHOD_PARAMS.items():
        model = build_draft(random_target, vocab_dir, TrainConfig(**params))
        save_draft(model, root / method)
        out[method] = root / method
    return out


def speculative_config(command: str) -> dict:
    args = shlex.split(command)
    return json.loads(args[args.index("--speculative-config") + 1])


def vllm_resolves(jobs: list[dict]) -> list[dict]:
    """What vLLM's SpeculativeConfig resolves for each {model, speculative_config} job, all in one
    process of the vLLM environment (its import is most of the cost); {"error": ...} where vLLM
    refused one."""
    done = subprocess.run(
        [str(VLLM_PYTHON), str(ROOT / "tests" / "vllm_speculative_check.py"), json.dumps(jobs)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "VLLM_CPU_KVCACHE_SPACE": "1", "HOME": str(Path.home())},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def deployed(drafts, random_target):
    """method -> (the speculative config preflight's deploy command gives vLLM, what vLLM resolved)."""
    cfg = BenchmarkConfig(k=[1, 3])
    specs = {}
    for method, draft in drafts.items():
        deploy = preflight_engines(random_target, cfg, str(draft))["vllm"]
        assert deploy["problems"] == [], (method, deploy["problems"])
        specs[method] = speculative_config(deploy["command"])
    seen = vllm_resolves(
        [{"model": random_target.model, "speculative_config": spec} for spec in specs.values()]
    )
    return {method: (specs[method], resolved) for method, resolved in zip(specs, seen)}


@pytest.mark.skipif(not VLLM_PYTHON.is_file(), reason=f"no {VLLM_VENV}: make setup-vllm")
@pytest.mark.parametrize("method", list(METHOD_PARAMS))
def test_the_deploy_command_of_each_method_is_what_vllm_accepts(
    method, deployed, drafts, random_target
):
    spec, seen = deployed[method]
    assert "error" not in seen, seen["error"]
    assert spec["model"] == str(drafts[method].resolve()) and spec["num_speculative_tokens"] == 3
    assert seen["num_speculative_tokens"] == 3
    assert seen["eagle_aux_hidden_state_layer_ids"] == random_target.aux_ids
    if method == "eagle3":
        assert seen["method"] == "eagle3" and not seen["parallel_drafting"]
        assert seen["architectures"] == ["Eagle3LlamaForCausalLM"]
    elif method == "peagle":
        assert seen["method"] == "eagle3" and seen["parallel_drafting"]
        assert seen["architectures"] == ["PeagleLlamaForCausalLM"]
        assert seen["pard_token"] is not None
    else:
        assert seen["method"] == "dflash" and seen["parallel_drafting"]
        # vLLM's DFlash counts target layers from the output of the one before (its #40727)
        assert seen["dflash_config"]["target_layer_ids"] == [i - 1 for i in random_target.aux_ids]


@pytest.mark.parametrize(
    ("method", "vllm", "expected"),
    [
        ("eagle3", {"method": "eagle"}, "it must be 'eagle3' or null"),
        ("eagle3", {"speculative_config": {"parallel_drafting": True}}, "one token per forward"),
        ("peagle", {"method": "dflash"}, "it must be 'eagle3' or null"),
        ("peagle", {"speculative_config": {"parallel_drafting": False}}, "parallel_drafting false"),
        ("dflash", {"method": "eagle3"}, "it must be 'dflash' or null"),
    ],
)
def test_preflight_refuses_a_method_the_draft_was_not_trained_for(
    method, vllm, expected, drafts, random_target
):
    cfg = BenchmarkConfig(k=[1], vllm=vllm)
    problems = preflight_engines(random_target, cfg, str(drafts[method]))["vllm"]["problems"]
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize("method", ["peagle", "dflash"])
def test_preflight_refuses_more_draft_tokens_than_a_parallel_draft_was_trained_for(
    method, drafts, random_target
):
    cfg = BenchmarkConfig(k=[1, 6])
    problems = preflight_engines(random_target, cfg, str(drafts[method]))["vllm"]["problems"]
    assert any("drafts at most 4 in one forward" in p for p in problems), problems
    sglang = preflight_engines(random_target, cfg, str(drafts[method]))["sglang"]["problems"]
    assert any("SGLang only EAGLE-3 drafts" in p for p in sglang), sglang
