"""The project's DVC cache type (.dvc/config) on a persist output written as our stages write theirs:
hidden-state files renamed in from a temp name, one per row, a killed run resumed by adding files
(hidden_states), and a log appended in place (regenerate's conversations.jsonl). A throwaway
git+DVC repo per test; a few 1 MiB files.

With the project's reflink,copy the cache stays consistent through kill, resume and growth, and on
a filesystem without reflink it holds a second copy of every byte, as the plan counts it. Hardlinks
store each byte once but DVC copies every committed file back before each rerun of the stage, and
a write outside `dvc repro` goes into the cache itself: why the project does not use them."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftline.hidden_states.plan import dvc_cache_types, dvc_costs, link_type

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

PRODUCER = """
import json, os, sys
out, n = sys.argv[1], int(open(sys.argv[2]).read())
stop = int(os.environ.get("STOP_AFTER", "-1"))  # a kill after that many new files
os.makedirs(out, exist_ok=True)
seen = os.environ.get("SEEN")  # the link count of each file found at start
if seen:
    found = {f: os.stat(os.path.join(out, f)).st_nlink for f in sorted(os.listdir(out))}
    open(seen, "w").write(json.dumps(found))
made = 0
for i in range(n):
    path = os.path.join(out, f"hs_{i}.safetensors")
    if os.path.exists(path):
        continue
    if made == stop:
        sys.exit(1)
    with open(path + ".tmp", "wb") as f:
        f.write(i.to_bytes(8, "little") + os.urandom((1 << 20) - 8))
    os.replace(path + ".tmp", path)
    made += 1
with open(os.path.join(out, "log.jsonl"), "a") as f:
    f.write(json.dumps({"rows": n}) + "\\n")
"""


def dvc(repo: Path, *args: str, env: dict | None = None, ok: bool = True):
    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", **(env or {})}
    proc = subprocess.run(["dvc", *args], cwd=repo, env=env, capture_output=True, text=True)
    if ok:
        assert proc.returncode == 0, f"dvc {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def make_repo(path: Path, cache_type: str) -> Path:
    path.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    dvc(path, "init", "-q")
    dvc(path, "config", "core.analytics", "false")
    dvc(path, "config", "cache.type", cache_type)
    (path / "produce.py").write_text(PRODUCER)
    (path / "rows").write_text("4")
    (path / "dvc.yaml").write_text(
        "stages:\n  hidden_states:\n    cmd: python produce.py hs rows\n"
        "    deps: [produce.py, rows]\n    outs:\n      - hs:\n          persist: true\n"
    )
    return path


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest()


def cache_objects(repo: Path) -> dict[str, Path]:
    root = repo / ".dvc" / "cache" / "files" / "md5"
    return {p.parent.name + p.name: p for p in root.glob("*/*") if not p.name.endswith(".dir")}


def assert_cache_consistent(repo: Path) -> None:
    """Every object in the cache still hashes to its name, and `dvc status` is clean."""
    objects = cache_objects(repo)
    assert objects and all(md5(p) == name for name, p in objects.items())
    assert "up to date" in dvc(repo, "status").stdout


def test_project_cache_type_is_never_a_link():
    assert dvc_cache_types(ROOT / ".dvc") == ["reflink", "copy"]


def test_persist_output_killed_resumed_and_grown_with_the_projects_cache_type(tmp_path):
    types = dvc_cache_types(ROOT / ".dvc")
    repo = make_repo(tmp_path / "repo", ",".join(types))
    killed = dvc(repo, "repro", env={"STOP_AFTER": "2"}, ok=False)
    assert killed.returncode != 0 and len(list((repo / "hs").glob("hs_*"))) == 2  # persist kept
    dvc(repo, "repro")  # the resume: only the 2 missing files are written
    before = {p.name: p.stat().st_ino for p in (repo / "hs").iterdir()}
    (repo / "rows").write_text("6")
    dvc(repo, "repro")  # grown: 2 more files, the log appended in place
    files = {p.name: p for p in (repo / "hs").iterdir()}
    assert len(files) == 7 and (repo / "hs" / "log.jsonl").read_text().count("\n") == 2
    assert_cache_consistent(repo)  # the first log's object too, after the in-place append
    objects = cache_objects(repo)
    for name, p in files.items():
        assert p.stat().st_nlink == 1 and not p.is_symlink()  # never a link into the cache
        if name.startswith("hs_"):
            assert p.stat().st_ino == before.get(name, p.stat().st_ino)  # old files untouched
            assert objects[md5(p)].stat().st_ino != p.stat().st_ino
    states = sum(p.stat().st_size for n, p in files.items() if n.startswith("hs_"))
    link = link_type(types, repo / "hs")
    cached = sum(objects[md5(p)].stat().st_size for n, p in files.items() if n.startswith("hs_"))
    assert cached == states
    # the plan's formula: a second copy with copy; reflink shares the blocks (du cannot tell)
    assert dvc_costs(states, link, {})["cache_bytes"] == (states if link == "copy" else 0)


def test_hardlinks_store_once_but_each_rerun_copies_every_file_back(tmp_path):
    repo = make_repo(tmp_path / "repo", "hardlink")
    dvc(repo, "repro")
    objects = cache_objects(repo)
    hs = sorted((repo / "hs").glob("hs_*"))
    assert all(p.stat().st_nlink == 2 and objects[md5(p)].samefile(p) for p in hs)  # stored once
    (repo / "rows").write_text("5")
    seen = tmp_path / "seen.json"
    dvc(repo, "repro", env={"SEEN": str(seen)})
    # what the stage found: every committed file a private copy (DVC's unprotect of persist outs)
    assert set(json.loads(seen.read_text()).values()) == {1}
    assert all(p.stat().st_nlink == 2 for p in (repo / "hs").iterdir())  # linked again at commit
    assert_cache_consistent(repo)
    # a write outside `dvc repro` (an in-place append, a tool that edits a file) is a write into
    # the cache: as root the read-only mode does not stop it, otherwise it fails
    log = repo / "hs" / "log.jsonl"
    if os.geteuid() == 0:
        with open(log, "a") as f:
            f.write("{}\n")
        assert any(md5(p) != name for name, p in cache_objects(repo).items())
    else:
        with pytest.raises(PermissionError):
            open(log, "a")
