"""prepare@<name> under DVC, in a copy of the repo: one dataset's params change reruns only its prepare
stage and what follows; prepare stages run in parallel (`dvc --wait-for-lock repro -s`); a hub id
needs no file; datasets/sources.yaml stays in sync with params.yaml; a params mistake is stopped by
the check_params stage before DVC touches any output. Runs check_params, prepare and mix only."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ENV = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT)}
PREPARES = [
    "prepare@sharegpt_sample",
    "prepare@messages_sample",
    "prepare@chitchat_sample",
    "prepare@chitchat_more",  # an eval set (evaluate.sets)
]
STAGES = [*PREPARES, "mix"]


def run(cmd: list[str], cwd: Path, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True)
    if ok:
        assert proc.returncode == 0, (
            f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def ran(proc: subprocess.CompletedProcess) -> set[str]:
    return {
        line.split("'")[1]
        for line in (proc.stdout + proc.stderr).splitlines()
        if line.startswith("Running stage")
    }


def edit_params(repo: Path, edit) -> None:
    params = yaml.safe_load((repo / "params.yaml").read_text())
    edit(params)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


@pytest.fixture()
def repo(tmp_path) -> Path:
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for rel in files:
        if (ROOT / rel).is_file():
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, tmp_path / rel)
    run(["git", "init", "-q"], tmp_path)
    return tmp_path


def test_sources_file_is_in_sync_with_params(tmp_path):
    """datasets/sources.yaml as committed is what --write-sources makes of params.yaml."""
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    run(
        [sys.executable, "-P", str(ROOT / "stages/prepare.py"), "--write-sources", "sources.yaml"],
        tmp_path,
    )
    assert (tmp_path / "sources.yaml").read_text() == (ROOT / "datasets/sources.yaml").read_text()


def spelled(i: int) -> str:
    return " ".join(
        "zero one two three four five six seven eight nine".split()[int(d)] for d in str(i)
    )


def test_one_dataset_change_reruns_only_its_prepare_and_mix(repo):
    dvc = str(BIN / "dvc")
    # the datasets cut to 300 rows below supply 200 train prompts at the weights, twins held out
    edit_params(repo, lambda p: p.update(samples=200))
    # check_params runs first unless the committed dvc.lock already holds these params
    assert ran(run([dvc, "repro", "mix"], repo)) - {"check_params"} == set(STAGES)
    assert json.loads(run([dvc, "status", "--json", *STAGES], repo).stdout) == {}

    edit_params(repo, lambda p: p["datasets"]["sharegpt_sample"].update(max_rows=400))
    status = json.loads(run([dvc, "status", "--json", *STAGES], repo).stdout)
    assert set(status) == {"prepare@sharegpt_sample"}  # the foreach params key is datasets.<name>
    assert "datasets.sharegpt_sample" in json.dumps(status)
    assert ran(run([dvc, "repro", "mix"], repo)) == {
        "check_params",
        "prepare@sharegpt_sample",
        "mix",
    }
    assert (
        json.loads((repo / "reports/prepare/sharegpt_sample.json").read_text())["rows_read"] == 400
    )

    # Fan-out: every prepare stage at once, each waiting for the repo lock when another holds it.
    edit_params(
        repo,
        lambda p: [
            p["datasets"][n].update(max_rows=300)
            for n in ("sharegpt_sample", "messages_sample", "chitchat_sample")
        ],
    )
    procs = [
        subprocess.Popen(
            [dvc, "--wait-for-lock", "repro", "-s", stage],
            cwd=repo,
            env=ENV,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for stage in PREPARES
    ]
    outputs = [p.communicate()[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * len(PREPARES), outputs
    assert json.loads(run([dvc, "status", "--json", *PREPARES], repo).stdout) == {}

    # A hub dataset id is no file: its stage depends on its code fingerprint, and its params pin it.
    edit_params(
        repo,
        lambda p: (
            p["datasets"].update(hub_chat={"preset": "ultrachat_200k", "revision": "8049631c"}),
            p["mix"]["weights"].update(hub_chat=0.0),
        ),
    )
    stale = run([dvc, "status", "--json", "prepare@hub_chat"], repo, ok=False)
    assert (
        stale.returncode != 0 and "source_dep" in stale.stderr
    )  # sources.yaml not regenerated yet
    run([sys.executable, "-m", "stages.prepare", "--write-sources", "datasets/sources.yaml"], repo)
    status = json.loads(run([dvc, "status", "--json", "prepare@hub_chat"], repo).stdout)
    deps = next(
        entry["changed deps"] for entry in status["prepare@hub_chat"] if "changed deps" in entry
    )
    code = {
        d
        for d in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["prepare"]["do"]["deps"]
        if "$" not in d
    }
    assert set(deps) == code | {"params.yaml"}, (
        deps
    )  # its code (the source dep is reports/code/prepare.json) and params
    assert (
        json.loads(run([dvc, "status", "--json", *PREPARES], repo).stdout) == {}
    )  # the others untouched


def stamps(repo: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every stage output of the subset: what a removal or rewrite would change."""
    files = [
        *(repo / "datasets/prepared").glob("*.jsonl"),
        *(repo / "datasets/prompts").glob("*"),
        *(repo / "reports/prepare").glob("*.json"),
        repo / "reports/mix.json",
        repo / "reports/params_check.txt",
    ]
    return {str(f.relative_to(repo)): (f.stat().st_size, f.stat().st_mtime_ns) for f in files}


