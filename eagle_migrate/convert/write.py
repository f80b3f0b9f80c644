"""The output plan of a conversion (config + one producer per tensor, streamed from the memory-mapped source) and
its writing: the vLLM layout through :func:`eagle_migrate.formats.output.write_safetensors_streaming` (one tensor made at
a time) or the speculators layout through :func:`eagle_migrate.formats.write_checkpoint`, then the read-back check.
Imports: torch, drafter.config, errors, formats (the reader and writers, output, vllm), progress."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from ..drafter.config import DrafterConfig
from ..errors import CheckpointError
from ..formats import read_checkpoint, write_checkpoint
from ..formats.output import PlannedTensor, write_json, write_safetensors_streaming
from ..formats.vllm import vllm_config_dict
from ..progress import StageProgress


@dataclass
class OutputPlan:
    """What will be written: the output config and, per tensor name, a producer and the shape."""

    cfg_out: DrafterConfig
    tensors: dict[str, Callable[[], torch.Tensor]] = field(default_factory=dict)  # output name -> producer
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    inserted: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)

    def add(self, name: str, producer: Callable[[], torch.Tensor], shape: tuple[int, ...]) -> None:
        self.tensors[name] = producer
        self.shapes[name] = tuple(shape)

    def names(self) -> list[str]:
        """The tensors written, sorted (``t2d`` never; ``d2t`` only when the output config uses it)."""
        names = [n for n in self.tensors if n != "t2d"]
        if not self.cfg_out.uses_d2t:
            names = [n for n in names if n != "d2t"]
        return sorted(names)


def copy_from(ck: Any, plan: OutputPlan, skip: tuple[str, ...] = ("t2d",)) -> None:
    """Every canonical tensor of the source ``ck`` into ``plan`` as it is, but ``skip`` (and ``d2t`` when unused)."""
    for n in ck.canonical_names():
        if n in skip or (n == "d2t" and not plan.cfg_out.uses_d2t):
            continue
        plan.add(n, lambda n=n: ck.tensor(n), tuple(ck.info(n).shape))


@dataclass(frozen=True)
class OutputLabels:
    """What the written files say about their origin (config ``eagle_migrate`` block, safetensors metadata)."""

    source_format: str
    source_producer: str
    source_sha256: str
    norm_init: str | None
    norm_output_scale: float | None
    calibration_required: bool
    aux_mark: tuple[tuple[str, Any], ...] = ()  # formats.common.carried_mark: stored ids carried undecided

    def config_extra(self) -> dict[str, Any]:
        return {"eagle_migrate": {"version": __version__, "converted_from": self.source_format,
                                  "source_producer": self.source_producer, "norm_init": self.norm_init,
                                  "norm_output_scale": self.norm_output_scale,
                                  "calibration_required": self.calibration_required, **dict(self.aux_mark)}}

    def metadata(self) -> dict[str, str]:
        return {"format": "pt", "producer": f"eagle-migrate {__version__}", "source_sha256": self.source_sha256,
                "eagle_migrate_convert": json.dumps({"from": self.source_format, "norm_init": self.norm_init,
                                                     "norm_output_scale": self.norm_output_scale,
                                                     "calibration_required": self.calibration_required})}


def write_plan(tmp: Path, plan: OutputPlan, labels: OutputLabels, store_dtype: torch.dtype, output_format: str,
               target: str, num_speculative_tokens: int, progress: StageProgress) -> None:
    """Write ``plan`` into the (temporary) folder ``tmp`` in ``output_format``, tensors in ``store_dtype``."""
    names = plan.names()
    extra, meta = labels.config_extra(), labels.metadata()
    progress("write", 0, len(names))
    if output_format == "vllm":
        done = [0]

        def counted(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
            def run() -> torch.Tensor:
                t = fn()
                done[0] += 1
                progress("write", min(done[0], len(names)), len(names))
                return t

            return run

        plist = [PlannedTensor(n, tuple(plan.shapes[n]), torch.int64 if n == "d2t" else store_dtype, counted(plan.tensors[n]))
                 for n in names]
        write_safetensors_streaming(tmp / "model.safetensors", plist, meta)
        d = vllm_config_dict(plan.cfg_out, extra)
        d["torch_dtype"] = str(store_dtype).removeprefix("torch.")
        write_json(tmp / "config.json", d)
    else:
        sub = tmp / "_speculators"
        write_checkpoint(plan.cfg_out, sub, layout="speculators",
                         tensors=((n, plan.tensors[n]().to(torch.int64 if n == "d2t" else store_dtype)) for n in names),
                         verifier=target, num_speculative_tokens=num_speculative_tokens, extra_config=extra, metadata=meta)
        for f in sub.iterdir():
            os.replace(f, tmp / f.name)
        sub.rmdir()
    progress("write", len(names), len(names))


def verify_written(folder: Path, eagle31: bool = True) -> None:
    """The output must read back as an EAGLE-3.1 drafter (``eagle31``; else as any drafter: the control arm) with
    no error (CheckpointError otherwise)."""
    back = read_checkpoint(folder)
    errs = [f.message for f in back.findings if f.severity == "error"]
    if errs or (eagle31 and not back.config.is_eagle31):
        raise CheckpointError(f"the written checkpoint does not read back cleanly: {'; '.join(errs[:3])}",
                              "the source itself has these problems (see `eagle-migrate inspect`); nothing was written")
