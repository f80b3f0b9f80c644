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

One module per job: ``options`` (the options model), ``read`` (read + map: source, target, aux ids, provenance),
``records`` (calibration records), ``agreement`` (drafter vs drafter on target positions), ``registry`` (what a
converter is, the converters by name), ``eagle3`` / ``eagle2`` / ``passthrough`` (one converter per source
generation), ``write`` (the output plan, written and read back), ``calibration`` (the fine-tune step), ``base``
(the skeleton that runs them), ``result`` (the typed results).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..choices import OutputFormat
from ..exports import lazy_exports
from ..progress import StageProgress
from .options import ConvertOptions

if TYPE_CHECKING:  # pragma: no cover  (the result model is imported on first use: lazy_exports below)
    from .result import ConvertResult

__all__ = [
    "STATS_MAX_SEQUENCES", "STATS_MAX_SEQUENCES_CPU", "Agreement", "CalibrationStatus", "ConvertOptions",
    "ConvertResult", "Eagle2Mapping", "FcNormWeight", "FeedbackVariant", "NormCandidate", "NormInit",
    "NormOutputCompensation", "OutputFormat", "Provenance", "check_improvement", "check_pairing", "convert",
    "default_aux_ids",
]

# the torch side, imported on first use: ``convert.options`` (the options model) imports without torch
__getattr__ = lazy_exports(__name__, {
    "run": ".base", "check_improvement": ".base", "check_pairing": ".read", "default_aux_ids": ".read",
    "STATS_MAX_SEQUENCES": ".records",
    "STATS_MAX_SEQUENCES_CPU": ".records",
    **dict.fromkeys(("Agreement", "CalibrationStatus", "ConvertResult", "Eagle2Mapping", "FcNormWeight",
                     "FeedbackVariant", "NormCandidate", "NormInit", "NormOutputCompensation", "Provenance"), ".result")})


def convert(source: Path | str, target: str, out: Path | str, *, options: ConvertOptions | None = None,
            progress: StageProgress | None = None, **overrides: Any) -> ConvertResult:
    """Convert an EAGLE-2/EAGLE-3 drafter to EAGLE-3.1 (see the module docstring and docs/norm-init.md): ``base.run``
    with ``options`` (a :class:`ConvertOptions`, handed whole: what migrate does) and ``overrides`` laid over it, each
    option by name (``ConvertOptions.of``; the calibration's, such as ``steps`` or ``train``, go to
    ``ConvertOptions.calibration``).

    ``calibrate``: None = run the calibration fine-tune when it is available and the source is not already
    EAGLE-3.1; True/False force it on/off. ``steps``, ``train`` (norms | norms+fc | all), ``cache_dir`` (target
    features kept on disk), ``resume_dir`` (the fine-tune's checkpoints, to resume an interrupted run),
    ``max_minutes`` (its wall-clock budget) and ``engine`` / ``vllm_python`` (what generates the held-out
    continuations: vLLM, in that interpreter, or transformers with ``engine="reference"``) are the calibration's;
    ``result.calibration.improved`` says whether the fine-tune beat the initialised drafter on the held-out suites
    (``require_improvement``: :func:`check_improvement`, which the CLI calls, exits 1 when it did not).
    ``num_sequences`` calibration sequences are used by the fine-tune; a seeded sample of at most
    :data:`STATS_MAX_SEQUENCES` of them (:data:`STATS_MAX_SEQUENCES_CPU` on a CPU) feeds the norm statistics,
    ``held_out`` of those (default: a quarter, 1..16) only for measuring agreement. ``evaluate=False`` skips the agreement runs (the source's ``lm_head`` is never
    loaded): the fc_norm candidate is chosen by its fc-output error on the held-out sequences alone.
    ``aux_ids_convention`` (vllm | output-of-layer) overrides how the stored aux ids are read; otherwise a
    writer-unique fingerprint decides, or a measurement on the target (:mod:`eagle_migrate.formats.aux_ids`), and when
    neither decides, PairingError (exit 2) names both readings.
    """
    from ..engines.in_process import check_engine_name  # lazy: the formats package (numpy); convert.options stays light
    from .base import run  # lazy: torch (the package's options model imports without it)

    opts = ConvertOptions.of(options, progress=progress, **overrides)
    check_engine_name(opts.calibration.engine)  # a typo costs nothing: checked before any work
    return run(Path(source), target, Path(out), opts)