TYPOS = [  # (section, a typo in it, the key the error must name)
    (
        "samples",
        lambda p: p.update(sampels=600),
        "sampels",
    ),  # a key no stage tracks: only check_params sees it
    ("target", lambda p: p["target"]["tiny"].update(layers=2), "target.tiny.layers"),
    (
        "datasets",
        lambda p: p["datasets"]["sharegpt_sample"].update(max_rowz=400),
        "datasets.sharegpt_sample.max_rowz",
    ),
    ("mix", lambda p: p["mix"].update(eval_samples=-1), "mix.eval_samples"),
    ("regenerate", lambda p: p["regenerate"].update(max_token=64), "regenerate.max_token"),
    ("tokenize", lambda p: p["tokenize"].update(max_length="long"), "tokenize.max_length"),
    ("vocab", lambda p: p["vocab"].update(draft_vocab_sise=256), "vocab.draft_vocab_sise"),
    ("hidden_states", lambda p: p["hidden_states"].update(dtype="bf16"), "hidden_states.dtype"),
    ("train", lambda p: p["train"].update(epocs=4), "train.epocs"),
    ("evaluate", lambda p: p["evaluate"].update(k=0), "evaluate.k"),
    ("benchmark", lambda p: p["benchmark"].update(engine="trt"), "benchmark.engine"),
]


def test_a_params_typo_then_its_fix_loses_nothing_and_reruns_nothing(repo):
    """Issue #16.3: DVC deletes a stage's non-persist outputs before its command runs, so a check
    inside the stage came too late (`datasets.sharegpt_sample.max_rowz` deleted the prepared file;
    `train.epocs` deleted models/draft). check_params runs first and refuses, naming the key, before any
    other stage, whatever the section; after the fix `dvc repro` reruns nothing that had finished."""
    dvc = str(BIN / "dvc")
    run([dvc, "repro", "mix"], repo)
    good = (repo / "params.yaml").read_text()
    before = stamps(repo)
    for section, typo, key in TYPOS:
        edit_params(repo, typo)
        failed = run([dvc, "repro", "mix"], repo, ok=False)
        assert failed.returncode != 0 and key in failed.stdout + failed.stderr, (
            section,
            failed.stderr[-2000:],
        )
        assert ran(failed) == {"check_params"}, section
        assert stamps(repo) == before, section  # every output in place, untouched
        (repo / "params.yaml").write_text(good)  # the fix
    assert (
        ran(run([dvc, "repro", "mix"], repo)) == set()
    )  # the fix restores what the last check passed
    edit_params(
        repo, lambda p: None
    )  # a valid edit that only reformats the file: the check reruns, alone
    assert ran(run([dvc, "repro", "mix"], repo)) == {"check_params"}
    assert (
        stamps(repo) == before
        and json.loads(run([dvc, "status", "--json", *STAGES], repo).stdout) == {}
    )


def test_check_params_refuses_what_dvc_would_find_out_too_late(tmp_path):
    """A stale datasets/sources.yaml or train.init pointing at the draft the run replaces."""
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    shutil.copytree(ROOT / "datasets/samples", tmp_path / "datasets/samples")
    shutil.copy(ROOT / "datasets/sources.yaml", tmp_path / "datasets/sources.yaml")
    check = [
        sys.executable,
        "-m",
        "stages.check_params",
        "datasets/sources.yaml",
        "models/draft",
        "ok.txt",
    ]
    assert run(check, tmp_path).returncode == 0 and (tmp_path / "ok.txt").read_text().startswith(
        "params.yaml is valid"
    )
    stamp = (tmp_path / "ok.txt").stat().st_mtime_ns
    edit_params(tmp_path, lambda p: p["datasets"]["sharegpt_sample"].update(path="elsewhere.jsonl"))
    proc = run(check, tmp_path, ok=False)
    assert (
        proc.returncode != 0
        and "datasets.sharegpt_sample" in proc.stderr
        and "--write-sources" in proc.stderr
    )
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    edit_params(tmp_path, lambda p: p["train"].update(init="models/draft"))
    proc = run(check, tmp_path, ok=False)
    assert proc.returncode != 0 and "train.init" in proc.stderr
    assert (tmp_path / "ok.txt").stat().st_mtime_ns == stamp  # same bytes, never rewritten


