"""End to end: `dvc repro` of the embedded default in a copy of the repo, with a small override.

Checks every declared output and metric, that a second `dvc repro` does nothing, and that a
`train.*` change makes only `train` and the stages after it stale.
"""

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

# Small enough for a couple of CPU minutes, large enough that the draft still learns something.
OVERRIDE = {
    "samples": 160,
    "target.tiny.train_steps": 250,
    "target.tiny.corpus_conversations": 3000,
    "mix.eval_samples": 6,
    "regenerate.max_tokens": 64,
    "train.epochs": 2,
    "evaluate.max_new_tokens": 32,
    "benchmark.prompts": 3,
    "benchmark.repeats": 1,
    "benchmark.warmup": 0,
    "benchmark.max_new_tokens": 32,
}

pytestmark = pytest.mark.e2e


def set_key(params: dict, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    for p in parents:
        params = params[p]
    params[leaf] = value


def run(cmd: list[str], cwd: Path) -> str:
    env = dict(os.environ, PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("repo")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for rel in files:
        if (ROOT / rel).is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dst / rel)
    params = yaml.safe_load((dst / "params.yaml").read_text())
    for key, value in OVERRIDE.items():
        set_key(params, key, value)
    (dst / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(["git", "init", "-q"], dst)
    run(["git", "add", "-A"], dst)
    run(["git", "-c", "user.email=ci@example.com", "-c", "user.name=ci", "commit", "-qm", "copy"], dst)
    run(["dvc", "repro"], dst)
    return dst


def test_outputs_and_metrics(repo):
    card = json.loads((repo / "models/target/card.json").read_text())
    assert card["num_layers"] == 6 and card["aux_layer_ids"] == [1, 3, 4]
    assert card["tiny_training"]["final_train_loss"] < 2.0
    for name in ("sharegpt_sample", "messages_sample"):
        assert (repo / f"datasets/prepared/{name}.jsonl").stat().st_size > 0
    train_prompts = (repo / "datasets/prompts/train.jsonl").read_text().splitlines()
    assert len(train_prompts) == 160
    regenerated = (repo / "datasets/regenerated/conversations.jsonl").read_text().splitlines()
    assert len(regenerated) == 160
    assert {json.loads(l)["id"] for l in regenerated} == {json.loads(l)["id"] for l in train_prompts}
    assert (repo / "datasets/tokenized/token_freq.pt").exists()
    assert (repo / "models/vocab/d2t.npy").exists() and (repo / "models/vocab/t2d.npy").exists()
    tokenized_rows = json.loads((repo / "reports/tokenize.json").read_text())["conversations"]
    assert len(list((repo / "datasets/hidden_states").glob("hs_*.safetensors"))) == tokenized_rows
    assert (repo / "models/draft/config.json").exists()

    metrics = json.loads(run(["dvc", "metrics", "show", "--json"], repo))
    acceptance = json.loads((repo / "reports/acceptance.json").read_text())
    bench = json.loads((repo / "reports/benchmark.json").read_text())
    assert acceptance["acceptance_length"] >= 1.0 and acceptance["lossless_checked_prompts"] == 6
    assert bench["baseline"]["tokens_per_s"] > 0 and bench["speculative"]["tokens_per_s"] > 0
    assert bench["outputs_identical"] is True
    assert "reports/acceptance.json" in json.dumps(metrics)


def test_second_repro_is_a_noop(repo):
    out = run(["dvc", "repro"], repo)
    assert "Running stage" not in out


def test_train_param_change_stales_only_train_and_after(repo):
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"]["lr"] = params["train"]["lr"] / 2
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    status = json.loads(run(["dvc", "status", "--json"], repo))
    assert "train" in status and set(status) <= {"train", "evaluate", "benchmark"}
    out = run(["dvc", "repro"], repo)
    ran = {line.split("'")[1] for line in out.splitlines() if line.startswith("Running stage")}
    assert ran == {"train", "evaluate", "benchmark"}
