"""FP8 / NVFP4 drafters in the compressed-tensors format vLLM serves (docs/quantize.md).

The compressed-tensors library (pinned by vLLM; 0.17 here) describes and packs the format: its presets give the
``QuantizationArgs``, ``calculate_qparams`` / ``generate_gparam`` the scales, and its compressors
(``float-quantized``, ``nvfp4-pack-quantized``) quantize and pack each Linear's per-module state dict. Drafters have
no transformers class, so everything works on state dicts named in the vLLM layout (``layers.0.self_attn.q_proj``).

What is written (shared/reference quant-formats.md §2-§4):
* ``config.json`` gets the minimal, portable ``quantization_config`` at the top level (no key an older
  compressed-tensors reader rejects); ``ignore`` uses vLLM's runtime names (``lm_head``, ``re:.*fc$``).
* per quantized Linear: FP8 ``weight`` (float8_e4m3fn) + ``weight_scale`` (+ ``input_scale`` for static FP8);
  NVFP4 ``weight_packed`` (uint8, two E2M1 codes per byte, low nibble first) + ``weight_scale`` (float8 [out, in/16])
  + ``weight_global_scale`` (fp32 [1], a divisor) (+ ``input_global_scale`` for W4A4). No zero points.
* q/k/v share one NVFP4 global scale and gate/up one (vLLM fuses them and keeps one).
* everything else (norms, ``embed_tokens``, ``lm_head``, ``d2t``; ``fc`` unless asked) is copied unchanged.

The format itself lives one layer down in ``eagle_migrate.quant`` (the loader dequantises through it; these names
are re-exported here): ``schemes`` (one config class per scheme, the handler registry, the ``quantization_config``
block), ``handlers`` (each scheme's pack / input-scale / activation handler), ``numerics`` (one tensor through
compressed-tensors), ``linears`` (which Linears, which are fused), ``pack`` (a state dict quantized and back),
``calibrate_acts`` (activation ranges), ``gate`` (acceptance before / after), ``options`` (QuantizeOptions),
``stage`` (``quantize()``).
"""

from __future__ import annotations

from ..exports import lazy_exports
from .options import QuantizeOptions

# its own names; quant's (quant.__all__: the format's) are re-exported too, on first use
__all__ = [
    "AcceptanceReport", "CalibrationReport", "QuantizeOptions", "QuantizeResult", "SuiteDrop", "ValidateMode",
    "activation_ranges", "calibrate_activations", "default_suites", "quantize", "write_quantized",
]

# the torch side and the format's names (quant/), imported on first use: ``quantize.options`` imports without torch
__getattr__ = lazy_exports(__name__, {
    **dict.fromkeys(("CalibrationReport", "activation_ranges", "calibrate_activations"), ".calibrate_acts"),
    **dict.fromkeys(("AcceptanceReport", "SuiteDrop", "ValidateMode", "default_suites"), ".gate"),
    **dict.fromkeys(("QuantizeResult", "quantize", "write_quantized"), ".stage")}, rest="eagle_migrate.quant")
