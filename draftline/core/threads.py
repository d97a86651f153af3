"""CPU thread policy of the stages: how many intra-op threads torch uses, and how they wait.

On a small shared machine torch's OpenMP pool spins at every barrier, and a spinning thread that
loses its core holds up every other thread of the op: next to another busy process a tiny step
runs many times slower. So every stage calls `apply_thread_policy` first thing in main(), before
torch loads (libgomp reads the environment once), and the servers and subprocesses it starts
inherit the result:

- `OMP_WAIT_POLICY=PASSIVE`: threads sleep at a barrier instead of spinning.
- a thread count per stage (STAGE_THREADS): one for small, latency-bound ops (the tiny target's
  training, batch-1 speculative decoding), every core the process may run on for larger matmuls.

Explicit choices win: OMP_NUM_THREADS or DRAFTLINE_THREADS sets the count for every stage, and an
explicit OMP_WAIT_POLICY is kept. The measurements behind the policy (`overhead/cpu_load.py`):
docs/performance.md, "CPU threads under load".
"""

from __future__ import annotations

import os
import sys

# stage -> most intra-op threads (None: every core the process may run on)
STAGE_THREADS: dict[str, int | None] = {
    "code": 1,  # reads and hashes the code: never loads torch
    "check_params": 1,  # validation only: never loads torch
    "target": 1,  # tiny target training: 128-wide matmuls (smollm2: a one-off conversion)
    "probe": 1,  # reads configs; the vLLM probe runs in its own processes
    "prepare": 1,
    "mix": 1,
    "tokenize": 1,
    "vocab": 1,
    "regenerate": None,  # batched generate in the server (backend hf); the client itself is asyncio
    "hidden_states": None,  # batched target forwards: large matmuls
    "train": None,  # the draft's step: pack_len tokens through a decoder layer, and backward
    "evaluate": 1,  # batch-1 speculative decoding: latency-bound small ops
    "benchmark": 1,
}


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_threads(
    stage: str, environ: dict | None = None, cores: int | None = None
) -> tuple[int, str]:
    """(threads, why) for a stage under the environment given (default: os.environ)."""
    env = os.environ if environ is None else environ
    for key in ("DRAFTLINE_THREADS", "OMP_NUM_THREADS"):
        value = env.get(key)
        if value:
            try:
                n = int(value)
            except ValueError:
                raise ValueError(f"{key}={value!r}: expected a positive integer") from None
            if n < 1:
                raise ValueError(f"{key}={value!r}: expected a positive integer")
            return n, key
    if stage not in STAGE_THREADS:
        raise ValueError(f"no thread policy for stage {stage!r}; known: {sorted(STAGE_THREADS)}")
    cores = available_cores() if cores is None else cores
    cap = STAGE_THREADS[stage]
    return (
        cores if cap is None else min(cap, cores)
    ), f"stage policy ({'all cores' if cap is None else f'at most {cap}'})"


def apply_thread_policy(stage: str) -> dict:
    """Set the wait policy and thread count for this stage's process; returns what was set."""
    threads, why = resolve_threads(stage)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    late = "torch" in sys.modules  # the wait policy was read when torch loaded
    if late:
        import torch

        torch.set_num_threads(threads)
    return {
        "threads": threads,
        "why": why,
        "wait_policy": os.environ["OMP_WAIT_POLICY"],
        "torch_loaded_before": late,
    }
