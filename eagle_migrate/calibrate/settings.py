"""Calibration's settings: the defaults per device, the trainable parameters per ``--train`` mode, and
:class:`CalibrationSettings`, every option of a run in one typed, checked options model (held whole by convert's
``ConvertOptions.calibration``, or built from the keywords of :func:`~eagle_migrate.calibrate.calibrate` /
:func:`~eagle_migrate.calibrate.calibrate_checkpoint`) that flows from the checkpoint wrapper into the run.
Imports: pydantic, choices, devices, options, fit_config (the trainer's FitConfig, without torch); drafter.model (a
type); torch where a function needs it, never at import: the options model imports no torch."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from pydantic import Field

from ..choices import TRAIN_MODES, TrainMode
from ..devices import resolve_device as _resolve
from ..fit_config import FitConfig
from ..options import Options, check_choice, choice

if TYPE_CHECKING:
    import torch

    from ..drafter.model import EagleDrafter

__all__ = ["TRAIN_MODES", "DEFAULT_LR", "DEFAULTS", "CPU_DEFAULTS", "DRIFT_SEQ_LEN", "MIN_BUDGET_S", "NORM_SUFFIXES", "CalibrationSettings",
           "defaults_for", "resolve_device", "seq_len_for", "trainable_names"]
# learning rates per mode (docs/calibration.md has the sweep they come from)
# all: 1e-3 from a sweep of the EAGLE-2 -> 3.1 fine-tune on the SmolLM2 pair (3e-4 / 1e-3 / 3e-3 at 120 steps: held-out
# simulated AL 1.214 / 1.277 / 1.271, 3e-3 already past its best at step 100; docs/benchmarks.md); norms+fc not
# swept (the rate of the drift fine-tunes that served a gain)
DEFAULT_LR: dict[str, float] = {"norms": 5e-3, "norms+fc": 5e-4, "all": 1e-3}
# held-out sizes: docs/calibration.md "How many held-out drafts" (a 2 % AL change at AL 1.3 and 2.5 needs about
# 2,200-2,500 drafts per suite for one AL's standard error, fewer for a paired difference): chat and template-shift
# get ~2,000-3,000 scored positions each (40-48 prompts x 64 continuation tokens); the long suite stays smaller
# (each long document costs a long target forward) and says so through its standard error
DEFAULTS: dict[str, Any] = {"steps": 200, "warmup": 10, "schedule": "cosine", "clip": 1.0, "k": 3, "seq_len": 512,
                            "batch": 4, "eval_every": 25, "patience": 4, "heldout_new_tokens": 64,
                            "heldout_per_suite": 48, "heldout_long_buckets": (1024, 2048, 4096, 8192),
                            "heldout_long_per_bucket": 4, "heldout_shift_max": 48}
# on a CPU the fine-tune must finish in minutes for a small target (docs/benchmarks.md "calibration": the SmolLM2
# pair peaked at step 30 of 40 with 256-token sequences): fewer, shorter steps, and no 4k/8k-token documents; 8 long
# documents per bucket (16 of 1k/2k tokens): with 2 the long suite carried 76 % of the judge's pooled variance and
# lost a served +4.5 % long-context gain (docs/calibration.md "Defaults by kind of source")
CPU_DEFAULTS: dict[str, Any] = {"steps": 60, "seq_len": 256, "eval_every": 10, "patience": 3,
                                "heldout_per_suite": 40, "heldout_long_buckets": (1024, 2048),
                                "heldout_long_per_bucket": 8, "heldout_shift_max": 40}


# the least a fine-tune with a deadline (ends_by) gets when the work before it has used the time up: a few steps and
# their evaluations (the run then ends past the deadline, and says how long it took)
MIN_BUDGET_S = 60.0

# --data drift trains on 1k-4k-token contexts (corpora.drift.DRIFT_LENGTHS): the sequence length that keeps them whole
DRIFT_SEQ_LEN = 4096


def seq_len_for(data: object, seq_len: int | None, dflt: dict[str, Any]) -> int:
    """The training sequence length: ``seq_len`` when given, :data:`DRIFT_SEQ_LEN` for ``--data drift[:KINDS]``
    (its long contexts are the point of it), else the device's default."""
    if seq_len:
        return seq_len
    return DRIFT_SEQ_LEN if str(data).split(":")[0] == "drift" else dflt["seq_len"]


def _default_patience(train: str, dflt: dict[str, Any]) -> int | None:
    """Early stopping for the norm modes; none for ``all``: retraining every weight (EAGLE-2 sources) climbs slowly
    through dips longer than the norm modes' patience (SmolLM2 on an H100: a 100-step dip at step 200, a 400-step
    one at 475, best at step 925 of 1000; docs/benchmarks.md). The best evaluation is still the one returned."""
    return None if train == "all" else dflt["patience"]


def device_type(device: Any) -> str:
    """``cpu`` / ``cuda`` / ... of a device name (``cuda:1``) or a ``torch.device``, as ``torch.device(device).type``."""
    return getattr(device, "type", None) or str(device).split(":")[0]


def defaults_for(device: str | torch.device) -> dict[str, Any]:
    """:data:`DEFAULTS`, with :data:`CPU_DEFAULTS` over them on a CPU."""
    return {**DEFAULTS, **(CPU_DEFAULTS if device_type(device) == "cpu" else {})}


NORM_SUFFIXES = ("hidden_norm.weight", "input_layernorm.weight", "post_attention_layernorm.weight")


