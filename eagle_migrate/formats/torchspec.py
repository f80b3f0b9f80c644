"""TorchSpec EAGLE-3 / 3.1."""
from __future__ import annotations

from .base import Checkpoint, Layout, Probe, register_layout
from .common import derive, hf_view, quant_scheme, weights_generation


def _is_torchspec(p: Probe) -> bool:
    return "_torchspec_version" in (p.config or {}) or "torchspec_version" in p.st_metadata


def _sniff_native(p: Probe) -> int:
    return 80 if _is_torchspec(p) and p.scan.midlayer and weights_generation(p) == "eagle3" else 0


def _sniff_vllm(p: Probe) -> int:
    return 80 if _is_torchspec(p) and not p.scan.midlayer and weights_generation(p) == "eagle3" else 0


def _read_native(p: Probe) -> Checkpoint:
    view = hf_view(p.config, aux_offset=1, convention="output-of-layer")
    return derive(p.folder, p.store, p.scan, view, producer="torchspec", layout="torchspec", raw_config=p.config,
                  quantization=quant_scheme(p.config))


def _read_vllm(p: Probe) -> Checkpoint:
    view = hf_view(p.config)
    return derive(p.folder, p.store, p.scan, view, producer="torchspec", layout="torchspec-vllm", raw_config=p.config,
                  quantization=quant_scheme(p.config))


NATIVE = register_layout(Layout("torchspec", "torchspec", _sniff_native, _read_native, "TorchSpec native: midlayer.*"))
VLLM_EXPORT = register_layout(Layout("torchspec-vllm", "torchspec", _sniff_vllm, _read_vllm, "TorchSpec convert_to_hf.py --vllm"))
