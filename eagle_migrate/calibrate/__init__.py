"""Calibration: a short fine-tune of a converted EAGLE-3.1 drafter, trained the way vLLM runs it.

The objective, the unrolled k-step attention pattern and the loop live in :mod:`eagle_migrate.train`, the held-out
statistics (simulated acceptance, paired differences with standard errors) in :mod:`eagle_migrate.judge`; this
package picks what trains (``norms`` | ``norms+fc`` | ``all``), evaluates simulated greedy acceptance per held-out
suite (chat, long context, template shift: sequences that are the target's own greedy continuations) for the source
and the candidate, keeps the best checkpoint, stops early (patience, time limit, or :func:`eagle_migrate.judge.futility`:
no reachable improvement), and refuses to hand back a drafter worse than the one it got without saying so
(``require_improvement`` turns that into :class:`CheckFailed`, exit 1).

One typed options object, :class:`CalibrationSettings`, flows end to end (convert builds it once from its
``ConvertOptions``). Two entry points take it (or its fields as keywords):
* :func:`calibrate` -- library form: an :class:`EagleDrafter` and a loaded :class:`Target` in, the model updated in
  place (best weights) and a :class:`CalibrationResult` out.
* :func:`calibrate_checkpoint` -- a checkpoint folder in the vLLM layout in, calibrated in place (what ``convert``
  calls).

Modules: ``settings`` (defaults per device, trainable parameters per mode, CalibrationSettings), ``result`` (the
result models and their Markdown, the judge's verdict, the --require-improvement check), ``run`` (calibrate),
``progress`` (the trainer's records as stage events), ``checkpoint`` (calibrate_checkpoint).
"""

from __future__ import annotations

from ..exports import lazy_exports
from .settings import (
    CPU_DEFAULTS,
    DEFAULT_LR,
    DEFAULTS,
    NORM_SUFFIXES,
    TRAIN_MODES,
    CalibrationSettings,
    defaults_for,
    resolve_device,
    trainable_names,
)

__all__ = ["CalibrationResult", "CalibrationSettings", "SuiteAcceptance", "TRAIN_MODES", "DEFAULT_LR", "DEFAULTS",
           "CPU_DEFAULTS", "NORM_SUFFIXES", "defaults_for", "calibrate", "calibrate_checkpoint", "trainable_names",
           "Judge", "check_improvement", "source_verdict", "resolve_device"]

# the torch side, imported on first use: ``calibrate.settings`` (the options model) imports without torch
__getattr__ = lazy_exports(__name__, {"calibrate_checkpoint": ".checkpoint", "calibrate": ".run",
                                      **dict.fromkeys(("CalibrationResult", "Judge", "SuiteAcceptance",
                                                       "check_improvement", "source_verdict"), ".result")})
