"""TorchSpec (lightseekorg/TorchSpec ``torchspec/models/draft/llama3_eagle.py``; EAGLE-3.1 in PR #97).

* native (``tools/convert_to_hf.py`` without ``--vllm``): ``midlayer.*`` names, model.safetensors with header
  metadata ``torchspec_version``, config with top-level ``_torchspec_version``; ``embed_tokens`` included;
  ``d2t``/``t2d`` only with ``--prune-vocab`` (Vd != V). Aux ids: top level or in ``eagle_config``.
* ``--vllm`` export: ``midlayer.`` -> ``layers.0.``; ``_fixup_export_config`` adds +1 to the ids **only when
  ``model_type == "kimi_k2"``** ("vLLM uses 1-indexed layer IDs for kimi_k2").

Aux-id convention (docs/formats.md): ``_torchspec_version`` is written by TorchSpec alone (config key and the
safetensors header's ``torchspec_version``), so what its code does is a fingerprint. TorchSpec trains on layer
outputs: its vLLM worker extension (``inference/engine/vllm_worker_extension.py``) captures ``hidden_states +
residual`` after running layer id, its SGLang engine asks ``set_eagle3_layers_to_capture`` (input of layer id + 1),
and its default ids are ``[1, L // 2 - 1, L - 4]``. ``convert_to_hf.py`` adds +1 only for ``model_type ==
"kimi_k2"`` with ``--vllm``; every other id list it copies unchanged. So: ``--vllm`` export + kimi_k2 = vLLM's
convention (already shifted); everything else TorchSpec wrote = output-of-layer (vLLM reads a non-kimi ``--vllm``
export's ids one layer off: convert writes them shifted).
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
    "output-of-layer": ["TorchSpec trains on layer outputs (vLLM worker extension: after layer id; SGLang: input of id + 1)"],
    "vllm": ["TorchSpec's --vllm exporter shifts ids for kimi_k2 only"],
}
TRAINED = "TorchSpec trains on layer outputs (its vLLM worker extension captures after layer id) and its exporter"


def _kimi(p: Probe) -> bool:
    return (p.config or {}).get("model_type") == "kimi_k2"


def _read_native(p: Probe) -> Checkpoint:
    fp = ("output-of-layer", "_torchspec_version + model_type kimi_k2: TorchSpec's exporter adds +1 to these ids for vLLM"
          if _kimi(p) else f"_torchspec_version, native names: {TRAINED} copies the ids unchanged")
    view = hf_view(p.config, aux_fingerprint=fp, aux_notes=NOTES)
    ck = derive(p.folder, p.store, p.scan, view, producer="torchspec", layout="torchspec", raw_config=p.config,
                quantization=quant_scheme(p.config))
    ck.meta["torchspec_version"] = (p.config or {}).get("_torchspec_version") or p.st_metadata.get("torchspec_version")
    return ck


def _read_vllm(p: Probe) -> Checkpoint:
    fp = (("vllm", "_torchspec_version + model_type kimi_k2 in a --vllm export: the exporter already added +1") if _kimi(p)
          else ("output-of-layer", f"_torchspec_version in a --vllm export (layers.0.* names) of model type "
                f"{(p.config or {}).get('model_type')!r}: {TRAINED} adds +1 for kimi_k2 only, so these are layer outputs"))
    view = hf_view(p.config, aux_fingerprint=fp, aux_notes=NOTES)
    ck = derive(p.folder, p.store, p.scan, view, producer="torchspec", layout="torchspec-vllm", raw_config=p.config,
                quantization=quant_scheme(p.config))
    ck.meta["torchspec_version"] = (p.config or {}).get("_torchspec_version") or p.st_metadata.get("torchspec_version")
    return ck


NATIVE = register_layout(Layout("torchspec", "torchspec", _sniff_native, _read_native, "TorchSpec native: midlayer.*, _torchspec_version"))
VLLM_EXPORT = register_layout(Layout("torchspec-vllm", "torchspec", _sniff_vllm, _read_vllm, "TorchSpec convert_to_hf.py --vllm: layers.0.*"))
