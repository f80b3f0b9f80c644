"""The drafter families (``DrafterConfig.architecture``): one module each, one registry here.

Everything that differs between decoder-layer families lives in its module (``llama.py``, ``qwen3.py``, ``mla.py``),
in two parts: the family's row (``base.FamilyRow``: config keys and architecture names for vLLM, speculators and
transformers, weight names, what the writers leave out, what quantize fuses, inspect's trap rows) and its behaviour
(``base.Family`` or a subclass: the attention module, rope rules, sizes from the weights, checks). The rest of the
package asks the family (``families.get(cfg.architecture)``) and never tests a name. Adding a family:
docs/extending.md ("Add a drafter family").

Imports only ``errors``, pydantic and the family modules (which import only ``errors`` and ``families.base``): below
drafter / formats / quant, which ask it; no torch (the attention modules import it when one is built).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, create_model

from ..errors import UnsupportedError
from .base import Family, FamilyRow, cfg_flag, cfg_int, rope_parameters_of
from .llama import LLAMA
from .mla import MLA_FAMILY
from .qwen3 import QWEN3

__all__ = ["DEFAULT", "Family", "FamilyRow", "all_families", "cfg_flag", "cfg_int", "config_family", "config_fields_model",
           "detect", "find", "get", "names", "names_text", "register", "report_fields_model", "rope_parameters_of",
           "trap_rows", "vllm_cpu_attention"]

_REGISTRY: dict[str, Family] = {}
_BUILT: set[str] = set()  # what was built from the registry at import (DrafterConfig's fields, the trap table)


def register(family: Family) -> Family:
    """Add ``family`` (a :class:`Family`, or an instance of a subclass, built on its :class:`FamilyRow`) under
    ``family.name``. A family registered after DrafterConfig and the trap table were built may add neither config
    fields nor trap rows (they would be missing there): such a family belongs in the built-in list below."""
    if family.name in _REGISTRY:
        raise ValueError(f"a drafter family named {family.name!r} is already registered")
    brings = (("config fields", family.config_fields or family.report_fields), ("trap rows", family.traps))
    late = [what for what, has in brings if has and what in _BUILT]
    if late:
        raise ValueError(f"family {family.name!r} brings {' and '.join(late)} after they were built: add its module to "
                         "the built-in list of eagle_migrate/families/__init__.py")
    _REGISTRY[family.name] = family
    return family


# the built-in families, in the order they are tried and listed (one line per family)
register(LLAMA)
register(QWEN3)
register(MLA_FAMILY)
DEFAULT = LLAMA  # what a drafter is when nothing says otherwise (the generic EAGLE-3 layer)


def find(name: str) -> Family | None:
    """The family registered as ``name``, else None."""
    return _REGISTRY.get(name)


def get(name: str) -> Family:
    """The family registered as ``name``; UnsupportedError for any other name."""
    fam = _REGISTRY.get(name)
    if fam is None:
        raise UnsupportedError(f"no drafter family {name!r} (families: {', '.join(_REGISTRY)})",
                               "add it as docs/extending.md shows")
    return fam


def all_families() -> list[Family]:
    return list(_REGISTRY.values())


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def names_text() -> str:
    """``llama, qwen3 or mla``: the registered names for descriptions."""
    ns = list(_REGISTRY)
    return ns[0] if len(ns) == 1 else f"{', '.join(ns[:-1])} or {ns[-1]}"


# ----- deciding a checkpoint's family ---------------------------------------------------------------------------------
def config_family(flat: dict[str, Any], layout: str) -> tuple[str | None, str]:
    """The drafter family vLLM would build from the config alone, and the key that decides it.

    The speculators layout: ``transformer_layer_config.model_type`` (vLLM maps a family's model type to its drafter
    class; none -> the default family); every other layout: the first known architecture (``config_archs``), else
    ``model_type``. None when the config says nothing we know."""
    mt = flat.get("model_type")
    archs = flat.get("architectures") if isinstance(flat.get("architectures"), list) else []
    fams = [f for f in _REGISTRY.values() if f.config_archs or f.config_model_types]
    if layout == "speculators":
        if mt is None:
            return DEFAULT.name, f"transformer_layer_config.model_type (none: {DEFAULT.name})"
        fam = next((f for f in fams if mt in f.config_model_types), None)
        return (fam.name, f"transformer_layer_config.model_type {mt}") if fam else (None, "")
    for a in archs:
        fam = next((f for f in fams if a in f.config_archs), None)
        if fam is not None:
            return fam.name, f"architectures {a}"
    fam = next((f for f in fams if mt in f.config_model_types), None)
    if fam is not None:
        return fam.name, f"model_type {mt}"
    return None, ""


def detect(names: list[str], flat: dict[str, Any], layout: str) -> tuple[Family, Any, tuple[str | None, str]]:
    """``(family, its evidence in the weights, config_family)`` of a checkpoint, evidence first: a family that claims
    the weights or config outright (MLA's projections), then a family whose own tensors are in the weights (Qwen3's
    q/k norms), then the config as vLLM reads it, else :data:`DEFAULT`."""
    cf = config_family(flat, layout)
    fam = next((f for f in _REGISTRY.values() if f.claims(names, flat)), None)
    if fam is None:
        fam = next((f for f in _REGISTRY.values() if f.weight_evidence(names)), None)
    if fam is None:
        fam = _REGISTRY[cf[0]] if cf[0] is not None else DEFAULT
    return fam, fam.weight_evidence(names), cf


def vllm_cpu_attention(config: dict[str, Any]) -> bool:
    """One level of a model's config.json asks vLLM's CPU platform for a family's own attention backend
    (``Family.vllm_cpu_attention``; engines/attention_backend.py picks it)."""
    return any(f.vllm_cpu_attention(config) for f in _REGISTRY.values())


# ----- what the families add to the models and the trap table -------------------------------------------------------
def _fields_model(model_name: str, attr: str) -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for fam in _REGISTRY.values():
        for k, v in getattr(fam, attr).items():
            if k in fields:
                raise ValueError(f"two families declare the {attr} entry {k!r}")
            fields[k] = v
    _BUILT.add("config fields")
    return create_model(model_name, **fields)


def config_fields_model() -> type[BaseModel]:
    """A pydantic model of every family's own DrafterConfig fields (``Family.config_fields``), in registry order."""
    return _fields_model("FamilyConfigFields", "config_fields")


def report_fields_model() -> type[BaseModel]:
    """A pydantic model of every family's own fields of inspect's report sizes (``Family.report_fields``)."""
    return _fields_model("FamilyReportFields", "report_fields")


def trap_rows() -> list[tuple[str, str, str, tuple[str, ...]]]:
    """Every family's rows for formats/traps.py's table, in registry order."""
    _BUILT.add("trap rows")
    return [row for fam in _REGISTRY.values() for row in fam.traps]
