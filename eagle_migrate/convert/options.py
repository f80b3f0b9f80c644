"""convert's options model: every option of :func:`eagle_migrate.convert.convert` in one checked object, passed whole
through the skeleton. The calibration's options are not copied: :attr:`ConvertOptions.calibration` holds the
calibration's own :class:`~eagle_migrate.calibrate.CalibrationSettings`, and :meth:`ConvertOptions.calibration_settings`
lays over it only what convert resolves for the whole run (seed, device, dtype, data, hidden states, sequences,
progress). The source, target and output folder are convert's arguments, not options.
Imports: pydantic, choices, errors, options, progress, calibrate.settings (no torch: a torch.dtype is a type here)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from pydantic import Field, field_validator, model_validator

from ..calibrate.settings import CONTEXT, CalibrationSettings
from ..choices import AuxIdsConvention as Convention
from ..choices import OutputFormat
from ..errors import InputError
from ..options import Options, choice
from ..progress import no_progress

if TYPE_CHECKING:  # pragma: no cover
    import torch


class ConvertOptions(Options):
    """The options of :func:`eagle_migrate.convert.convert` (documented there), checked on creation.
    ``ConvertOptions.of(steps=5, train="all")`` routes the calibration's options into :attr:`calibration`."""

    # every run-wide option (options.RunOptions); engine and vllm_python are the calibration's (held-out continuations)
    RUN_FIELDS = {"device": "device", "dtype": "dtype", "seed": "seed", "num_speculative_tokens": "num_speculative_tokens",
                  "engine": "engine", "vllm_python": "vllm_python"}

    data: Optional[str | Path] = None
    hidden_states_dir: Optional[str | Path] = None
    num_sequences: int = 32
    output_format: choice(OutputFormat, "--output-format") = "vllm"
    device: Any = "auto"
    dtype: Any = "auto"  # a name, a torch.dtype, or None
    calibrate: Optional[bool] = None
    force: bool = False
    seed: int = 0
    num_speculative_tokens: int = 3
    held_out: Optional[int] = None
    max_length: int = 512
    max_cuts: int = 8
    evaluate: bool = True
    command: Optional[str] = None
    aux_ids_convention: Optional[choice(Convention, "--aux-ids-convention")] = None
    norm_before_residual: Optional[bool] = None  # overrides the config and the measurement (--norm-before-residual)
    require_improvement: bool = False  # exit 1 after writing when calibration did not improve (check_improvement)
    # the control arm of a measurement (--keep-architecture): the source's architecture kept (no EAGLE-3.1 norms),
    # the same calibration run on it; EAGLE-3 sources only
    keep_architecture: bool = False
    calibration: CalibrationSettings = Field(default_factory=CalibrationSettings)
    # the target the drafter was trained for (a local path or hub id, --trained-for): its step-0 agreement on that
    # target's own text is the reference of the target-fit measurement (eagle_migrate/target_fit.py)
    trained_for: Optional[str] = None
    progress: Any = Field(no_progress, exclude=True, repr=False)  # a StageProgress (the run's events), not an option

    @field_validator("progress", mode="before")
    @classmethod
    def _progress(cls, v: Any) -> Any:
        return no_progress if v is None else v

    @model_validator(mode="after")
    def _calibration_own(self) -> ConvertOptions:
        """The run-wide values are convert's own fields; the calibration takes them from there."""
        both = sorted(set(self.calibration.model_fields_set) & set(CONTEXT))
        if both:
            raise InputError(f"convert's calibration options set {', '.join(both)}: convert's own options give the "
                             "calibration those", f"pass {both[0]} to convert itself")
        return self

    def inputs(self, source: Path, target: str) -> list:
        """Everything the output folder must not be (nor lie inside)."""
        return [source, target, self.data, self.hidden_states_dir]

    def calibration_settings(self, *, device: str, dtype: torch.dtype, data: str | None) -> CalibrationSettings:
        """The calibration's options: :attr:`calibration` with what the run resolved laid over it (``device`` /
        ``dtype`` / ``data``: as the job resolved them; convert's seed, hidden states, sequences and progress), passed
        down whole: convert's fine-tune step -> calibrate_checkpoint -> calibrate. ``require_improvement`` stays off
        there: convert checks it once the output is written. The fine-tune unrolls as deep as the drafter is served:
        its ``k`` is ``num_speculative_tokens`` unless the calibration's own ``k`` is given."""
        k = self.calibration.k if self.calibration.k is not None else self.num_speculative_tokens
        return self.calibration.replace(seed=self.seed, device=device, dtype=dtype, data=data, k=k,
                                        hidden_states_dir=self.hidden_states_dir, num_sequences=self.num_sequences,
                                        progress=self.progress, require_improvement=False)
