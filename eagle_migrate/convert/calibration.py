"""The calibration step of convert: the fine-tune (:func:`eagle_migrate.calibrate.calibrate_checkpoint`) on the
written checkpoint, in place, with typed options, and its outcome as a :class:`~.result.CalibrationStatus`.
Imports: calibrate (lazily), target (the loaded model it reuses), convert.result."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..progress import StageProgress
from ..target import Target
from .result import CalibrationStatus


@dataclass(frozen=True)
class CalibrationOptions:
    """What convert passes to the calibration fine-tune (each field is the keyword of ``calibrate_checkpoint``)."""

    target: str
    data: str | None
    hidden_states_dir: Path | str | None
    train: str
    steps: int | None
    seed: int
    device: str
    dtype: torch.dtype
    num_sequences: int
    cache_dir: Path | str | None
    resume_dir: Path | str | None
    progress: StageProgress
    max_minutes: float | None
    loaded_target: Target | None = None  # the target convert already loaded (a GPU does not hold it twice)
    source_checkpoint: Path | None = None  # the EAGLE-3 source, scored on the same held-out positions
    statistics_tokens: int | None = None  # tokens the norm statistics saw (reported by the judge)

    def keywords(self) -> dict[str, Any]:
        return {n: getattr(self, n) for n in self.__dataclass_fields__ if n != "target"}


def run_calibration(ckpt_dir: Path, opts: CalibrationOptions) -> CalibrationStatus:
    """The calibration fine-tune on the written checkpoint ``ckpt_dir``, in place."""
    from ..calibrate import calibrate_checkpoint

    res = calibrate_checkpoint(ckpt_dir, opts.target, in_place=True, **opts.keywords())
    kept = (f"best step {res.best_step} of {res.steps_run}" if res.best_step
            else "initial weights kept: the structural conversion is returned")
    if res.stopped_early and res.stop_reason:
        planned = res.settings.get("steps")
        kept += f"; stopped after step {res.steps_run}" + (f" of {planned}" if planned else "") + f": {res.stop_reason}"
    j = res.judge
    paired = (f", paired {j.vs_initial.diff:+.3f} +/- {j.vs_initial.se:.3f} over {j.heldout_positions} positions"
              if j is not None and j.vs_initial is not None else "")
    reason = (f"--train {res.train}: held-out simulated AL {res.score_before:.3f} -> {res.score_after:.3f}{paired} ({kept})"
              + (f"; WARNING: {res.warning}" if res.warning else "")
              + "".join(f"; not measured: {m}" for m in res.not_measured))
    return CalibrationStatus(status="calibrated", reason=reason, improved=res.improved,
                             worse_than_source=j.worse_than_source if j else None, verdict=j.verdict if j else None,
                             details=res.model_dump(mode="json"))
