"""The calibration step of convert: the fine-tune (:func:`eagle_migrate.calibrate.calibrate_checkpoint`) on the
written checkpoint, in place, with convert's one :class:`~eagle_migrate.calibrate.CalibrationSettings`, and its outcome
as a :class:`~.result.CalibrationStatus`. Imports: calibrate (its calibrate_checkpoint, looked up when called), target
(the loaded model it reuses), convert.result."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .. import calibrate  # its calibrate_checkpoint looked up when called (tests replace it there)
from ..target import Target
from .result import CalibrationStatus

if TYPE_CHECKING:
    from ..calibrate import CalibrationSettings


def run_calibration(ckpt_dir: Path, target: str, settings: CalibrationSettings, *, loaded_target: Target | None = None,
                    source_checkpoint: Path | None = None, statistics_tokens: int | None = None,
                    initial: str = "the structural conversion") -> CalibrationStatus:
    """The calibration on the written checkpoint ``ckpt_dir``, in place, with ``settings`` (built once by
    :meth:`~.options.ConvertOptions.calibration_settings`). ``loaded_target``: the target convert already loaded (a
    GPU does not hold it twice); ``source_checkpoint``: the EAGLE-3 source, scored on the same held-out positions;
    ``statistics_tokens``: the tokens the norm statistics saw (reported by the judge); ``initial``: what the
    checkpoint held before the fine-tune, named when it is returned unchanged. ``settings.steps`` 0: judge only (no
    fine-tune; status ``judged``)."""
    res = calibrate.calibrate_checkpoint(ckpt_dir, target, settings, in_place=True, loaded_target=loaded_target,
                               source_checkpoint=source_checkpoint, statistics_tokens=statistics_tokens)
    j = res.judge
    judged = res.settings.get("steps") == 0  # judge only: no fine-tune ran
    if judged:
        head = "judge only, no fine-tune: " + ("no held-out suites" if j is None else
                                               f"held-out simulated AL {res.score_before:.3f}" + (
            f", source {res.score_source:.3f}" if res.score_source is not None else ""))
    else:
        kept = (f"best step {res.best_step} of {res.steps_run}" if res.best_step
                else f"initial weights kept: {initial} is returned")
        if res.stopped_early and res.stop_reason:
            planned = res.settings.get("steps")
            kept += f"; stopped after step {res.steps_run}" + (f" of {planned}" if planned else "") + f": {res.stop_reason}"
        paired = (f", paired {j.vs_initial.diff:+.3f} +/- {j.vs_initial.se:.3f} over {j.heldout_positions} positions"
                  if j is not None and j.vs_initial is not None else "")
        head = f"--train {res.train}: held-out simulated AL {res.score_before:.3f} -> {res.score_after:.3f}{paired} ({kept})"
    reason = (head + (f"; WARNING: {res.warning}" if res.warning else "")
              + "".join(f"; not measured: {m}" for m in res.not_measured))
    return CalibrationStatus(status="judged" if judged else "calibrated", reason=reason,
                             improved=None if judged else res.improved,
                             worse_than_source=j.worse_than_source if j else None, verdict=j.verdict if j else None,
                             details=res.model_dump(mode="json"))
