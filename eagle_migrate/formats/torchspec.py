"""TorchSpec (lightseekorg/TorchSpec ``torchspec/models/draft/llama3_eagle.py``; EAGLE-3.1 in PR #97).

* native (``tools/convert_to_hf.py`` without ``--vllm``): ``midlayer.*`` names, model.safetensors with header
  metadata ``torchspec_version``, config with top-level ``_torchspec_version``; ``embed_tokens`` included;
  ``d2t``/``t2d`` only with ``--prune-vocab`` (Vd != V). Aux ids: top level or in ``eagle_config``.
* ``--vllm`` export: ``midlayer.`` -> ``layers.0.``; ``_fixup_export_config`` adds +1 to the ids **only when
  ``model_type == "kimi_k2"``** ("vLLM uses 1-indexed layer IDs for kimi_k2").

Aux-id convention (docs/formats.md): ``_torchspec_version`` is written by TorchSpec alone, and its exporter's own
kimi_k2 rule is a fingerprint: native + kimi_k2 = output-of-layer (the exporter adds +1 for vLLM), ``--vllm`` +
kimi_k2 = vLLM's (already shifted). For other model types the exporter copies the ids unchanged, and whether they
were meant as vLLM's cannot be read from the files: measured with a target.
"""

from __future__ import annotations

from .base import Checkpoint, Layout, Probe, register_layout
from .common import derive, hf_view, quant_scheme, weights_generation


def _is_torchspec(p: Probe) -> bool:
    return "_torchspec_version" in (p.config or {}) or "torchspec_version" in p.st_metadata


def _sniff_native(p: Probe) -> int:
    return 80 if _is_torchspec(p) and p.scan.midlayer and weights_generation(p) == "eagle3" else 0


def _sniff_vllm(p: Probe) -> int:
    return 80 if _is_torchspec(p) and not p.scan.midlayer and weights_generation(p) == "eagle3" else 0


NOTES = {
    "output-of-layer": ["TorchSpec trains with SGLang-style capture (layer outputs)"],
    "vllm": ["TorchSpec's own --vllm exporter copies these ids unchanged for model types other than kimi_k2"],
}


def _kimi(p: Probe) -> bool:
    return (p.config or {}).get("model_type") == "kimi_k2"


def _read_native(p: Probe) -> Checkpoint:
    fp = ("output-of-layer", "_torchspec_version + model_type kimi_k2: TorchSpec's exporter adds +1 to these ids for vLLM") if _kimi(p) else None
    view = hf_view(p.config, aux_fingerprint=fp, aux_notes=NOTES)
    ck = derive(p.folder, p.store, p.scan, view, producer="torchspec", layout="torchspec", raw_config=p.config,
                quantization=quant_scheme(p.config))
    ck.meta["torchspec_version"] = (p.config or {}).get("_torchspec_version") or p.st_metadata.get("torchspec_version")
    return ck


def _read_vllm(p: Probe) -> Checkpoint:
    fp = ("vllm", "_torchspec_version + model_type kimi_k2 in a --vllm export: the exporter already added +1") if _kimi(p) else None
    view = hf_view(p.config, aux_fingerprint=fp, aux_notes=NOTES)
    ck = derive(p.folder, p.store, p.scan, view, producer="torchspec", layout="torchspec-vllm", raw_config=p.config,
                quantization=quant_scheme(p.config))
    ck.meta["torchspec_version"] = (p.config or {}).get("_torchspec_version") or p.st_metadata.get("torchspec_version")
    return ck


NATIVE = register_layout(Layout("torchspec", "torchspec", _sniff_native, _read_native, "TorchSpec native: midlayer.*, _torchspec_version"))
VLLM_EXPORT = register_layout(Layout("torchspec-vllm", "torchspec", _sniff_vllm, _read_vllm, "TorchSpec convert_to_hf.py --vllm: layers.0.*"))
