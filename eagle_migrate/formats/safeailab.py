"""SafeAILab/EAGLE layouts.

* EAGLE-3 (``eagle/traineagle3/``): ``midlayer.*`` names, ``state_{epoch}/pytorch_model.bin`` (fp16), saved with
  ``exclude_frozen_parameters`` (no embedding unless ``target_hidden_size``); the trainer writes **no config.json**
  (Hub copies say ``LlamaForCausalLM`` + ``draft_vocab_size``). ``d2t`` and ``t2d`` always. Aux layers are
  hard-coded to vLLM's convention (2, L//2, L-3) and never stored (ids added to a config by hand are read
  like any other unfingerprinted ids: measured with a target).
* EAGLE-1/2 (``eagle/model/cnets1.py``): ``pytorch_model.bin`` + plain ``LlamaForCausalLM`` config, ``fc`` [H, 2H]
  over cat(embedding, last target hidden) with a bias unless ``"bias": false``, ``layers.0.*`` without
  ``input_layernorm``, ``embed_tokens`` saved, no ``norm`` and no ``lm_head`` (the target's head is reused).
"""

from __future__ import annotations

from .base import Checkpoint, Layout, Probe, register_layout
from .common import derive, hf_view, is_eagle3_arch, quant_scheme, weights_generation
from .traps import finding


def _sniff3(p: Probe) -> int:
    if not p.scan.midlayer or weights_generation(p) != "eagle3":
        return 0
    eagle_arch = any(is_eagle3_arch(a) for a in p.architectures)
    if not eagle_arch:
        return 50
    return 25 if p.has_bin else 0


def _read3(p: Probe) -> Checkpoint:
    view = hf_view(p.config, nbr_default=False)
    ck = derive(p.folder, p.store, p.scan, view, producer="safeailab", layout="safeailab-eagle3", raw_config=p.config,
                quantization=quant_scheme(p.config))
    if p.config is None:
        ck.findings.append(_no_config())
    return ck


def _no_config():
    return finding("warning", "config_missing", "no config.json (the SafeAILab trainer writes none): sizes come from the weights; rope_theta, rms_norm_eps and max_position_embeddings must be copied from the target")


def _sniff2(p: Probe) -> int:
    return 60 if weights_generation(p) == "eagle2" else 0


def _read2(p: Probe) -> Checkpoint:
    cfg = p.config or {}
    view = hf_view(cfg)
    ck = derive(p.folder, p.store, p.scan, view, producer="safeailab", layout="safeailab-eagle2", raw_config=p.config,
                quantization=quant_scheme(p.config))
    bias_cfg = cfg.get("bias")

    if isinstance(bias_cfg, bool) and bias_cfg != ck.config.fc_bias:
        ck.findings.append(finding("warning", "fc_bias_mismatch", f"config 'bias': {str(bias_cfg).lower()} but fc.bias is {'present' if ck.config.fc_bias else 'absent'} (loaders that trust the flag break: vllm#11126)"))
    ck.findings.append(finding("info", "eagle2_generation", "EAGLE-1/2 weights (fc over cat(embedding, last hidden), no lm_head): vLLM >= 0.10 serves EAGLE-3 only; convert with `eagle-migrate convert`"))
    if p.config is None:
        ck.findings.append(_no_config())
    return ck


EAGLE3 = register_layout(Layout("safeailab-eagle3", "safeailab", _sniff3, _read3, "SafeAILab EAGLE-3: midlayer.*, pytorch_model.bin, config optional"))
EAGLE2 = register_layout(Layout("safeailab-eagle2", "safeailab", _sniff2, _read2, "SafeAILab EAGLE-1/2: fc [H, 2H], no lm_head"))
