"""devtools/drafters.py reads each run from git (a commit or a DVC experiment's ref) and refuses
runs that did not share the budget."""

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from devtools.drafters import compare

BENCH = {
    "serve_concurrency": 4,
    "k": 3,
    "speedup": 1.2,
    "speedup_c1": 1.5,
    "speedup_c16": 1.0,
    "baseline_tokens_per_s": 60.0,
    "speculative_tokens_per_s": 72.0,
    "acceptance_length": 2.3,
    "lossless_share": 1.0,
    "pays_off": True,
}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def commit_run(repo: Path, train: dict, tau: float, speedup: float) -> str:
    """One run's params and reports as a commit; its sha."""
    params = {"samples": 500, "seed": 0, "train": train, "evaluate": {"k": 3}}
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    reports = repo / "reports"
    reports.mkdir(exist_ok=True)
    (reports / "train.json").write_text(json.dumps({"val_tau_sim": tau}))
    (reports / "acceptance.json").write_text(
        json.dumps({"acceptance_length": tau - 0.1, "engine": "vllm"})
    )
    (reports / "benchmark.json").write_text(json.dumps({**BENCH, "speedup": speedup}))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "run")
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path):
    git(tmp_path, "init", "-q")
    budget = {"epochs": 10, "lr": 0.003, "num_layers": 1, "pack_len": 512}
    base = commit_run(tmp_path, budget, 2.4, 1.28)
    peagle = commit_run(tmp_path, {**budget, "method": "peagle"}, 2.1, 1.1)
    dflash = commit_run(
        tmp_path, {**budget, "method": "dflash", "dflash": {"max_anchors": 64}}, 1.5, 0.8
    )
    other = commit_run(tmp_path, {**budget, "method": "dflash", "epochs": 3}, 1.2, 0.7)
    # DVC keeps an experiment as refs/exps/<baseline sha prefix>/<rest>/<name>
    for name, sha in (("base", base), ("p", peagle), ("d", dflash), ("short", other)):
        git(tmp_path, "update-ref", f"refs/exps/ab/cdef/{name}", sha)
    return tmp_path


def test_a_named_baseline_and_its_experiments_side_by_side(repo):
    report = compare("base", ["p", "d"], root=repo)
    assert list(report["methods"]) == ["eagle3", "peagle", "dflash"]
    assert report["params"]["samples"] == 500 and report["params"]["train"]["epochs"] == 10
    dflash = report["methods"]["dflash"]
    assert dflash["val_tau_sim"] == 1.5 and dflash["speedup"] == 0.8
    assert dflash["method_params"] == {"max_anchors": 64}
    assert report["methods"]["peagle"]["method_params"] == {}
    assert report["sources"] == {"baseline": "base", "experiments": ["p", "d"]}
    # a revision works as the baseline too (the committed run: HEAD)
    assert list(compare("HEAD~3", ["p"], root=repo)["methods"]) == ["eagle3", "peagle"]


def test_runs_on_another_budget_or_missing_are_refused(repo):
    with pytest.raises(SystemExit, match="differ in train.method only"):
        compare("base", ["short"], root=repo)
    with pytest.raises(SystemExit, match="no single experiment named 'nope'"):
        compare("base", ["nope"], root=repo)


def test_speculation_with_no_draft_gets_a_row_decided_as_a_drafts_is():
    from devtools.drafters import free_rows

    def load(speedup, low, high):
        return {"free_k": 2, "free_speedup": speedup, "free_low": low, "free_high": high}

    verdict = {
        "margin": 0.05,
        "free": {
            "methods": {
                "ngram": {
                    "by_load": {
                        "1": load(0.48, 0.42, 0.55),
                        "4": load(1.01, 0.97, 1.04),
                        "16": load(1.2, 1.1, 1.3),
                    }
                }
            }
        },
    }
    level = {"free": {"ngram": {"acceptance_length": 1.38, "passes": 12}}}
    row = free_rows(verdict, level, 4)["ngram"]
    assert row["free"] and row["val_tau_sim"] is None
    assert (row["decision"], row["k"], row["speedup"]) == ("no_gain", 2, 1.01)
    assert (row["speedup_c1"], row["low_c16"]) == (0.48, 1.1)
    assert row["served_acceptance_length"] == 1.38 and row["passes"] == 12
    verdict["free"]["methods"]["ngram"]["by_load"]["4"] = load(0.5, 0.44, 0.58)
    assert free_rows(verdict, level, 4)["ngram"]["decision"] == "no"
    assert free_rows({"margin": 0.05}, level, 4) == {}
