"""Dataset sources: where a dataset's rows come from and how they are read.

A source is a local .jsonl/.json/.parquet file, a local dataset directory, a hub dataset id
(``datasets.load_dataset``, optionally streaming and pinned to a revision), or a built-in source
that generates its rows (``draftline.data.builtin_sources.BUILTINS``); the presets that name
the usual ones are dataset params (``draftline.data.presets.PRESETS``). This module reads raw rows
(``read_rows``), tells which commit a hub id resolves to, says what a `prepare@<name>` stage
depends on in DVC (the local source, or the stage script for a hub id) and streams one dataset
spec into prepared records (``prepare_dataset``); the conversion of each row is draftline/data/formats.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from draftline.core.errors import DraftlineError
from draftline.core.io import write_jsonl
from draftline.data.builtin_sources import BUILTINS
from draftline.data.formats import Malformed, PrepareStats, RecordRules, iter_records

if TYPE_CHECKING:
    from draftline.data.config import DatasetSpec

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")
HUB_DEP = "reports/code/prepare.json"  # the DVC source dep of a hub dataset (see dvc_source_dep)


def is_local(path: str) -> bool:
    """A local file (by suffix) or an existing local directory; anything else is a hub dataset id."""
    return Path(path).suffix.lower() in LOCAL_SUFFIXES or Path(path).exists()


def dvc_source_dep(path: str) -> str:
    """What `prepare@<name>` depends on in DVC: the local source itself, or for a hub id (not a file)
    the stage script, already a dep; the hub id, config, split and revision are its params instead."""
    return path if is_local(path) else HUB_DEP


def source_dep(spec: DatasetSpec) -> str:
    """dvc_source_dep of a dataset; a built-in source is made by the stage's code, so it depends
    on the code fingerprint (like a hub id), its settings being its params."""
    return HUB_DEP if spec.builtin is not None else dvc_source_dep(spec.path)


def missing_source_problem(name: str, spec: DatasetSpec) -> str | None:
    """Why datasets.<name>.path, a local file by its suffix, cannot be read because it is not
    there, naming the param and the path; None for a file that is there, a hub id or a builtin."""
    if spec.builtin is not None:
        return None
    path = Path(spec.path)
    if path.suffix.lower() not in LOCAL_SUFFIXES or path.is_file():
        return None
    return (
        f"datasets.{name}.path: {spec.path} does not exist (a local {path.suffix} file is "
        "expected there)"
    )


def drop_share_problem(name: str, spec: DatasetSpec, report: dict) -> str | None:
    """Why prepare fails a dataset whose share of malformed rows (not a JSON object: corrupt or
    cut lines) is above datasets.<name>.max_drop_share, naming the share and the first bad row;
    None when it is within."""
    share = report.get("malformed_share", 0.0)
    if share <= spec.max_drop_share:
        return None
    n = report["dropped"].get("malformed_json", 0)
    return (
        f"datasets.{name}: {n} of {report['rows_read']} rows ({share:.1%}) of {spec.path} are not "
        f"JSON objects, above datasets.{name}.max_drop_share {spec.max_drop_share}; first: "
        f"{report['malformed_first'][0]}. Repair the file, or raise max_drop_share to drop them"
    )


def read_rows(
    path: str,
    split: str = "train",
    name: str | None = None,
    revision: str | None = None,
    streaming: bool = False,
    data_files: str | None = None,
) -> Iterator[dict | None]:
    """Raw rows of a local file, else of a hub dataset / local dataset directory (`data_files`: only
    those of its files); a Malformed (where, what) or None stands for a line or element that is not
    a JSON object."""
    local = Path(path)
    if local.suffix.lower() in LOCAL_SUFFIXES:
        if not local.is_file():
            raise FileNotFoundError(f"dataset file not found: {path}")
        return _parquet_rows(local) if local.suffix.lower() == ".parquet" else _json_rows(local)
    from datasets import load_dataset  # slow import; only hub ids and local dataset dirs need it

    return iter(
        load_dataset(
            path,
            name,
            split=split,
            revision=revision,
            streaming=streaming,
            **({"data_files": data_files} if data_files else {}),
        )
    )


def hub_revision(path: str, name: str | None = None, revision: str | None = None) -> str | None:
    """The commit a hub dataset id resolves to (what `revision` pins, or the branch head now), or None
    when it cannot be told (a local directory, offline without a cached copy)."""
    if is_local(path):
        return None
    try:
        from datasets import load_dataset_builder

        builder = load_dataset_builder(path, name, revision=revision)
    except Exception:  # noqa: BLE001 - best effort: the report says "unknown", loading itself fails loudly
        return None
    found = re.search(r"@([0-9a-f]{40})", f"{builder.base_path} {builder.config.data_files}")
    return found.group(1) if found else None


# bytes that are not UTF-8, as errors="surrogateescape" reads them
NOT_UTF8 = re.compile("[\udc80-\udcff]")


def _json_rows(path: Path) -> Iterator[dict | Malformed]:
    # A .json file is either one JSON array or JSON lines (as the hub's json loader accepts). A
    # line with bytes that are not UTF-8 is a malformed row, named; in an array it fails the file.
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        head = f.read(1 << 12).lstrip()
        f.seek(0)
        if head.startswith("["):
            with open(path, encoding="utf-8") as strict:
                yield from _json_array_rows(strict, path)
            return
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            if bad := NOT_UTF8.search(line):
                yield Malformed(f"line {n}", f"not UTF-8 text (column {bad.start() + 1})")
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                yield Malformed(
                    f"line {n}", f"not JSON ({err.msg.removesuffix(' at')}, column {err.colno})"
                )
                continue
            yield row if isinstance(row, dict) else Malformed(f"line {n}", "not a JSON object")


def _json_array_rows(f, path: Path, chunk: int = 1 << 20) -> Iterator[dict | None]:
    """The elements of a top-level JSON array, decoded one at a time from 1 MiB reads (a 600 MB
    ShareGPT dump never sits in memory whole). A syntax error fails the file: the array cannot be resynced."""
    decoder, buf, pos, eof = json.JSONDecoder(), "", 0, False

    def fill() -> bool:
        nonlocal buf, pos, eof
        more = f.read(chunk)
        buf, pos, eof = buf[pos:] + more, 0, not more
        return bool(more)

    def skip(
        chars: str,
    ) -> str:  # skip whitespace and `chars`; the next significant character or ""
        nonlocal pos
        while True:
            while pos < len(buf) and (buf[pos].isspace() or buf[pos] in chars):
                pos += 1
            if pos < len(buf) or not fill():
                return buf[pos] if pos < len(buf) else ""

    if skip("") != "[":
        raise ValueError(f"{path}: not a JSON array")
    pos += 1
    while (nxt := skip(",")) != "]":
        if not nxt:
            raise ValueError(f"{path}: JSON array is not closed")
        try:
            row, end = decoder.raw_decode(buf, pos)
        except json.JSONDecodeError as err:
            if not eof and fill():
                continue
            raise ValueError(f"{path}: invalid JSON in array: {err}") from None
        pos = end
        yield row if isinstance(row, dict) else None


def _parquet_rows(path: Path) -> Iterator[dict]:
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        yield from batch.to_pylist()


# ---- a whole dataset -------------------------------------------------------------------------


def source_rows(name: str, spec: DatasetSpec) -> Iterator[dict | Malformed | None]:
    """read_rows of datasets.<name>, or a builtin's rows; a source that cannot be read at all (a
    broken JSON array or parquet file, a hub id that does not load, a builtin that cannot make
    what its settings ask) raises ValueError naming the param, the path and what is wrong."""
    if spec.builtin is not None:
        try:
            yield from BUILTINS[spec.builtin].rows(spec.build)
        except DraftlineError as err:  # the builtin names its key under datasets.<name>
            raise ValueError(f"datasets.{name}.{err}") from None
        return
    try:
        yield from read_rows(
            spec.path, spec.split, spec.name, spec.revision, spec.streaming, spec.data_files
        )
    except (OSError, ValueError) as err:
        what = str(err).removeprefix(f"{spec.path}: ")
        raise ValueError(
            f"datasets.{name}.path: {spec.path} cannot be read ({type(err).__name__}: {what})"
        ) from None


def spec_records(spec: DatasetSpec, source: str, stats: PrepareStats) -> Iterator[dict]:
    """The records of a dataset spec (path, split, name, revision, streaming, data_files, max_rows, format,
    fields, parse_markup, max_prompt_tokens, scripts), streamed."""
    rules = RecordRules(
        spec.format, spec.fields, spec.parse_markup, spec.max_prompt_tokens, spec.scripts
    )
    return iter_records(islice(source_rows(source, spec), spec.max_rows), source, stats, rules)


def prepare_dataset(name: str, spec: DatasetSpec, out_jsonl: str) -> dict:
    """Stream the dataset `name` into `out_jsonl`, one record a line, with a progress bar; its report:
    what made it (the resolved spec, the hub commit), then what came of it (PrepareStats).
    FileNotFoundError / ValueError when the source is missing or gives no usable row."""
    from rich.progress import Progress

    stats = PrepareStats()
    if problem := missing_source_problem(name, spec):
        raise FileNotFoundError(problem)
    with Progress(transient=True) as progress:
        task = progress.add_task(f"prepare {name}", total=spec.max_rows)
        records = spec_records(spec, name, stats)
        write_jsonl(
            out_jsonl, (progress.update(task, completed=stats.rows_read) or r for r in records)
        )
    given = spec.model_dump()
    if spec.builtin is None:  # a file or hub source's report reads as before builtins existed
        del given["builtin"], given["build"]
    return {
        "dataset": name,
        **given,
        "resolved_revision": None
        if spec.builtin is not None or is_local(spec.path)
        else hub_revision(spec.path, spec.name, spec.revision),
        **({"builtin_source": builtin_facts(spec)} if spec.builtin is not None else {}),
        **stats.as_dict(),
    }


def builtin_facts(spec: DatasetSpec) -> dict:
    """What a builtin's rows were made from (its text's version and hash), for the report."""
    return BUILTINS[spec.builtin].facts()


class Paths(NamedTuple):
    dataset: str  # the dataset's name in params.yaml `datasets`: where its rows are addressed
    out: Path  # datasets/prepared/<name>.jsonl


def run(params, paths: Paths) -> dict:
    """Stage `prepare`: the dataset paths.dataset of params.datasets normalized into paths.out;
    its report. FileNotFoundError / ValueError as prepare_dataset."""
    return prepare_dataset(paths.dataset, params.datasets[paths.dataset], str(paths.out))
