"""SpecForge (sgl-project/SpecForge ``specforge/modeling/draft/llama3_eagle.py``) after ``specforge export``.

``midlayer.*`` names, model.safetensors (bf16), ``LlamaForCausalLMEagle3`` config; ``t2d`` and ``d2t`` always (an
identity ``d2t`` when Vd = V, which vLLM >= 0.30 rejects); ``embed_tokens`` dropped by ``--to sglang``, included by
``--to hf``. ``head_dim`` honoured; ``fc_norm`` list fixed at 3. Aux layer ids: SpecForge training captures layer
outputs (SGLang adds +1 to the config's ids), but nothing SpecForge writes is unique to it: SGLang repacks,
hand-fixed configs and other converters have the same shape and are served by vLLM, which reads the ids literally.
So the layout never decides the convention (docs/formats.md, aux-id decision table): a target measures it. Where
the readings are equivalent on that target, SpecForge's own training convention is written (:data:`PRODUCER`).
``norm_output`` before SpecForge PR #879 only gated the norm in front of ``lm_head`` (pre-norm state fed back).
"""

from __future__ import annotations

from .base import Checkpoint, Layout, Probe, register_layout
from .common import derive, finding, hf_view, is_eagle3_arch, quant_scheme, weights_generation


NOTES = {
    "output-of-layer": ["SpecForge / SGLang training captures layer outputs (SGLang adds +1 to config ids)"],
    "vllm": ["midlayer.* + an Eagle3 architecture is also what SGLang repacks and hand-fixed configs look like, "
             "served by vLLM with the ids read literally"],
}


# specforge 0.2.0 captures through SGLang (offline_capture/sglang_backend: set_eagle3_layers_to_capture(layer_ids)),
# whose models set layers_to_capture = [id + 1 for id in layer_ids] and take the input of those layers: stored id k is
# the output of layer k, vLLM id k + 1; its default (algorithms/model_providers.py) is [1, L // 2 - 1, L - 4]
PRODUCER = ("output-of-layer", "SpecForge 0.2.0 trains on SGLang's capture, which takes the input of layer id + 1, "
                               "i.e. the output of layer id (set_eagle3_layers_to_capture)")


def _sniff(p: Probe) -> int:
    if not p.scan.midlayer or weights_generation(p) != "eagle3":
        return 0
    if not any(is_eagle3_arch(a) for a in p.architectures):
        return 0
    score = 40
    if "t2d" in p.scan.name_map and "d2t" in p.scan.name_map:
        score += 5
    return score


def _read(p: Probe) -> Checkpoint:
    view = hf_view(p.config, nbr_default=False, aux_notes=NOTES, aux_producer=PRODUCER)
    ck = derive(p.folder, p.store, p.scan, view, producer="specforge", layout="specforge", raw_config=p.config,
                quantization=quant_scheme(p.config))
    if (p.config or {}).get("norm_output") is False:
        # specforge 0.2.0 llama3_eagle.py: norm_output = getattr(config, "norm_output", True); compute_logits applies
        # self.norm before lm_head only when it is true
        ck.findings.append(finding(
            "warning", "specforge_norm_output_false",
            "norm_output: false in a SpecForge export: SpecForge (0.2.0, before PR #879) then trains lm_head on the "
            "state without the final norm, while vLLM always applies norm before lm_head: check the SpecForge "
            "version, or validate the acceptance length"))
    return ck


SPECFORGE = register_layout(Layout("specforge", "specforge", _sniff, _read, "SpecForge export: midlayer.*, LlamaForCausalLMEagle3, t2d/d2t always"))
