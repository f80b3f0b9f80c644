"""NVIDIA ModelOpt EAGLE-3 export (``modelopt/torch/export/plugins/hf_spec_export.py``).

``layers.N.*`` names from a fixed key set (``layers.0.{self_attn.*, mlp.*, hidden_norm, input_layernorm,
post_attention_layernorm}``, ``norm``, ``fc``; optional ``d2t``, ``lm_head`` -- the base model's head [V, H] is
copied in when the draft has none); model.safetensors + config.json from a template: ``LlamaForCausalLMEagle3``
(or another family's drafter architecture, e.g. with ``model_type: kimi_k2``) with ``eagle_config.{
eagle_aux_hidden_state_layer_ids, use_aux_hidden_state, use_input_layernorm_in_first_layer, use_last_layernorm,
use_mtp_layernorm, next_layer_regular, parallel_draft_step, ...}``; no ``target_hidden_size``; quantized exports add
``quantization_config`` and ``hf_quant_config.json``.

Aux ids: ModelOpt's HF plugin captures them with a forward hook on the decoder layer's *output*
(default ``[1, L//2 - 1, L - 4]`` via ``list(set(...))``, so possibly unsorted) and the exporter copies them
unchanged, which speaks for output-of-layer. But the ``eagle_config.use_*`` keys identify the config template, not
what the ids mean after a hand fix, and NVIDIA's exported drafters are served by vLLM with the ids read literally
(sglang#32334 disputes one): the convention is measured with a target, not taken from the producer, except where
the readings are equivalent on that target: then ModelOpt's own training convention is written (:data:`PRODUCER`).
"""
from __future__ import annotations

from .base import Checkpoint, Layout, Probe, register_layout
from .common import derive, hf_view, quant_scheme, weights_generation

MODELOPT_EAGLE_KEYS = ("use_input_layernorm_in_first_layer", "use_last_layernorm", "use_mtp_layernorm", "next_layer_regular")


NOTES = {
    "output-of-layer": ["ModelOpt's training plugin hooks decoder-layer outputs and its exporter copies the ids"],
    "vllm": ["ModelOpt-exported drafters are served by vLLM with the ids read literally; the eagle_config.use_* "
             "keys survive hand-fixed ids (sglang#32334)"],
}


# nvidia-modelopt 0.47.0 plugins/hf_eagle.py: register_forward_hook on base_model.layers[i] for i in the ids
# (_collect_aux_hidden_states_forward_hook keeps the layer's output); default sorted({1, L // 2 - 1, L - 4})
PRODUCER = ("output-of-layer", "ModelOpt 0.47.0 trains on a forward hook on decoder layer id, i.e. that layer's output "
                               "(plugins/hf_eagle.py, _collect_aux_hidden_states_forward_hook)")


def _sniff(p: Probe) -> int:
    if weights_generation(p) != "eagle3":
        return 0
    ec = (p.config or {}).get("eagle_config")
    if isinstance(ec, dict) and any(k in ec for k in MODELOPT_EAGLE_KEYS):
        return 70
    hq = p.side.get("hf_quant_config.json") or {}
    if isinstance(hq.get("producer"), dict) and str(hq["producer"].get("name", "")).lower() == "modelopt":
        return 65
    return 0


def _read(p: Probe) -> Checkpoint:
    view = hf_view(p.config, nbr_default=False, aux_notes=NOTES, aux_producer=PRODUCER)
    return derive(p.folder, p.store, p.scan, view, producer="modelopt", layout="modelopt", raw_config=p.config,
                  quantization=quant_scheme(p.config, p.side.get("hf_quant_config.json")))


MODELOPT = register_layout(Layout("modelopt", "modelopt", _sniff, _read, "ModelOpt export: layers.0.*, eagle_config.use_* keys"))
