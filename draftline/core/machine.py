"""Machine facts beside a stage's outputs: what could change the bytes of its floats.

Float results on CPU depend on the kernels torch, MKL and oneDNN pick at run time (instruction
set, thread count), so the same commit can give other bytes on another machine. These facts
explain such a difference without causing one: they are written to `reports/machine/<stage>.json`
in the DVC workspace a stage runs in (DVC_STAGE names the stage), which no stage depends on and
no hashed output holds (`meta.json` keeps only what made an artifact). `draftline verify-repro`
prints them beside the figures it compares.

The figures of a run that a rerun of the same work on the same machine does not repeat (seconds,
rates, free disk space, how a server happened to batch) go there too, under `run_facts`, taken out
of the stage's report by `without_run_facts`: the reports DVC hashes then hold only what the work
made, and the same work on the same machine gives the same bytes (reproducibility.yaml).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path

PACKAGES = ("draftline", "torch", "transformers", "tokenizers", "speculators", "datasets", "numpy")
ENVIRONMENT = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "neon", "asimd")
MACHINE_DIR = "reports/machine"  # inside the workspace DVC runs the stage in
RUN_FACTS: dict[str, dict] = {}  # {report file name: {"a/b" path in its report: value}}


def cpu_facts() -> dict:
    """CPU model and the instruction-set flags that decide which kernels run (Linux: /proc/cpuinfo)."""
    model, flags = platform.processor() or platform.machine(), set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                model = value.strip()
            elif key.strip() in ("flags", "Features"):
                flags |= set(value.split())
    return {
        "model": model,
        "arch": platform.machine(),
        "cores": os.cpu_count(),
        "flags": sorted(f for f in CPU_FLAGS if f in flags),
    }


def machine_facts() -> dict:
    """What this process ran on: CPU, the kernels torch chose (when torch was loaded), threads,
    the environment variables that pin them, Python and package versions."""
    import importlib.metadata as md

    versions = {}
    for pkg in PACKAGES:
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    facts = {
        "cpu": cpu_facts(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
        "environment": {k: os.environ[k] for k in ENVIRONMENT if k in os.environ},
    }
    torch = sys.modules.get("torch")  # only when the stage loaded it: importing it costs seconds
    if torch is not None:
        facts["torch"] = {
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(),
            "mkl": torch.backends.mkl.is_available(),
            "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        }
    return facts


def without_run_facts(report: dict, keys: Collection[str], name: str) -> dict:
    """`report` without the figures whose key is in `keys`, at any depth; they are kept for this
    run's record (write_machine_facts) under `name` (the report's file name) and their path in it
    ("partitions/short/seconds")."""
    moved = RUN_FACTS.setdefault(name, {})

    def strip(node, path: str):
        if isinstance(node, dict):
            kept = {}
            for key, value in node.items():
                where = f"{path}/{key}" if path else str(key)
                if key in keys:
                    moved[where] = value
                else:
                    kept[key] = strip(value, where)
            return kept
        if isinstance(node, list):
            return [strip(value, f"{path}/{i}") for i, value in enumerate(node)]
        return node

    return strip(report, "")


def write_machine_facts() -> Path | None:
    """reports/machine/<stage>.json in the workspace of the DVC stage running this process (DVC
    sets DVC_STAGE and runs the command in the workspace's root); None outside DVC (tests, a stage
    run by hand), where there is no run to explain."""
    stage = os.environ.get("DVC_STAGE")
    if not stage:
        return None
    path = Path.cwd() / MACHINE_DIR / f"{stage}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    # ran_at: every run leaves its own record, so verify-repro tells a stage that was rerun from
    # one that was not, even where the rerun made the same bytes (draftline/tools/verify_repro.py)
    ran_at = datetime.now(UTC).isoformat(timespec="microseconds")
    record = {"stage": stage, "ran_at": ran_at, **machine_facts()}
    if RUN_FACTS:
        record["run_facts"] = RUN_FACTS
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path
