"""Reader of the vLLM layout (the writer is ``formats/vllm.py``): an HF-format EAGLE-3 drafter with ``layers.N.``
names and an ``*Eagle3*`` architecture (what ``vllm serve --speculative-config '{"method": "eagle3"}'`` loads), and
vLLM-V0's EAGLE-1 format (``model_type: eagle`` with a nested ``model`` config).

Producer: ``eagle-migrate`` when our writer's ``eagle_migrate`` key is present, ``vllm`` for an Eagle3
architecture of no other recognisable origin, ``unknown`` when there is no config to tell. Aux ids: our writer's
``eagle_migrate`` key is a fingerprint (it stores vLLM ids); without it the layout alone does not tell the convention
(exporters that copy training ids unchanged write the same layout): measured with a target.
"""

from __future__ import annotations

from .base import Checkpoint, Layout, Probe, register_layout
from .common import CARRIED_NOTE, derive, hf_view, is_eagle3_arch, our_fingerprint, quant_scheme, weights_generation


NOTES = {
    "vllm": ["layers.N.* + an Eagle3 architecture: the layout vLLM serves, reading the ids literally"],
    "output-of-layer": ["exporters that copy training ids unchanged (TorchSpec --vllm for non-kimi_k2 models, "
                        "hand-made conversions of SpecForge/ModelOpt drafters) write the same layout"],
}


def _sniff(p: Probe) -> int:
    if p.scan.midlayer or weights_generation(p) != "eagle3":
        return 0
    if any(k in (p.config or {}) for k in ("speculators_model_type",)):
        return 0
    if isinstance((p.config or {}).get("eagle_migrate"), dict):
        return 30
    if any(is_eagle3_arch(a) for a in p.architectures):
        return 20
    return 5  # layers.0.* weights of unknown origin


def _read(p: Probe) -> Checkpoint:
    cfg = p.config or {}
    if isinstance(cfg.get("eagle_migrate"), dict):
        producer = "eagle-migrate"
    elif any(is_eagle3_arch(a) for a in p.architectures):
        producer = "vllm"
    else:
        producer = "unknown"
    fp = our_fingerprint(cfg)
    notes = NOTES
    if producer == "eagle-migrate" and fp is None:
        notes = {**NOTES, "vllm": [CARRIED_NOTE, *NOTES.get("vllm", [])]}
    view = hf_view(cfg, nbr_default=False, aux_fingerprint=fp, aux_notes=notes)
    return derive(p.folder, p.store, p.scan, view, producer=producer, layout="vllm", raw_config=p.config,
                  quantization=quant_scheme(p.config, p.side.get("hf_quant_config.json")))


VLLM = register_layout(Layout("vllm", "vllm", _sniff, _read, "HF-format EAGLE-3 drafter with layers.N.* names (vLLM / eagle-migrate)"))


def _sniff_v0(p: Probe) -> int:
    cfg = p.config or {}
    return 90 if cfg.get("model_type") == "eagle" and isinstance(cfg.get("model"), dict) else 0


def _read_v0(p: Probe) -> Checkpoint:
    cfg = p.config or {}
    inner = dict(cfg["model"])
    view = hf_view(inner)
    ck = derive(p.folder, p.store, p.scan, view, producer="vllm", layout="vllm-v0-eagle", raw_config=p.config,
                quantization=quant_scheme(p.config))
    return ck


VLLM_V0 = register_layout(Layout("vllm-v0-eagle", "vllm", _sniff_v0, _read_v0,
                                 "vLLM V0 EAGLE-1 format: model_type 'eagle' with a nested 'model' config"))
