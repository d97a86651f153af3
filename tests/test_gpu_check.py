"""The GPU check (scripts/gpu_check.sh) cannot rot: its CPU dry run runs every stage for a few tiny
steps and its correctness checks; its CUDA params validate; its wheel list stays in step with
pyproject.toml."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from draftline.params import parse_params

ROOT = Path(__file__).resolve().parents[1]


def load_driver():
    spec = importlib.util.spec_from_file_location(
        "gpu_check_driver", ROOT / "scripts" / "gpu_check.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_cpu_dry_run_passes_every_stage_and_check(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    )
    proc = subprocess.run(
        [
            "bash",
            "scripts/gpu_check.sh",
            "--python",
            sys.executable,
            "--wheels",
            str(tmp_path / "no-wheels"),
            "--device",
            "cpu",
            "--target",
            "build",
            "--work",
            str(tmp_path / "work"),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["passed"] and report["failed"] == [] and report["environment"]["device"] == "cpu"
    stages = {s["name"]: s for s in report["stages"]}
    expected = [
        "target",
        "prepare@sharegpt_sample",
        "prepare@messages_sample",
        "prepare@chitchat_sample",
        "prepare@chitchat_more",  # the eval set (evaluate.sets)
        "mix",
        "tokenize",
        "vocab",
        "hidden_states",
        "train",
        "evaluate",
        "benchmark",
        "train_speculators",
        "hidden_states_fp8",
        "train_fp8",
        "hidden_states_online",
        "train_online",
    ]
    assert list(stages) == expected
    assert all(
        s["status"] == "ok" and s["seconds"] > 0
        for name, s in stages.items()
        if name != "train_speculators"
    )
    assert (
        stages["train_speculators"]["status"] == "skipped"
        and "CUDA" in stages["train_speculators"]["reason"]
    )
    assert (
        stages["hidden_states_fp8"]["format"] == "fp8"
        and stages["train_fp8"]["hidden_states"] == "fp8"
    )
    assert (
        stages["hidden_states_online"]["mode"]
        == stages["train_online"]["hidden_states_mode"]
        == "online"
    )
    assert stages["hidden_states"]["tokens_per_s"] > 0 and stages["train"]["tokens_per_s"] > 0
    evaluated = stages["evaluate"]
    assert 1.0 <= evaluated["acceptance_length"] <= 4.0
    # bf16: each prompt equal to greedy, or excused at a near-tie flip (within the share allowed)
    assert evaluated["lossless_checked_prompts"] + evaluated["near_tie_divergences"] == 3
    assert evaluated["near_tie_share"] == round(evaluated["near_tie_divergences"] / 3, 4)
    bench = stages["benchmark"]
    assert (
        bench["baseline_tokens_per_s"] > 0
        and bench["speculative_tokens_per_s"] > 0
        and bench["speedup"] > 0
    )
    checks = {c["name"]: c for c in report["checks"]}
    assert set(checks) == {
        "last_state_reproduces_target_argmax",
        "draft_loads_with_from_pretrained",
        "speculative_equals_greedy",
        "last_state_reproduces_target_argmax_fp8",
        "draft_loads_with_from_pretrained_fp8",
        "draft_loads_with_from_pretrained_online",
        "methods_train_and_load",
    }
    assert all(c["passed"] for c in checks.values())
    methods = checks["methods_train_and_load"]["methods"]
    assert {m: methods[m]["loaded_class"] for m in methods} == {
        "peagle": "PEagleDraftModel",
        "dflash": "DFlashDraftModel",
    }
    assert checks["last_state_reproduces_target_argmax"]["positions"] > 0
    assert checks["last_state_reproduces_target_argmax_fp8"]["stored_dtype"] == "float8_e4m3fn"
    assert report["regenerated_stand_in"]["conversations"] == 40
    assert report["summary"]["acceptance_length"] == stages["evaluate"]["acceptance_length"]
    assert report["summary"]["speedup"] == bench["speedup"]


def test_a_failing_stage_is_recorded_and_the_rest_go_on(tmp_path):
    """A stage that fails leaves its first error in the JSON; what needs its output is skipped, not run."""
    driver = load_driver()
    work = tmp_path / "work"
    (work / "logs").mkdir(parents=True)
    (work / "params.yaml").write_text("vocab:\n  draft_vocab_size: 1\n")  # invalid: at least 2
    stage = driver.Stage("vocab", ["stages.vocab", "card.json", "freq.pt", "vocab", "vocab.json"])
    record = driver.run_stage(
        stage, work, dict(os.environ, PYTHONPATH=str(ROOT)), 120, work / "logs"
    )
    assert record["status"] == "failed" and record["exit_code"] != 0
    assert (
        record["error"].startswith("error: invalid params.yaml") and Path(record["log"]).is_file()
    )


def test_a_stage_past_its_limit_is_stopped_and_recorded(tmp_path):
    driver = load_driver()
    stage = driver.Stage("slow", ["timeit", "-n", "1", "import time; time.sleep(60)"])
    record = driver.run_stage(stage, tmp_path, dict(os.environ), 1, tmp_path)
    assert (
        record["status"] == "failed"
        and record["error"] == "timed out after 1 s"
        and record["exit_code"] is None
    )


def test_first_error_names_the_stage_message_and_the_first_exception():
    driver = load_driver()
    assert driver.first_error("loading\nerror: no rows in x\n") == "error: no rows in x"
    log = 'step 1\nTraceback (most recent call last):\n  File "a.py", line 1\n    f()\nRuntimeError: CUDA out of memory\n'
    assert driver.first_error(log) == "RuntimeError: CUDA out of memory"
    torchrun = (
        '[rank0]: Traceback (most recent call last):\n[rank0]:   File "t.py", line 3\n'
        "[rank0]: ValueError: bad --total-seq-len\nE1201 failed (exitcode: 1)\nerror: speculators train failed\n"
    )
    assert (
        driver.first_error(torchrun)
        == "error: speculators train failed (first exception: ValueError: bad --total-seq-len)"
    )
    assert driver.first_error("") == "no output"


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_check_params_validate(device):
    """The overrides of each device, and of the speculators hand-off, are params the stages accept."""
    driver = load_driver()
    params = driver.check_params(ROOT, device)
    parsed = parse_params(params)
    assert parsed.train.device == parsed.hidden_states.device == parsed.evaluate.device == device
    for _name, (overrides, _) in driver.VARIANTS.items():
        variant = driver.copy.deepcopy(params)
        for key, value in overrides.items():
            driver.set_key(variant, key, value)
        parse_params(variant)
    assert parse_params(variant).hidden_states.mode == "online"
    assert all(Path(spec["path"]).is_absolute() for spec in params["datasets"].values())


def test_wheel_list_pins_what_pyproject_pins():
    """Where scripts/gpu_requirements.txt and pyproject.toml name the same distribution, the versions agree."""

    def pins(text: str) -> dict[str, str]:
        found = re.findall(
            r"^\s*\"?([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^\s\",;#]+)", text, flags=re.M
        )
        return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in found}

    ours = pins((ROOT / "scripts" / "gpu_requirements.txt").read_text())
    project = pins((ROOT / "pyproject.toml").read_text())
    for name, version in re.findall(
        r"([A-Za-z0-9_.\-]+)==([\w.]+)", (ROOT / "Makefile").read_text()
    ):
        project[re.sub(r"[-_.]+", "-", name).lower()] = (
            version  # speculators, hs-connectors: make setup
        )
    assert {"speculators", "hs-connectors", "datasets", "dvclive"} <= set(ours)
    assert not {"torch", "transformers", "triton", "safetensors", "pyarrow"} & set(
        ours
    )  # the GPU host has them
    assert {name: v for name, v in ours.items() if project.get(name, v) != v} == {}


def test_each_variant_sees_the_inputs_of_the_work_directory(tmp_path):
    """The card names the target "models/target", relative to the work directory: each variant's
    stages (and, for the speculators hand-off, torchrun's workers), run from the variant's own
    directory, see the same target, vocabulary and data, and write their own outputs."""
    driver = load_driver()
    work = tmp_path / "work"
    driver.prepare_work(work, ROOT, "cpu", "build")
    for rel in ("models/target", "models/vocab", "datasets/tokenized", "datasets/hidden_states"):
        (work / rel).mkdir(parents=True)
    for name, (_, links) in driver.VARIANTS.items():
        for rel in links:
            assert (work / name / rel).resolve() == (work / rel).resolve()
        assert not (work / name / "models" / "draft").exists()
    assert not (
        work / "fp8" / "datasets" / "hidden_states"
    ).exists()  # its own, written by its hidden_states stage
    stages = {s.name: s for s in driver.pipeline(["a"])}
    for name in ("train_speculators", "train_fp8", "train_online"):
        assert stages[name].argv == stages["train"].argv and stages[name].cwd == name.removeprefix(
            "train_"
        )


def test_the_stages_run_with_dvc_yaml_s_own_commands(tmp_path):
    """The check has no copy of the stages' command lines: each comes from dvc.yaml, so a
    changed command there is the command the check runs."""
    driver = load_driver()
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    stages = {s.name: s for s in driver.pipeline(["a"])}
    assert "python -m " + " ".join(stages["tokenize"].argv) == spec["tokenize"]["cmd"]
    assert stages["prepare@a"].argv[:2] == ["stages.prepare", "a"]
    assert stages["vocab"].needs == ["models/target/card.json", "datasets/tokenized/token_freq.pt"]
    spec["vocab"]["cmd"] += " --extra"
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": spec}))
    changed = {s.name: s for s in driver.pipeline(["a"], tmp_path)}
    assert changed["vocab"].argv == [*stages["vocab"].argv, "--extra"]
