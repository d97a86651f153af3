"""The disk plan's DVC share (draftline/hidden_states/plan.py): the cache and hashing costs, by formula, and the
plan printed at the seeds' figures (100k conversations of ~4k tokens, H = 7168) from the
committed hashing measurement (reports/overhead/dvc_hashing.json)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftline.hidden_states.plan import (
    PlanSettings,
    add_dvc,
    dvc_costs,
    hashing_rates,
    hours,
    make_plan,
)

ROOT = Path(__file__).resolve().parents[2]
RATES = {"hash_gbps": 0.25, "copy_gbps": 0.8, "unprotect_gbps": 0.9, "from": "a test"}
TB = 10**12


def test_hours_is_bytes_over_the_rate():
    assert hours(TB, 0.25) == pytest.approx(1e12 / 0.25e9 / 3600)  # 1.11 h per TB at 0.25 GB/s
    assert hours(TB, None) is None


def test_dvc_costs_per_link_type():
    n = 23 * TB
    copy = dvc_costs(n, "copy", RATES)
    assert copy["cache_bytes"] == n and copy["rerun_copy_bytes"] == 0 and copy["rerun_hours"] == 0
    assert copy["hash_hours"] == pytest.approx(n / 0.25e9 / 3600)
    assert copy["copy_hours"] == pytest.approx(n / 0.8e9 / 3600)
    reflink = dvc_costs(n, "reflink", RATES)
    assert reflink["cache_bytes"] == 0 and reflink["copy_hours"] == 0
    assert reflink["hash_hours"] == copy["hash_hours"]  # every new byte hashed once, any link
    for link in ("hardlink", "symlink"):  # stored once, copied back and hashed again each rerun
        linked = dvc_costs(n, link, RATES)
        assert linked["cache_bytes"] == 0 and linked["rerun_copy_bytes"] == n
        assert linked["rerun_hours"] == pytest.approx(n / 0.9e9 / 3600 + n / 0.25e9 / 3600)
    assert dvc_costs(n, "hardlink", {})["rerun_hours"] is None  # no measured rate


def test_add_dvc_counts_the_cache_against_the_free_disk():
    plan = make_plan(100_000 * 4000, 100_000, 7168, PlanSettings(margin=1.1), free=30 * TB)
    bf16 = plan["modes"]["offline_bf16"]["total_bytes"]
    assert plan["modes"]["offline_bf16"]["fits"]  # the states alone fit in 30 TB
    dvc = add_dvc(plan, ["reflink", "copy"], "copy", RATES)["dvc"]
    assert dvc["modes"]["offline_bf16"]["disk_bytes"] == 2 * bf16
    assert not dvc["modes"]["offline_bf16"]["fits"]  # with the cache's copy they do not
    assert dvc["hash_hours_per_tb"] == pytest.approx(1e12 / 0.25e9 / 3600)
    reflinked = add_dvc(plan, ["reflink", "copy"], "reflink", RATES)["dvc"]["modes"]
    assert reflinked["offline_bf16"]["disk_bytes"] == bf16 and reflinked["offline_bf16"]["fits"]


def seeds_plan(cache_type: str, *extra: str) -> str:
    """`draftline plan` at the seeds' figures, 30 TB free, planned for cache_type."""
    cmd = [
        sys.executable,
        "-m",
        "draftline.tools.plan",
        "--hidden-size",
        "7168",
        "--samples",
        "100000",
    ]
    cmd += ["--tokens-per-sample", "4000", "--free-gb", "30000", "--cache-type", cache_type, *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout


def test_plan_prints_the_cache_and_hashing_at_the_seeds_figures():
    plan = json.loads(seeds_plan("reflink,copy", "--json"))
    rates = hashing_rates(ROOT / "reports/overhead/dvc_hashing.json")  # the committed measurement
    bf16 = plan["modes"]["offline_bf16"]["total_bytes"]
    assert bf16 == 400_000_000 * 57352  # 22.9 TB
    dvc = plan["dvc"]
    assert dvc["link"] == "reflink" and dvc["modes"]["offline_bf16"]["cache_bytes"] == 0
    assert dvc["hash_gbps"] == rates["hash_gbps"] > 0
    assert dvc["modes"]["offline_bf16"]["hash_hours"] == pytest.approx(
        bf16 / (rates["hash_gbps"] * 1e9) / 3600
    )
    table = seeds_plan("copy")  # an ext4 host
    assert "-> copy here" in table and "| offline bf16 | 22.9 TB | 45.9 TB | no |" in table
    hours_bf16 = bf16 / (rates["hash_gbps"] * 1e9) / 3600
    assert f"| {hours_bf16:,.1f} h |" in table
    assert f"{1e12 / (rates['hash_gbps'] * 1e9) / 3600:.2f} h per TB" in table


def test_the_length_plan_names_what_cuts_rows_and_what_stays_untrained():
    from draftline.hidden_states.plan import length_plan, render_length

    plan = length_plan(8192, 2048, 4096, 4096, longest_before_cut=300)
    assert plan["trained_positions"] == 2048
    text = "\n".join(render_length(plan))
    assert "raise train.pack_len to at least 8192" in text
    assert "the draft's 4096 positions" in text
    assert "positions past 2,048 are untrained" in text
    assert "no row reaches tokenize.max_length 8192" in text
    # settings that train every position the target serves, on rows that reach the cut: nothing
    whole = length_plan(4096, 4096, 4096, 4096, longest_before_cut=9000)
    assert whole["findings"] == [] and whole["trained_positions"] == 4096


def test_plan_at_another_max_length_reestimates_from_the_prompts(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"messages": [{"role": "user", "content": "x" * 40000}], "tools": None}) + "\n"
    )
    cmd = [sys.executable, "-m", "draftline.tools.plan", "--hidden-size", "64", "--free-gb", "1",
           "--cache-type", "copy", "--prompts", str(prompts), "--tokenized", str(tmp_path / "none"),
           "--tokenize-report", str(tmp_path / "none.json"), "--json"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}

    def plan(*extra):
        done = subprocess.run([*cmd, *extra], cwd=ROOT, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    short, long = plan(), plan("--max-length", "8192")
    # 10,000 tokens of prompt: cut at the params' tokenize.max_length, then at 8,192
    assert long["tokens"] == 8192 > short["tokens"]
    assert long["length"]["max_length"] == 8192
    assert any("raise train.pack_len" in f for f in long["length"]["findings"])
