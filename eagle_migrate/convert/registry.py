"""The converters, one per source generation, registered by name: what a :class:`Converter` is (its
:class:`Traits`, which drafters it accepts, the aux ids it reads, its *init* step), :func:`register_converter`, and
:func:`converter_for`, which gives the converter asked for by name, or with ``"auto"`` finds the one registered
converter that accepts a drafter (two that both accept it are a bug, reported as one; a converter asked for by name
only, such as the control arm ``keep-architecture``, is never picked so). The built-in converters (``eagle3``, ``eagle2``, ``passthrough``) register themselves
when their modules are imported; the skeleton (``base.py``) imports them. This module imports none of them.
Imports: drafter.config, errors, formats.aux_ids, stats (types), convert.{read, result, write}."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar

from ..drafter.config import DrafterConfig
from ..errors import InputError, a_an
from ..formats.aux_ids import AuxIds
from ..stats import TargetStatistics
from .read import Job, decide_aux_ids
from .result import Agreement, Eagle2Mapping, NormInit, NormOutputCompensation
from .write import OutputPlan


@dataclass(frozen=True)
class Traits:
    """What the skeleton needs to know of a converter, beyond its steps."""

    passthrough: bool = False  # the source is re-written as it is
    uses_data: bool = True  # reads calibration data (picks a default set for a real target)
    calibration_required: bool = False  # the output is a warm start that needs the fine-tune
    calibrate_by_default: bool = True  # calibrate=None runs the fine-tune
    judged_against_source: bool = False  # the fine-tune's judge also scores the source drafter


@dataclass
class Initialised:
    """What a converter's *init* step produces: the output plan and how it was initialised and measured."""

    plan: OutputPlan
    norm_init: NormInit | None = None
    norm_output: NormOutputCompensation | None = None
    agreement: Agreement = field(default_factory=Agreement)
    statistics: TargetStatistics | None = None
    eagle2_mapping: Eagle2Mapping | None = None


class Converter(ABC):
    """One source generation -> EAGLE-3.1, registered under its ``name`` (:func:`register_converter`)."""

    name: ClassVar[str]
    traits: ClassVar[Traits] = Traits()
    by_name_only: ClassVar[bool] = False  # asked for by name (converter_for(cfg, name)), never picked by "auto"

    @classmethod
    @abstractmethod
    def accepts(cls, cfg: DrafterConfig) -> bool:
        """Whether this converter converts a drafter with config ``cfg`` (exactly one registered converter does)."""

    def aux_ids(self, job: Job) -> tuple[AuxIds | None, list[int]]:
        """The aux ids in vLLM's convention (EAGLE-3 and 3.1 sources: the stored ones, decided)."""
        return decide_aux_ids(job)

    @classmethod
    def refusal(cls, cfg: DrafterConfig) -> InputError:
        """Why this converter, asked for by name, does not convert ``cfg`` (exit 2)."""
        return InputError(f"the {cls.name} converter does not convert {a_an(cfg.generation)} drafter")

    @abstractmethod
    def init(self, job: Job) -> Initialised: ...


C = TypeVar("C", bound=type[Converter])
CONVERTERS: dict[str, type[Converter]] = {}


def register_converter(cls: C) -> C:
    """Class decorator: register a converter under its ``name`` (one per name)."""
    if cls.name in CONVERTERS:
        raise ValueError(f"a converter named {cls.name!r} is already registered ({CONVERTERS[cls.name].__name__})")
    CONVERTERS[cls.name] = cls
    return cls


def converter_for(cfg: DrafterConfig, name: str = "auto") -> Converter:
    """The converter ``name`` (its :meth:`Converter.refusal` when it does not accept ``cfg``), or with ``"auto"`` the
    one registered converter, not asked for by name only, that accepts ``cfg``: InputError when none does; a
    RuntimeError naming them when several do (their ``accepts`` overlap: a bug, never decided by registration
    order)."""
    if name != "auto":
        if name not in CONVERTERS:
            raise InputError(f"no converter named {name!r}", f"choose from {', '.join(sorted(CONVERTERS))}")
        cls = CONVERTERS[name]
        if not cls.accepts(cfg):
            raise cls.refusal(cfg)
        return cls()
    found = [cls for cls in CONVERTERS.values() if not cls.by_name_only and cls.accepts(cfg)]
    if not found:
        raise InputError(f"no converter for {a_an(cfg.generation)} drafter")
    if len(found) > 1:
        raise RuntimeError(f"converters {', '.join(c.name for c in found)} all accept this {cfg.generation} drafter")
    return found[0]()