def trainable_names(model: EagleDrafter, mode: str) -> list[str]:
    """Parameter names that train in ``mode`` (embeddings and d2t never do).

    norms: ``fc_norm.*`` (the inserted EAGLE-3.1 norms), ``input_norm`` when present, and the norms they feed or
    that see the fed-back state: every layer's ``hidden_norm`` / ``input_layernorm`` / ``post_attention_layernorm``
    and the final ``norm``. norms+fc: plus ``fc``. all: every parameter except ``embed_tokens``.
    """
    check_choice(TrainMode, "--train", mode)
    names = [n for n, _ in model.named_parameters()]
    norms = [n for n in names if n.startswith("fc_norm.") or n in ("input_norm.weight", "norm.weight") or n.endswith(NORM_SUFFIXES)]
    if mode == "norms":
        return norms
    if mode == "norms+fc":
        return norms + [n for n in names if n.startswith("fc.")]
    return [n for n in names if n != "embed_tokens.weight"]


def resolve_device(device: Any = "auto") -> torch.device:
    """:func:`eagle_migrate.devices.resolve_device` as a ``torch.device`` (cuda without CUDA is an InputError)."""
    import torch  # lazy: the options module imports no torch

    return torch.device(_resolve(device))


# the run's context: what convert (or calibrate_checkpoint's caller) resolves for the whole run and lays over the
# calibration's own options (ConvertOptions.calibration_settings); not set on a CalibrationSettings held by convert
CONTEXT = ("seed", "device", "dtype", "data", "hidden_states_dir", "num_sequences", "progress", "require_improvement")


class CalibrationSettings(Options):
    """Every option of a calibration run, checked on creation; ``None`` = the device's default
    (:func:`defaults_for`, :data:`DEFAULT_LR`). ``dtype``, ``data``, ``num_sequences``, ``suites`` and
    ``heldout_per_suite`` are read by :func:`~eagle_migrate.calibrate.calibrate_checkpoint` (which loads the target
    and picks the data); ``hidden_states_dir``: precomputed feature files instead of running the target.
    ``engine`` / ``vllm_python``: what generates the held-out continuations (``vllm``, its interpreter; ``reference``:
    transformers' generate; ``auto``: vLLM when it is importable there)."""

    train: Optional[choice(TrainMode, "--train")] = None  # None: norms (convert lays the recipe of the source's kind over it)
    steps: Optional[int] = None
    lr: Optional[float] = None
    warmup: Optional[int] = None
    schedule: Optional[str] = None
    clip: Optional[float] = None
    k: Optional[int] = None
    seq_len: Optional[int] = None
    batch: Optional[int] = None
    seed: int = 0
    device: Any = "auto"  # a name or a torch.device
    dtype: Any = None  # the target's (auto/None: bf16 on CUDA, fp32 on CPU); the drafter trains in fp32
    data: Optional[str | Path] = None
    hidden_states_dir: Optional[str | Path] = None
    num_sequences: Optional[int] = None
    suites: tuple[str, ...] = ("chat", "long", "template-shift")
    heldout_per_suite: Optional[int] = None
    heldout_long_per_bucket: Optional[int] = Field(None, ge=1, description="long documents per bucket of the judge's "
                                                   "long suite (None: the device's default)")
    heldout_new_tokens: Optional[int] = None
    eval_every: Optional[int] = None
    patience: Optional[int] = None
    max_minutes: Optional[float] = None
    ends_by: Optional[float] = Field(None, description="a time (time.time()) by which the fine-tune ends: its budget is "
                                     "the smaller of max_minutes and what is left then, at least MIN_BUDGET_S (convert's "
                                     "default recalibration on a CPU: the whole convert within 15 minutes)")
    cache_dir: Optional[str | Path] = None
    resume_dir: Optional[str | Path] = None
    require_improvement: bool = False
    engine: str = "auto"  # auto or a registered engine (engines.in_process.in_process_engines; checked when resolved)
    vllm_python: Optional[str] = None
    progress: Any = Field(None, exclude=True, repr=False)  # a StageProgress (the run's events), not an option

    @property
    def mode(self) -> str:
        """What trains: ``train`` as given, else ``norms`` (convert sets ``norms+fc`` for an EAGLE-3 source:
        convert/defaults.py :data:`~eagle_migrate.convert.defaults.RECIPE`)."""
        return self.train or "norms"

    def fit_config(self, dflt: dict[str, Any]) -> FitConfig:
        """The trainer's settings: these where given, else the device's defaults ``dflt`` (:func:`defaults_for`)."""
        return FitConfig(
            steps=dflt["steps"] if self.steps is None else self.steps, lr=self.lr or DEFAULT_LR.get(self.mode, 5e-4),
            warmup=dflt["warmup"] if self.warmup is None else self.warmup, schedule=self.schedule or dflt["schedule"],
            clip=self.clip or dflt["clip"], k=self.k or dflt["k"], seed=self.seed,
            eval_every=self.eval_every or dflt["eval_every"],
            patience=_default_patience(self.mode, dflt) if self.patience is None else self.patience,
            max_seconds=None if self.max_minutes is None else self.max_minutes * 60.0,
            # a budget: the schedule ends within it; with --resume it stays step-based (slots reach the same weights)
            horizon="time" if (self.max_minutes is not None or self.ends_by is not None) and self.resume_dir is None
            else "steps",
        )

    def budget_s(self, now: float) -> float | None:
        """The fine-tune's wall-clock budget in seconds when it starts at ``now`` (time.time()): ``max_minutes``, or
        what is left until ``ends_by`` when that is less (at least :data:`MIN_BUDGET_S`); None: no budget."""
        cap = None if self.max_minutes is None else self.max_minutes * 60.0
        if self.ends_by is None:
            return cap
        left = max(MIN_BUDGET_S, self.ends_by - now)
        return left if cap is None else min(cap, left)
