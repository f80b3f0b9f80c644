"""TorchSpec (lightseekorg/TorchSpec ``torchspec/models/draft/llama3_eagle.py``; EAGLE-3.1 in PR #97).

* native (``tools/convert_to_hf.py`` without ``--vllm``): ``midlayer.*`` names, model.safetensors with header
  metadata ``torchspec_version``, config with top-level ``_torchspec_version``; ``embed_tokens`` included;
  ``d2t``/``t2d`` only with ``--prune-vocab`` (Vd != V). Aux ids (``eagle_aux_hidden_state_layer_ids``, top level
  or in ``eagle_config``) are the training convention: output of layer k (SGLang's) = vLLM id k + 1.
* ``--vllm`` export: ``midlayer.`` -> ``layers.0.``; ``_fixup_export_config`` adds +1 to the ids **only when
  ``model_type == "kimi_k2"``** ("vLLM uses 1-indexed layer IDs for kimi_k2"). We read ``--vllm`` ids as vLLM ids
  (what vLLM will do) and warn for other model types that the converter did not shift them.
"""

from __future__ import annotations

from .base import Checkpoint, Layout, Probe, register_layout
from .common import derive, finding, hf_view, quant_scheme, weights_generation


def _is_torchspec(p: Probe) -> bool:
    return "_torchspec_version" in (p.config or {}) or "torchspec_version" in p.st_metadata


def _sniff_native(p: Probe) -> int:
    return 80 if _is_torchspec(p) and p.scan.midlayer and weights_generation(p) == "eagle3" else 0


def _sniff_vllm(p: Probe) -> int:
    return 80 if _is_torchspec(p) and not p.scan.midlayer and weights_generation(p) == "eagle3" else 0


def _read_native(p: Probe) -> Checkpoint:
    view = hf_view(p.config, aux_offset=1, convention="output-of-layer")
    ck = derive(p.folder, p.store, p.scan, view, producer="torchspec", layout="torchspec", raw_config=p.config,
                quantization=quant_scheme(p.config))
    ck.meta["torchspec_version"] = (p.config or {}).get("_torchspec_version") or p.st_metadata.get("torchspec_version")
    return ck


def _read_vllm(p: Probe) -> Checkpoint:
    view = hf_view(p.config)
    ck = derive(p.folder, p.store, p.scan, view, producer="torchspec", layout="torchspec-vllm", raw_config=p.config,
                quantization=quant_scheme(p.config))
    ck.meta["torchspec_version"] = (p.config or {}).get("_torchspec_version") or p.st_metadata.get("torchspec_version")
    if view.aux_ids is not None and (p.config or {}).get("model_type") != "kimi_k2":
        ck.findings.append(finding(
            "warning", "aux_ids_convention_uncertain",
            f"TorchSpec's --vllm export shifts aux ids by +1 only for kimi_k2; these ids {view.aux_ids} were copied "
            f"unchanged. If training captured layer outputs, vLLM needs {[i + 1 for i in view.aux_ids]}: validate the acceptance length"))
    return ck


NATIVE = register_layout(Layout("torchspec", "torchspec", _sniff_native, _read_native, "TorchSpec native: midlayer.*, _torchspec_version"))
VLLM_EXPORT = register_layout(Layout("torchspec-vllm", "torchspec", _sniff_vllm, _read_vllm, "TorchSpec convert_to_hf.py --vllm: layers.0.*"))
