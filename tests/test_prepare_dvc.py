"""prepare@<name> under DVC, in a copy of the repo: one dataset's params change reruns only its prepare
stage and what follows; prepare stages run in parallel (`dvc --wait-for-lock repro -s`); a hub id
needs no file; datasets/sources.yaml stays in sync with params.yaml. Runs prepare and mix only."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ENV = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT)}
STAGES = ["prepare@sharegpt_sample", "prepare@messages_sample", "mix"]


def run(cmd: list[str], cwd: Path, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True)
    if ok:
        assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def ran(proc: subprocess.CompletedProcess) -> set[str]:
    return {line.split("'")[1] for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("Running stage")}


def edit_params(repo: Path, edit) -> None:
    params = yaml.safe_load((repo / "params.yaml").read_text())
    edit(params)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


@pytest.fixture()
def repo(tmp_path) -> Path:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    for rel in files:
        if (ROOT / rel).is_file():
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, tmp_path / rel)
    run(["git", "init", "-q"], tmp_path)
    return tmp_path


def test_sources_file_is_in_sync_with_params(tmp_path):
    """datasets/sources.yaml as committed is what --write-sources makes of params.yaml."""
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    run([sys.executable, "-P", str(ROOT / "stages/prepare.py"), "--write-sources", "sources.yaml"], tmp_path)
    assert (tmp_path / "sources.yaml").read_text() == (ROOT / "datasets/sources.yaml").read_text()


def test_one_dataset_change_reruns_only_its_prepare_and_mix(repo):
    dvc = str(BIN / "dvc")
    assert ran(run([dvc, "repro", "mix"], repo)) == set(STAGES)
    assert json.loads(run([dvc, "status", "--json", *STAGES], repo).stdout) == {}

    edit_params(repo, lambda p: p["datasets"]["sharegpt_sample"].update(max_rows=400))
    status = json.loads(run([dvc, "status", "--json", *STAGES], repo).stdout)
    assert set(status) == {"prepare@sharegpt_sample"}  # the foreach params key is datasets.<name>
    assert "datasets.sharegpt_sample" in json.dumps(status)
    assert ran(run([dvc, "repro", "mix"], repo)) == {"prepare@sharegpt_sample", "mix"}
    assert json.loads((repo / "reports/prepare/sharegpt_sample.json").read_text())["rows_read"] == 400

    # Fan-out: both prepare stages at once, each waiting for the repo lock when the other holds it.
    edit_params(repo, lambda p: [p["datasets"][n].update(max_rows=300) for n in ("sharegpt_sample", "messages_sample")])
    procs = [subprocess.Popen([dvc, "--wait-for-lock", "repro", "-s", stage], cwd=repo, env=ENV, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for stage in STAGES[:2]]
    outputs = [p.communicate()[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert json.loads(run([dvc, "status", "--json", *STAGES[:2]], repo).stdout) == {}

    # A hub dataset id is no file: its stage depends on stages/prepare.py, and its params pin it.
    edit_params(repo, lambda p: (p["datasets"].update(hub_chat={"preset": "ultrachat_200k", "revision": "8049631c"}),
                                 p["mix"]["weights"].update(hub_chat=0.0)))
    stale = run([dvc, "status", "--json", "prepare@hub_chat"], repo, ok=False)
    assert stale.returncode != 0 and "source_dep" in stale.stderr  # sources.yaml not regenerated yet
    run([sys.executable, "-m", "stages.prepare", "--write-sources", "datasets/sources.yaml"], repo)
    status = json.loads(run([dvc, "status", "--json", "prepare@hub_chat"], repo).stdout)
    deps = next(entry["changed deps"] for entry in status["prepare@hub_chat"] if "changed deps" in entry)
    code = {d for d in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["prepare"]["do"]["deps"] if "$" not in d}
    assert set(deps) == code | {"params.yaml"}, deps  # its code (the source dep is stages/prepare.py) and params
    assert json.loads(run([dvc, "status", "--json", *STAGES[:2]], repo).stdout) == {}  # the others untouched


TINY_TARGET = {"layers": 4, "hidden_size": 32, "heads": 2, "kv_heads": 1, "intermediate_size": 64, "vocab_size": 256,
               "corpus_conversations": 100, "train_steps": 1, "batch_size": 4, "seq_len": 64}


def test_a_failed_run_leaves_only_the_failed_stage_stale_and_outputs_ignored(repo):
    """A regenerate that fails (its endpoint is unreachable) after a dataset was added: DVC undoes the
    .gitignore lines it wrote during a failed run, so a prepared file must be ignored by a committed
    pattern, and `mix`, which depends on datasets/prepared as a directory, must not go stale."""
    dvc = str(BIN / "dvc")

    def small(p):
        p["samples"], p["mix"]["eval_samples"] = 40, 6
        p["target"]["tiny"].update(TINY_TARGET)
        p["target"]["aux_layer_ids"] = [1, 2, 3]
        p["regenerate"].update(backend="external", endpoints=["http://127.0.0.1:9"], external_engine="vllm", max_retries=0)

    edit_params(repo, small)
    run(["git", "add", "-A"], repo)
    run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "copy"], repo)
    failed = run([dvc, "repro"], repo, ok=False)
    assert failed.returncode != 0 and "preflight refused the endpoint" in failed.stderr, failed.stderr[-2000:]

    # a new dataset, then the same failure
    (repo / "datasets/extra.jsonl").write_text("".join(
        json.dumps({"id": f"x{i}", "conversations": [{"from": "human", "value": f"Extra question number {i}?"},
                                                     {"from": "gpt", "value": "An answer."}]}) + "\n" for i in range(30)))
    edit_params(repo, lambda p: (p["datasets"].update(extra={"path": "datasets/extra.jsonl", "format": "sharegpt"}),
                                 p["mix"]["weights"].update(extra=0.2)))
    run([sys.executable, "-m", "stages.prepare", "--write-sources", "datasets/sources.yaml"], repo)
    failed = run([dvc, "repro"], repo, ok=False)
    assert failed.returncode != 0 and "Running stage 'prepare@extra'" in failed.stdout + failed.stderr
    assert (repo / "datasets/prepared/extra.jsonl").is_file()

    # untracked: only what git should track (the new source, the stage's report), no DVC output
    untracked = {line[3:] for line in run(["git", "status", "--porcelain", "--untracked-files=all"], repo).stdout.splitlines()
                 if line.startswith("??")}
    assert untracked == {"datasets/extra.jsonl", "reports/prepare/extra.json"}, untracked
    run(["git", "check-ignore", "-q", "datasets/prepared/extra.jsonl"], repo)
    stale = set(json.loads(run([dvc, "status", "--json"], repo).stdout))
    assert stale == {"regenerate", "tokenize", "vocab", "hidden_states", "train", "evaluate", "benchmark"}, stale
