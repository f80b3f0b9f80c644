"""The built-in scheme handlers, one registered per scheme (``registry.register_handler``): how a scheme packs
a fused group of weights, which static input scale it stores for a calibrated activation range, and how vLLM's kernel
treats a Linear's input (the reference engine's fake quantization, through compressed-tensors' own functions).

Imports: ``quant.registry``, ``quant.schemes``, ``quant.numerics`` (compressed-tensors lazily).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .numerics import (
    eager,
    fp8_input_scale,
    fp8_weight,
    nvfp4_global_scale,
    nvfp4_input_global_scale,
    nvfp4_weight,
)
from .registry import SchemeConfig, SchemeHandler, get_scheme, handler_for, register_handler
from .schemes import NVFP4, NVFP4A16, FP8Dynamic, FP8Static


def activation_hook(scheme: str | SchemeConfig, local: dict[str, Any]) -> Callable | None:
    """A forward-pre-hook that fake-quantizes a Linear's input as vLLM's kernel would for ``scheme`` (``local``: the
    Linear's stored input scales): per token FP8 (fp8-dynamic), static per-tensor FP8 (fp8), FP4 in groups of 16
    under the calibrated global scale (nvfp4); None for weight-only nvfp4a16."""
    spec = get_scheme(scheme)
    return handler_for(spec).activation_hook(spec, local)


def _input_hook(fake_quant):
    """A forward-pre-hook applying ``fake_quant(x_fp32, module)`` to a Linear's input (in the input's dtype)."""

    def hook(m, inputs):
        x = inputs[0]
        return (fake_quant(x.float(), m).to(x.dtype), *inputs[1:])

    return hook


class _FP8Weights(SchemeHandler):
    """FP8 weights: each Linear on its own (per channel or per tensor, as the preset says)."""

    def pack_group(self, scheme, weights):
        return {p: fp8_weight(w, scheme, w.dtype) for p, w in weights.items()}, None


class _NVFP4Weights(SchemeHandler):
    """NVFP4 weights: one global scale over the fused group, then FP4 codes in groups of 16."""

    def pack_group(self, scheme, weights):
        gs = nvfp4_global_scale(list(weights.values()))
        return {p: nvfp4_weight(w, gs) for p, w in weights.items()}, gs


@register_handler(FP8Dynamic)
class FP8DynamicHandler(_FP8Weights):
    """FP8 activations with a dynamic per-token scale (no stored input scale)."""

    def activation_hook(self, scheme: SchemeConfig, local: dict[str, Any]):
        from compressed_tensors.quantization.lifecycle.forward import fake_quantize  # lazy: compressed-tensors imports transformers (seconds)
        from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp  # lazy: compressed-tensors imports transformers (seconds)

        args = scheme.ct_scheme().input_activations

        def fq(x, m):
            sc, _ = compute_dynamic_scales_and_zp(x, args, m)
            return fake_quantize(x, sc, None, args)

        return _input_hook(fq)


@register_handler(FP8Static)
class FP8StaticHandler(_FP8Weights):
    """FP8 activations with one static per-tensor ``input_scale`` = amax / 448."""

    def input_scale(self, scheme, amax, source_dtype):
        return "input_scale", fp8_input_scale(amax, scheme.ct_scheme().input_activations, source_dtype)

    def activation_hook(self, scheme, local):
        from compressed_tensors.quantization.lifecycle.forward import fake_quantize  # lazy: compressed-tensors imports transformers (seconds)

        args = scheme.ct_scheme().input_activations
        scale = local["input_scale"].float().reshape(1)
        return _input_hook(lambda x, _m: fake_quantize(x, scale, None, args))


@register_handler(NVFP4A16)
class NVFP4A16Handler(_NVFP4Weights):
    """16-bit activations: nothing to store or simulate."""


@register_handler(NVFP4)
class NVFP4Handler(_NVFP4Weights):
    """FP4 activations in groups of 16 under a calibrated ``input_global_scale`` = 2688 / amax."""

    def input_scale(self, scheme, amax, source_dtype):
        return "input_global_scale", nvfp4_input_global_scale(amax)

    def activation_hook(self, scheme, local):
        from compressed_tensors.quantization.lifecycle.forward import fake_quantize  # lazy: compressed-tensors imports transformers (seconds)
        from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp  # lazy: compressed-tensors imports transformers (seconds)

        args = scheme.ct_scheme().input_activations
        gs = local["input_global_scale"].float().reshape(1)

        def fq(x, m):
            sc, _ = compute_dynamic_scales_and_zp(x, args, m, global_scale=gs)
            with eager():
                return fake_quantize(x, sc, None, args, global_scale=gs)

        return _input_hook(fq)

