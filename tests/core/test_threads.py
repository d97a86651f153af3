"""The CPU thread policy (draftline/core/threads.py): per-stage counts, explicit settings win, and a
stage's process really runs with the passive wait policy and its count."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftline.core.threads import STAGE_THREADS, resolve_threads

ROOT = Path(__file__).resolve().parents[2]


def test_stage_counts_follow_the_table_and_the_cores():
    assert resolve_threads("evaluate", {}, cores=2) == (1, "stage policy (at most 1)")
    assert resolve_threads("train", {}, cores=2) == (2, "stage policy (all cores)")
    assert resolve_threads("hidden_states", {}, cores=2)[0] == 2
    assert resolve_threads("hidden_states", {}, cores=16)[0] == 16
    assert resolve_threads("target", {}, cores=1)[0] == 1


def test_explicit_environment_wins():
    assert resolve_threads("train", {"OMP_NUM_THREADS": "4"}, cores=2) == (4, "OMP_NUM_THREADS")
    assert (
        resolve_threads(
            "hidden_states", {"DRAFTLINE_THREADS": "3", "OMP_NUM_THREADS": "1"}, cores=8
        )[0]
        == 3
    )


@pytest.mark.parametrize("value", ["0", "two"])
def test_bad_thread_settings_name_the_variable(value):
    with pytest.raises(ValueError, match="DRAFTLINE_THREADS"):
        resolve_threads("train", {"DRAFTLINE_THREADS": value})


def test_every_stage_module_has_a_policy_and_applies_it_before_torch():
    stages = {p.stem for p in (ROOT / "stages").glob("*.py") if p.stem != "__init__"}
    assert stages == set(STAGE_THREADS)
    for stage in stages:
        text = (ROOT / "stages" / f"{stage}.py").read_text()
        assert f'apply_thread_policy("{stage}")' in text, stage


def test_a_stage_process_gets_the_passive_wait_policy_and_its_count():
    code = (
        "from draftline.core.threads import apply_thread_policy; import json, os; s = apply_thread_policy('hidden_states'); "
        "import torch; print(json.dumps([s, os.environ['OMP_WAIT_POLICY'], torch.get_num_threads()]))"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "DRAFTLINE_THREADS")
    }
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    policy, wait, torch_threads = json.loads(out)
    assert wait == "PASSIVE" and not policy["torch_loaded_before"]
    assert torch_threads == policy["threads"] == len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    "config,threads", [("policy", len(os.sched_getaffinity(0))), ("passive_one_thread", 1)]
)
def test_cpu_load_worker_runs_the_train_step_under_each_configuration(config, threads):
    """overhead/cpu_load.py's worker: one real draft training step, in a process whose torch has
    the configuration's thread count (`policy` = the stage's: train uses every core)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "DRAFTLINE_THREADS")
    }
    args = ["--worker", "train", "--steps", "1", "--config", config]
    out = subprocess.run(
        [sys.executable, str(ROOT / "overhead" / "cpu_load.py"), *args],
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["torch_threads"] == threads and result["seconds"] > 0


def test_cpu_load_refuses_an_unknown_configuration():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "overhead" / "cpu_load.py"), "--configs", "one_thread"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "invalid choice: 'one_thread'" in proc.stderr
