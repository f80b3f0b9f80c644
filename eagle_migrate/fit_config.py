"""The trainer's settings (:class:`FitConfig`) and its learning-rate schedule (:func:`lr_at`), shared by
:func:`eagle_migrate.train.fit` and the options that build them (calibrate/settings.py). Imports: pydantic."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

__all__ = ["STEP_DECAY", "FitConfig", "Schedule", "lr_at"]

STEP_DECAY = 0.8  # the loss weight of draft step j is STEP_DECAY ** j


Schedule = Literal["cosine", "linear", "constant"]


class FitConfig(BaseModel):
    steps: int = Field(200, ge=0)
    lr: float = Field(1e-3, gt=0)
    warmup: int = Field(20, ge=0)
    schedule: Schedule = "cosine"
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    clip: float = Field(1.0, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    k: int = Field(3, ge=1)
    decay: float = Field(STEP_DECAY, gt=0)
    seed: int = 0
    eval_every: int = Field(25, ge=1)
    save_every: int | None = Field(None, ge=1, description="resume checkpoint period (default: eval_every)")
    patience: int | None = Field(4, ge=1, description="early stop after this many evaluations without improvement")
    min_delta: float = Field(1e-3, ge=0, description="an evaluation must beat the best score by this much")
    max_seconds: float | None = Field(None, gt=0, description="stop after the first step that ends past this much "
                                      "training time (an evaluation is made there)")
    horizon: Literal["steps", "time"] = Field("steps", description="time (with max_seconds): the schedule ends at the "
                                              "steps that fit in max_seconds at the pace so far (at most steps), and "
                                              "the evaluations fall at each time_evals-th of it, not every eval_every")
    time_evals: int = Field(3, ge=1)


def lr_at(step: int, cfg: FitConfig, steps: int | None = None) -> float:
    """The learning rate at ``step`` of a schedule of ``steps`` (``cfg.steps`` unless given)."""
    steps = cfg.steps if steps is None else steps
    if cfg.warmup and step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    if cfg.schedule == "constant" or steps <= cfg.warmup:
        return cfg.lr
    frac = min(1.0, (step - cfg.warmup) / max(1, steps - cfg.warmup))
    lo = cfg.lr * cfg.min_lr_ratio
    if cfg.schedule == "linear":
        return cfg.lr - (cfg.lr - lo) * frac
    return lo + 0.5 * (cfg.lr - lo) * (1 + math.cos(math.pi * frac))