def test_check_params_names_a_missing_dataset_file_and_an_unreadable_init(tmp_path):
    """Bad inputs a user names fail in check_params, before any stage runs, naming the param, the
    path and what is wrong (no traceback): a dataset file that is not there (DVC itself would stop
    at prepare@<name> naming only the file; one a .dvc file tracks is left to `dvc pull`), a
    train.init whose config.json is cut short, one whose weights are."""
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    shutil.copytree(ROOT / "datasets/samples", tmp_path / "datasets/samples")
    shutil.copy(ROOT / "datasets/sources.yaml", tmp_path / "datasets/sources.yaml")
    check = [
        sys.executable,
        "-m",
        "stages.check_params",
        "datasets/sources.yaml",
        "draft",
        "ok.txt",
    ]
    chats = tmp_path / "datasets/samples/chitchat.jsonl"
    chats.rename(chats.with_suffix(".kept"))
    proc = run(check, tmp_path, ok=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert (
        "datasets.chitchat_sample.path: datasets/samples/chitchat.jsonl does not exist"
        in proc.stderr
    )
    (tmp_path / "datasets/samples/chitchat.jsonl.dvc").write_text("outs:\n- path: chitchat.jsonl\n")
    run(check, tmp_path)  # tracked by DVC: `dvc pull` (or `dvc repro --pull`) brings it
    chats.with_suffix(".kept").rename(chats)

    init = tmp_path / "init"
    init.mkdir()
    (init / "config.json").write_text('{"architectures": ["Eagle3Speculator"], "draft_vo')
    edit_params(tmp_path, lambda p: p["train"].update(init="init"))
    proc = run(check, tmp_path, ok=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "train.init: init/config.json is not valid JSON (Unterminated string" in proc.stderr
    (init / "config.json").write_text('{"architectures": ["Eagle3Speculator"]}')
    (init / "model.safetensors").write_bytes(b"\x40\x00\x00\x00\x00\x00\x00\x00{")
    proc = run(check, tmp_path, ok=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "train.init: init/model.safetensors cannot be read (SafetensorError" in proc.stderr
    assert not (tmp_path / "ok.txt").exists() or (tmp_path / "ok.txt").read_text().startswith(
        "params.yaml is valid"
    )


TINY_TARGET = {
    "layers": 4,
    "hidden_size": 32,
    "heads": 2,
    "kv_heads": 1,
    "intermediate_size": 64,
    "vocab_size": 256,
    "corpus_conversations": 100,
    "train_steps": 1,
    "batch_size": 4,
    "seq_len": 64,
}


def test_a_failed_run_leaves_only_the_failed_stage_stale_and_outputs_ignored(repo):
    """A regenerate that fails (its endpoint is unreachable) after a dataset was added: DVC undoes the
    .gitignore lines it wrote during a failed run, so a prepared file must be ignored by a committed
    pattern, and `mix`, which depends on datasets/prepared as a directory, must not go stale."""
    dvc = str(BIN / "dvc")

    def small(p):
        p["samples"], p["mix"]["eval_samples"] = 40, 6
        p["target"]["tiny"].update(TINY_TARGET)
        p["target"]["aux_layer_ids"] = [1, 2, 3]
        p["regenerate"].update(
            backend="external",
            endpoints=["http://127.0.0.1:9"],
            external_engine="vllm",
            max_retries=0,
        )

    edit_params(repo, small)
    run(["git", "add", "-A"], repo)
    run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "copy"], repo)
    failed = run([dvc, "repro"], repo, ok=False)
    assert failed.returncode != 0 and "preflight refused the endpoint" in failed.stderr, (
        failed.stderr[-2000:]
    )

    # a new dataset, then the same failure
    (repo / "datasets/extra.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "id": f"x{i}",
                    "conversations": [
                        # spelled out: numbered questions would all be template twins of
                        # the eval ones (mix.holdout), and the dataset would run out
                        {"from": "human", "value": f"Extra question {spelled(i)}?"},
                        {"from": "gpt", "value": "An answer."},
                    ],
                }
            )
            + "\n"
            for i in range(30)
        )
    )
    edit_params(
        repo,
        lambda p: (
            p["datasets"].update(extra={"path": "datasets/extra.jsonl", "format": "sharegpt"}),
            p["mix"]["weights"].update(extra=0.2),
        ),
    )
    run([sys.executable, "-m", "stages.prepare", "--write-sources", "datasets/sources.yaml"], repo)
    failed = run([dvc, "repro"], repo, ok=False)
    assert (
        failed.returncode != 0 and "Running stage 'prepare@extra'" in failed.stdout + failed.stderr
    )
    assert (repo / "datasets/prepared/extra.jsonl").is_file()

    # untracked: only what git should track (the new source, the stage's report), no DVC output
    untracked = {
        line[3:]
        for line in run(
            ["git", "status", "--porcelain", "--untracked-files=all"], repo
        ).stdout.splitlines()
        if line.startswith("??")
    }
    # (and the new stage's machine facts, draftline/core/machine.py: committed beside its report)
    assert untracked == {
        "datasets/extra.jsonl",
        "reports/prepare/extra.json",
        "reports/machine/prepare@extra.json",
    }, untracked
    run(["git", "check-ignore", "-q", "datasets/prepared/extra.jsonl"], repo)
    stale = set(json.loads(run([dvc, "status", "--json"], repo).stdout))
    assert stale == {
        "regenerate",
        "tokenize",
        "vocab",
        "hidden_states",
        "train",
        "evaluate@eval",
        "evaluate@dev",
        "benchmark",
    }, stale
