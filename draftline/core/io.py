"""Small file helpers shared by the stages: JSON/JSONL reading and atomic writing, meta.json."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | Path):
    """Yield a temp path beside `path`; rename it onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_json(path: str | Path, obj) -> None:
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=False, ensure_ascii=False)
        f.write("\n")


def json_object_problem(path: str | Path) -> str | None:
    """What is wrong with a file that should hold one JSON object (missing, unreadable, not JSON
    with where it breaks, not an object), or None when it is one."""
    path = Path(path)
    if not path.is_file():
        return f"{path} is missing"
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as err:
        return f"{path} cannot be read: {err}"
    except json.JSONDecodeError as err:
        where = f"at line {err.lineno}, column {err.colno}"
        return f"{path} is not valid JSON ({err.msg.removesuffix(' at')} {where})"
    if not isinstance(value, dict):
        return f"{path} holds a JSON {type(value).__name__}, not an object"
    return None


def safetensors_problem(path: str | Path) -> str | None:
    """What is wrong with a safetensors file (unreadable, a header that does not parse, data cut
    short of what the header promises: safetensors checks the size on open), found without
    loading a tensor, or None when it opens."""
    from safetensors import safe_open  # loads on first use: check_params stays light

    try:
        with safe_open(str(path), framework="np"):
            return None
    except Exception as err:  # noqa: BLE001 - whatever the reader raised, the file is unusable
        return f"{path} cannot be read ({type(err).__name__}: {str(err)[:160]})"


def read_json(path: str | Path):
    with open(path) as f:
        return json.load(f)


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> int:
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def read_jsonl(path: str | Path) -> Iterator[dict]:
    with open(path) as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def read_jsonl_tolerant(path: str | Path) -> tuple[list[dict], int]:
    """Rows of an append-only file that may end in a line cut by a kill; returns (rows, bad_lines)."""
    rows, bad = [], 0
    if not Path(path).exists():
        return rows, bad
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                bad += 1
    return rows, bad


def detail_path(metrics_path: str | Path) -> Path:
    """Where the whole report of a metrics file goes: reports/x.json -> reports/x.detail.json."""
    path = Path(metrics_path)
    return path.with_name(f"{path.stem}.detail{path.suffix}")


def write_metrics(
    path: str | Path, report: dict, headline: list[str], run_facts: Collection[str] = ()
) -> None:
    """The headline figures, flat, in the metrics file (what `dvc exp show` and `dvc metrics diff`
    show, one column each); the whole report in its detail file beside it (detail_path), without
    the figures named in `run_facts` (timings: they go to the run's record,
    draftline/core/machine.py)."""
    from draftline.core.machine import without_run_facts

    report = without_run_facts(report, run_facts, detail_path(path).name)
    write_json(detail_path(path), report)
    write_json(path, {key: report[key] for key in headline if key in report})


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def write_meta(directory: str | Path, stage: str, params: dict, **extra) -> None:
    """meta.json beside an artifact: what made it (stage, its params, extra facts). Nothing of the
    machine or its versions: meta.json sits inside hashed outputs, where another patch release of
    Python would change the hash; those facts go to reports/machine/ (draftline/core/machine.py)."""
    write_json(Path(directory) / "meta.json", {"stage": stage, "params": params, **extra})
