"""DVC's cost per byte of hidden states: hashing, the cache copy, and what links would cost a rerun.

    python overhead/dvc_hashing.py --files 32 --file-mb 64 --out reports/overhead/dvc_hashing.json

Writes `files` hidden-state-sized files (one safetensors file per row is tens to hundreds of MB at
a real hidden size: 4,000 tokens x 57,352 B at H = 7168 is 229 MB) into a throwaway git+DVC repo,
fsyncs them and evicts them from the page cache (posix_fadvise DONTNEED), then times:

- `dvc add --no-commit` with DVC's state db empty: hashing only, files read from disk (cold);
- plain hashlib md5 over the same bytes, one thread, 1 MiB reads as DVC reads: cold, then warm;
- `dvc add --no-commit` again with the state db removed and the files in the page cache (warm);
- a no-op `dvc status` (every hash from the state db);
- `dvc commit` with cache.type reflink,copy (the project's): the copy into the cache, on a
  filesystem without reflink;
- cache.type hardlink: `dvc checkout --relink`, then `dvc unprotect`, which DVC does to every file of
  a `persist: true` output before each rerun of its stage (dvc/stage/__init__.py, remove_outs), and
  the `dvc status` after it, which hashes the copies again (new inodes miss the state db).

DVC hashes files over 2 MiB in a thread pool of min(16, cores + 4) threads, so its rate grows with
cores up to the disk's read rate; the cores and load averages are recorded beside it. Rates are net
of `dvc_startup_s` (a `dvc status` with nothing tracked).
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from devtools.ab_timing import drop_page_cache, machine_load  # noqa: E402

CHUNK = 1 << 20  # dvc_data's fobj_md5 reads 1 MiB at a time


def write_states(directory: Path, files: int, file_bytes: int) -> list[Path]:
    """`files` files of file_bytes each, every MiB different (no two files or chunks alike)."""
    directory.mkdir(parents=True)
    block = os.urandom(CHUNK)
    paths = []
    for i in range(files):
        path = directory / f"hs_{i}.safetensors"
        with open(path, "wb") as f:
            for c in range(0, file_bytes, CHUNK):
                head = (i * 1_000_003 + c).to_bytes(8, "little")
                f.write((head + block[8:])[: min(CHUNK, file_bytes - c)])
            f.flush()
            os.fsync(f.fileno())
        paths.append(path)
    return paths


def md5_seconds(paths: list[Path]) -> float:
    start = time.perf_counter()
    for path in paths:
        h = hashlib.md5(usedforsecurity=False)
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
    return time.perf_counter() - start


def timed(cmd: list[str], cwd: Path, env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def filesystem(path: Path) -> str:
    """The filesystem type of the mount that holds path (/proc/mounts; '' elsewhere)."""
    best, kind = "", ""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return ""
    resolved = str(path.resolve())
    for line in mounts:
        fields = line.split()
        if len(fields) > 2 and resolved.startswith(fields[1]) and len(fields[1]) > len(best):
            best, kind = fields[1], fields[2]
    return kind


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=32)
    ap.add_argument("--file-mb", type=float, default=64, help="MB (10^6 bytes) per file")
    ap.add_argument("--out", default="reports/overhead/dvc_hashing.json")
    args = ap.parse_args()
    bindir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    file_bytes = round(args.file_mb * 1e6)
    total = args.files * file_bytes
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
        for cmd in (["init", "-q"], ["config", "core.analytics", "false"]):
            subprocess.run(["dvc", *cmd], cwd=repo, check=True, env=env)
        subprocess.run(
            ["dvc", "config", "cache.type", "reflink,copy"], cwd=repo, check=True, env=env
        )
        startup = timed(["dvc", "status"], repo, env)
        paths = write_states(repo / "hs", args.files, file_bytes)
        drop_page_cache(paths)
        dvc_cold = timed(["dvc", "add", "--no-commit", "hs"], repo, env)
        drop_page_cache(paths)
        md5_cold = md5_seconds(paths)
        md5_warm = md5_seconds(paths)
        shutil.rmtree(repo / ".dvc" / "tmp")  # DVC's state db: every hash computed again
        dvc_warm = timed(["dvc", "add", "--no-commit", "hs"], repo, env)
        noop_status = timed(["dvc", "status"], repo, env)
        commit_copy = timed(["dvc", "commit", "-f", "hs.dvc"], repo, env)
        cache_bytes = sum(
            p.stat().st_size for p in (repo / ".dvc" / "cache").rglob("*") if p.is_file()
        )
        copied = all(p.stat().st_nlink == 1 for p in paths)
        subprocess.run(["dvc", "config", "cache.type", "hardlink"], cwd=repo, check=True, env=env)
        relink = timed(["dvc", "checkout", "--relink", "-f", "hs.dvc"], repo, env)
        linked = all(p.stat().st_nlink == 2 for p in paths)
        unprotect = timed(["dvc", "unprotect", "hs"], repo, env)
        rehash = timed(["dvc", "status"], repo, env)
        fs = filesystem(repo)

    def gbps(seconds: float) -> float:
        return round(total / 1e9 / max(seconds - startup, 1e-6), 3)

    result = {
        "files": args.files,
        "file_bytes": file_bytes,
        "total_bytes": total,
        "filesystem": fs,
        "cpu_count": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        **machine_load([round(x, 2) for x in load_before]),
        "page_cache": "cold: fsync then posix_fadvise DONTNEED before reading; warm: just read",
        "dvc_startup_s": round(startup, 2),
        "dvc_hash_cold_s": round(dvc_cold, 2),
        "dvc_hash_cold_gbps": gbps(dvc_cold),
        "dvc_hash_warm_s": round(dvc_warm, 2),
        "dvc_hash_warm_gbps": gbps(dvc_warm),
        "md5_one_thread_cold_gbps": round(total / 1e9 / md5_cold, 3),
        "md5_one_thread_warm_gbps": round(total / 1e9 / md5_warm, 3),
        "noop_status_s": round(noop_status, 2),
        "copy": {
            "commit_s": round(commit_copy, 2),
            "commit_gbps": gbps(commit_copy),
            "cache_bytes": cache_bytes,
            "cache_over_states": round(cache_bytes / total, 4),
            "workspace_files_are_copies": copied,
        },
        "hardlink": {
            "relink_s": round(relink, 2),
            "workspace_files_are_links": linked,
            # what every rerun of a persist output's stage starts with, then hashes again
            "unprotect_s": round(unprotect, 2),
            "unprotect_gbps": gbps(unprotect),
            "rehash_after_unprotect_s": round(rehash, 2),  # the copies are in the page cache
        },
    }
    result["dvc_hash_hours_per_tb"] = round(1e12 / (result["dvc_hash_cold_gbps"] * 1e9) / 3600, 3)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
