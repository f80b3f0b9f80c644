"""``convert``: EAGLE-2 / EAGLE-3 drafter -> EAGLE-3.1 (``fc_norm`` + ``norm_output``) that vLLM loads.

The converted drafter is initialised to behave like the source before any training (docs/norm-init.md):

* ``fc_norm.{k}.weight`` from target statistics on calibration data (aux hidden states at exactly the layers vLLM
  feeds), candidates compared on held-out sequences by step-0 top-1 agreement with the source;
* ``norm_output``: the fed-back state changes from ``h_pre`` to ``norm(h_pre)``; compensated by a flat final norm
  ``R`` (the typical RMS of ``h_pre``) with the old norm weight and ``1/R`` folded into ``lm_head`` — logits are
  unchanged exactly, the fed-back state equals ``h_pre`` up to ``R / rms(h_pre)`` per token;
* ``norm_before_fc`` sources: the ``input_norm`` weight is folded into ``fc`` and ``input_norm`` dropped;
* EAGLE-2 sources: a warm start (mapping in docs/norm-init.md), ``calibration_required: true``.

Tensors are streamed one at a time from the (memory-mapped) source into the output file; the source is never
written to; the output folder appears atomically.

One module per job: ``options`` (the typed arguments), ``read`` (read + map: source, target, aux ids, provenance),
``records`` (calibration records), ``agreement`` (drafter vs drafter on target positions), ``eagle3`` / ``eagle2`` /
``passthrough`` (one converter per source generation), ``write`` (the output plan, written and read back),
``calibration`` (the fine-tune step), ``base`` (the skeleton that runs them), ``result`` (the typed results).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..aux_ids import Convention
from ..progress import StageProgress
from .options import ConvertOptions, OutputFormat
from .read import check_pairing, default_aux_ids
from .records import STATS_MAX_SEQUENCES
from .result import (
    Agreement,
    CalibrationStatus,
    ConvertResult,
    Eagle2Mapping,
    FcNormWeight,
    FeedbackVariant,
    NormCandidate,
    NormInit,
    NormOutputCompensation,
    Provenance,
)

__all__ = [
    "STATS_MAX_SEQUENCES", "Agreement", "CalibrationStatus", "ConvertOptions", "ConvertResult",
    "Eagle2Mapping", "FcNormWeight", "FeedbackVariant", "NormCandidate", "NormInit", "NormOutputCompensation",
    "OutputFormat", "Provenance", "check_pairing", "convert", "default_aux_ids",
]


def convert(
    source: Path | str,
    target: str,
    out: Path | str,
    *,
    data: str | None = None,
    hidden_states_dir: Path | str | None = None,
    num_sequences: int = 32,
    output_format: OutputFormat = "vllm",
    device: str = "auto",
    dtype: str | torch.dtype | None = "auto",
    calibrate: bool | None = None,
    force: bool = False,
    seed: int = 0,
    progress: StageProgress | None = None,
    steps: int | None = None,
    train: str = "norms",
    cache_dir: Path | str | None = None,
    resume_dir: Path | str | None = None,
    num_speculative_tokens: int = 3,
    held_out: int | None = None,
    max_length: int = 512,
    max_cuts: int = 8,
    evaluate: bool = True,
    command: str | None = None,
    max_minutes: float | None = None,
    aux_ids_convention: Convention | None = None,
    norm_before_residual: bool | None = None,
) -> ConvertResult:
    """Convert an EAGLE-2/EAGLE-3 drafter to EAGLE-3.1 (see the module docstring and docs/norm-init.md).

    ``calibrate``: None = run the calibration fine-tune when it is available and the source is not already
    EAGLE-3.1; True/False force it on/off. ``steps``, ``train`` (norms | norms+fc | all), ``cache_dir`` (target
    features kept on disk), ``resume_dir`` (the fine-tune's checkpoints, to resume an interrupted run) and
    ``max_minutes`` (its wall-clock budget) are passed on to the calibration; ``result.calibration.improved`` says
    whether the fine-tune beat the initialised drafter on the held-out suites (the CLI's ``--require-improvement``
    exits 1 when it did not). ``num_sequences`` calibration sequences are used by the fine-tune; a seeded sample of
    at most :data:`STATS_MAX_SEQUENCES` of them feeds the norm statistics, ``held_out`` of those (default: a
    quarter, 1..16) only for measuring agreement.
    ``evaluate=False`` skips the agreement runs (the source's ``lm_head`` is never loaded): the fc_norm
    candidate is chosen by its fc-output error on the held-out sequences alone.
    ``aux_ids_convention`` (vllm | output-of-layer) overrides how the stored aux ids are read; otherwise a
    writer-unique fingerprint decides, or a measurement on the target (:mod:`eagle_migrate.aux_ids`), and when
    neither decides, PairingError (exit 2) names both readings. The arguments become one :class:`ConvertOptions`.
    """
    from .base import run

    return run(ConvertOptions(
        source=source, target=target, out=out, data=data, hidden_states_dir=hidden_states_dir, num_sequences=num_sequences,
        output_format=output_format, device=device, dtype=dtype, calibrate=calibrate, force=force, seed=seed,
        progress=progress, steps=steps, train=train, cache_dir=cache_dir, resume_dir=resume_dir,
        num_speculative_tokens=num_speculative_tokens, held_out=held_out, max_length=max_length, max_cuts=max_cuts,
        evaluate=evaluate, command=command, max_minutes=max_minutes, aux_ids_convention=aux_ids_convention,
        norm_before_residual=norm_before_residual))
