"""convert's typed options: every argument of :func:`eagle_migrate.convert.convert` in one checked object, passed
through the skeleton instead of loose keywords. Imports: torch, errors, progress, choices (the Literals
of output formats, train modes and aux-id conventions)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..choices import AuxIdsConvention as Convention
from ..choices import OutputFormat, TrainMode, values
from ..errors import InputError
from ..progress import StageProgress, no_progress

if TYPE_CHECKING:
    from ..calibrate import CalibrationSettings

TRAIN_MODES: tuple[str, ...] = values(TrainMode)


@dataclass(frozen=True)
class ConvertOptions:
    """The arguments of :func:`eagle_migrate.convert.convert` (documented there), checked on creation."""

    source: Path
    target: str
    out: Path
    data: str | None = None
    hidden_states_dir: Path | str | None = None
    num_sequences: int = 32
    output_format: OutputFormat = "vllm"
    device: str = "auto"
    dtype: str | torch.dtype | None = "auto"
    calibrate: bool | None = None
    force: bool = False
    seed: int = 0
    progress: StageProgress = no_progress
    steps: int | None = None
    train: str = "norms"
    cache_dir: Path | str | None = None
    resume_dir: Path | str | None = None
    num_speculative_tokens: int = 3
    held_out: int | None = None
    max_length: int = 512
    max_cuts: int = 8
    evaluate: bool = True
    command: str | None = None
    max_minutes: float | None = None
    aux_ids_convention: Convention | None = None
    norm_before_residual: bool | None = None  # overrides the config and the measurement (--norm-before-residual)

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", Path(self.source))
        object.__setattr__(self, "out", Path(self.out))
        if self.progress is None:
            object.__setattr__(self, "progress", no_progress)
        if self.output_format not in ("vllm", "speculators"):
            raise InputError(f"unknown output format '{self.output_format}' (vllm or speculators)")
        if self.train not in TRAIN_MODES:  # checked before anything is read or written (calibration runs last)
            raise InputError(f"--train {self.train!r}: expected one of {', '.join(TRAIN_MODES)}")

    @property
    def inputs(self) -> list:
        """Everything the output folder must not be (nor lie inside)."""
        return [self.source, self.target, self.data, self.hidden_states_dir]

    def calibration_settings(self, *, device: str, dtype: torch.dtype, data: str | None) -> CalibrationSettings:
        """The calibration's options, built once from these (``device`` / ``dtype`` / ``data``: as the job resolved
        them) and passed down whole: convert's fine-tune step -> calibrate_checkpoint -> calibrate."""
        from ..calibrate import CalibrationSettings  # lazily: calibrate imports the trainer, needed only to calibrate

        return CalibrationSettings(
            train=self.train, steps=self.steps, seed=self.seed, device=device, dtype=dtype, data=data,
            hidden_states_dir=self.hidden_states_dir, num_sequences=self.num_sequences, cache_dir=self.cache_dir,
            resume_dir=self.resume_dir, progress=self.progress, max_minutes=self.max_minutes)
