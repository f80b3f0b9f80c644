"""The one representation every producer layout is read into, and the registry of layouts.

A ``Checkpoint`` is lazy: it holds the parsed ``DrafterConfig``, the producer, and a map from canonical
(vLLM-layout) tensor names to the names stored on disk; tensors are read one at a time on demand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal

from pydantic import BaseModel, Field

from ..drafter.config import DrafterConfig
from .io import TensorInfo, TensorStore

if TYPE_CHECKING:  # reading a checkpoint's headers (inspect) never imports torch
    import numpy as np
    import torch

Severity = Literal["error", "warning", "info"]


class Finding(BaseModel):
    """One problem or remark about a checkpoint (or a drafter/target pair)."""

    severity: Severity
    code: str = Field(..., description="stable identifier, e.g. aux_ids_out_of_range")
    message: str


@dataclass
class Checkpoint:
    path: Path
    config: DrafterConfig
    producer: str
    store: TensorStore
    name_map: dict[str, str]  # canonical name -> stored name
    raw_config: dict[str, Any] | None = None
    quantization: dict[str, Any] | None = None
    findings: list[Finding] = field(default_factory=list)
    layout: str = ""  # the reader that parsed it (e.g. "vllm", "safeailab-eagle3")
    # canonical name -> function producing the tensor when the stored tensor needs a transform
    transforms: dict[str, Callable[[torch.Tensor], torch.Tensor]] = field(default_factory=dict)
    # reader notes: raw aux ids and where they were stored, stripped prefix, logical shapes of packed tensors, ...
    meta: dict[str, Any] = field(default_factory=dict)
    # the stored aux ids and their convention as separate facts: where they were stored, both readings with the
    # evidence for each, the decided convention and how it was decided (``eagle_migrate.formats.aux_ids.AuxIds``).
    # ``config.aux_layer_ids`` holds the decided reading, or the literal one (what vLLM does) while undecided.
    aux: Any = None

    @property
    def format(self) -> str:
        return self.config.format_name

    def canonical_names(self) -> list[str]:
        return list(self.name_map)

    def info(self, canonical: str) -> TensorInfo:
        return self.store.infos[self.name_map[canonical]]

    def has(self, canonical: str) -> bool:
        return canonical in self.name_map

    def tensor(self, canonical: str, mapped: bool = False) -> torch.Tensor:
        """The tensor (a copy), or with ``mapped`` a read-only view of the memory-mapped file when no transform
        applies (:meth:`TensorStore.mapped`: pages are read as they are touched; never write to it)."""
        fn = self.transforms.get(canonical)
        if mapped and fn is None:
            return self.store.mapped(self.name_map[canonical])
        t = self.store.get(self.name_map[canonical])
        return fn(t) if fn else t

    def array(self, canonical: str) -> np.ndarray:
        """The tensor's values as a numpy array (:meth:`TensorStore.array`: no torch for safetensors), for checks."""
        fn = self.transforms.get(canonical)
        if fn is None:
            return self.store.array(self.name_map[canonical])
        t = fn(self.store.get(self.name_map[canonical]))
        return (t.float() if t.is_floating_point() and t.dtype.itemsize <= 2 else t).numpy().copy()

    def state_dict(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """All canonical tensors materialised (floating ones cast to ``dtype`` when given)."""
        out = {}
        for name in self.name_map:
            t = self.tensor(name)
            if dtype is not None and t.is_floating_point() and t.dtype.itemsize >= 2:
                t = t.to(dtype)
            out[name] = t
        return out

    @property
    def num_parameters(self) -> int:
        return sum(self.info(n).numel for n in self.name_map)


@dataclass
class Probe:
    """Everything detection looks at, read cheaply once: config, tensor headers, names, side files."""

    path: Path  # what the user passed
    folder: Path
    files: list[Path]
    config: dict[str, Any] | None
    store: TensorStore
    scan: Any  # formats.common.NameScan
    st_metadata: dict[str, str] = field(default_factory=dict)  # safetensors header metadata (first file)
    side: dict[str, Any] = field(default_factory=dict)  # e.g. {"hf_quant_config.json": {...}}

    @property
    def names(self) -> list[str]:
        return self.scan.names

    @property
    def has_bin(self) -> bool:
        return any(f.suffix in (".bin", ".pt", ".pth") for f in self.files)

    @property
    def architectures(self) -> list[str]:
        a = (self.config or {}).get("architectures")
        return [str(x) for x in a] if isinstance(a, list) else []


@dataclass(frozen=True)
class Layout:
    """A producer layout: ``sniff`` scores how well a probe matches (0 = not at all); ``read`` parses it.

    Detection takes the highest score; ties go to the layout registered first.
    """

    name: str
    producer: str
    sniff: Callable[[Probe], int]
    read: Callable[[Probe], Checkpoint]
    description: str = ""


LAYOUTS: dict[str, Layout] = {}


def register_layout(layout: Layout) -> Layout:
    LAYOUTS[layout.name] = layout
    return layout
