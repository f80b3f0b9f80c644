"""The compressed-tensors format of a drafter's weights, below every stage: the schemes and their handlers,
registered by name (registry; the built-in ones in schemes and handlers, both imported here so every use of this
package finds them), one tensor packed and unpacked (numerics), which Linears are quantized and fused (linears), a
state dict quantized and dequantized (pack). No target, no data, no stage: the one loader (``loader.py``) dequantises a
quantized checkpoint through it, and the ``quantize`` stage packs through it (``quantize`` re-exports these names).
Imports: torch, pydantic, ``errors``, ``choices``, ``families``, ``drafter.config`` (compressed-tensors lazily).
"""

from __future__ import annotations

from . import registry, schemes
from .handlers import activation_hook  # the built-in handlers register themselves
from .linears import fused_groups, linear_prefixes
from .numerics import decompress_layer, err_stats, fp8_weight, nvfp4_global_scale, nvfp4_weight
from .pack import LayerReport, dequantize_state_dict, quantize_state_dict
from .registry import SCHEMES, SchemeConfig, SchemeHandler, get_scheme, handler_for, register_handler, register_scheme
from .schemes import FC_IGNORE, LM_HEAD, SchemeName, ignore_list, quantization_config, scheme_from_config

__all__ = [
    "FC_IGNORE", "LM_HEAD", "SCHEMES", "LayerReport", "SchemeConfig", "SchemeHandler", "SchemeName",
    "activation_hook", "decompress_layer", "dequantize_state_dict", "err_stats", "fp8_weight", "fused_groups",
    "get_scheme", "handler_for", "ignore_list", "linear_prefixes", "nvfp4_global_scale", "nvfp4_weight",
    "quantization_config", "quantize_state_dict", "register_handler", "register_scheme", "registry", "scheme_from_config",
    "schemes",
]
