"""CPU thread policy of the stages: how many intra-op threads torch uses, and how they wait.

On a small shared machine torch's OpenMP pool spins at every barrier: with another process busy on
both cores of the 2-core machine, one tiny-target training step took 11.5 s with 2 threads and
1.3 s with 1. A spinning thread that loses its core holds up every other thread of the op until it
gets the core back, so the stage slows far more than the CPU it lost. Two measures:

- `OMP_WAIT_POLICY=PASSIVE`: threads sleep at a barrier instead of spinning, so a descheduled
  thread costs the others its own share of CPU, not a spin for its time slice. It must be in the
  environment before torch is imported (libgomp reads it once, at load): every stage calls
  `apply_thread_policy` first thing in main(), before any torch import. Servers and subprocesses a
  stage starts inherit it (and OMP_NUM_THREADS). It has an idle cost where barriers are
  microseconds apart: the tiny target's batched decode (regenerate's server) takes 4.2-4.6 s
  passive vs 2.1-2.2 s spinning, idle. Spinning was measured and rejected there: next to a hog on
  every core the same decode took 5.6-16 s spinning (the collapse above, at random) vs 4.0-8.0 s
  passive, and a short spin (GOMP_SPINCOUNT 10,000) kept both the idle gain and the collapse.
- per-stage thread counts (STAGE_THREADS): stages whose ops are small and latency-bound (the tiny
  target's training, batch-1 speculative decoding) gain little from a second thread even when idle
  and lose most under load, so they use one; stages with larger matmuls (hidden-state extraction,
  batched regeneration, the draft's training step over pack_len tokens) use every core the process
  may run on: with the passive wait, two threads train the draft faster than one both idle (11.7 s
  vs 19.3 s for 10 steps of the default shapes) and next to a hog (23.5 s vs 29.9 s;
  reports/overhead/cpu_load_train_threads.json).

Explicit choices win: OMP_NUM_THREADS or DRAFTLINE_THREADS in the environment sets the count for
every stage (e.g. a 64-core host where the CPU stages should spread), and an explicit
OMP_WAIT_POLICY is kept. `overhead/cpu_load.py` measures the policy: stage work idle vs with a CPU
hog on every core.
"""

from __future__ import annotations

import os
import sys

# stage -> most intra-op threads (None: every core the process may run on)
STAGE_THREADS: dict[str, int | None] = {
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
