"""The conversion skeleton, the same for every source generation: *read* -> *map* -> *init* -> *write* -> *verify*
-> *calibrate* (the calibration fine-tunes the written checkpoint in place, so it comes after the read-back check).
A :class:`~.registry.Converter` per source generation fills in what differs (the aux ids it reads, the norm
initialisation and the agreement it measures); :func:`run` takes the one registered converter that accepts the
source (``registry.converter_for``). Imports: errors, formats (the reader, the trap table, the carried mark,
the atomic output folder), target_fit (whether the source fits its target), every convert.* module (the built-in
converters, which register themselves)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import CheckFailed, TargetError
from ..formats import read_checkpoint
from ..formats.common import carried_mark
from ..formats.output import atomic_output_dir, write_json
from ..formats.traps import TRAPS
from ..target_fit import TargetFit, assess
from . import eagle2, eagle3, passthrough  # noqa: F401  (the built-in converters register themselves)
from .calibration import run_calibration
from .defaults import RETARGET_CPU_ENDS_BY, SourceKind, choose, recipe, source_kind
from .options import ConvertOptions
from .read import Job, check_pairing, map_source, now, read, resolve_data
from .records import hidden_states_evidence
from .registry import Converter, Initialised, converter_for
from .result import CalibrationStatus, ConvertResult
from .write import OutputLabels, verify_written, write_plan


def run(source: Path, target: str, out: Path, opts: ConvertOptions) -> ConvertResult:
    """The skeleton: read -> map -> init -> write -> verify -> calibrate, then the result."""
    job = read(Path(source), target, Path(out), opts)
    conv = converter_for(job.cfg, "keep-architecture" if opts.keep_architecture else "auto")
    traits = conv.traits
    if traits.uses_data:
        resolve_data(job)
    check_pairing(job.cfg, job.target.info, None)
    aux, aux_ids = conv.aux_ids(job)
    map_source(job, aux, aux_ids)
    if opts.hidden_states_dir is not None:
        opts.progress("hidden-states evidence", 0, 1)
        job.provenance.hidden_states_evidence = hidden_states_evidence(job.target, opts.hidden_states_dir)
        opts.progress("hidden-states evidence", 1, 1)
    ini = conv.init(job)
    ini.plan.changes = job.changes + ini.plan.changes
    if ini.norm_init is not None:
        job.warnings.extend(f"warning: {w}" for w in ini.norm_init.warnings)
    kind = source_kind(job.cfg, job.ck.meta, traits)
    fit = target_fit(job, traits)
    if fit is not None and fit.recalibrate:
        job.warnings.append(f"warning: target fit: {fit.message}")
    choice = choose(kind, job.device, traits, opts.calibrate, opts.calibration, fit)
    want_cal, judge_only, why = choice.run, choice.judge_only, choice.why
    taken = _recipe_taken(job, kind, retarget=choice.retarget) if want_cal and not judge_only else {}
    if taken:
        why += (f"; the fine-tune's recipe for a {kind.kind} source: "
                + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in taken.items()) + " (convert/defaults.py RECIPE)"
                + (f", ending by {RETARGET_CPU_ENDS_BY:g} minutes into convert" if "max_minutes" in taken else ""))
    required = traits.calibration_required
    prov = job.provenance
    prov.num_sequences = ini.statistics.num_sequences if ini.statistics is not None else 0
    prov.statistics = ini.statistics
    prov.norm_init = ini.norm_init.method if ini.norm_init else None
    prov.norm_output_scale = ini.norm_output.scale if ini.norm_output else None
    prov.calibration_required = required
    prov.source_kind = kind.kind
    prov.target_fit = fit
    prov.step0_agreement = ini.agreement.step0
    labels = OutputLabels(source_format=job.ck.format, source_producer=job.ck.producer, source_sha256=job.source_sha256,
                          norm_init=prov.norm_init, norm_output_scale=prov.norm_output_scale, calibration_required=required,
                          aux_mark=tuple(carried_mark(job.aux).items()))
    calibration = CalibrationStatus(required=required, reason="EAGLE-2 warm start: fine-tune required" if required else "")
    with atomic_output_dir(job.out, force=opts.force, inputs=opts.inputs(job.source, job.target.spec)) as tmp:
        write_plan(tmp, ini.plan, labels, job.store_dtype, opts.output_format, job.target.spec, opts.num_speculative_tokens,
                   opts.progress)
        verify_written(tmp, eagle31=not opts.keep_architecture)
        fixed, remaining = sort_findings(job.source_findings, tmp)
        if want_cal:
            calibration = _calibrate(tmp, job, conv, ini, judge_only, taken)
            if calibration.worse_than_source and calibration.verdict:
                job.warnings.append(calibration.verdict)
            required = required and calibration.status != "calibrated"  # judged only: a warm start still needs it
        else:
            calibration.reason = (calibration.reason + "; " if calibration.reason else "") + why
        prov.calibration = calibration.status
        prov.calibration_verdict = calibration.verdict
        prov.calibration_required = required
        prov.finished_at = now()
        write_json(tmp / "provenance.json", prov.model_dump(mode="json"))
        files = sorted(p.name for p in tmp.iterdir())
    return ConvertResult(
        source=str(job.source), output=str(job.out), source_format=job.ck.format, source_producer=job.ck.producer,
        output_format=opts.output_format, passthrough=traits.passthrough, inserted=list(ini.plan.inserted),
        changes=ini.plan.changes, aux_layer_ids=job.aux_ids, aux_ids_evidence=job.aux,
        norm_before_residual_evidence=job.nbr_measurement, norm_init=ini.norm_init,
        norm_output=ini.norm_output, eagle2_mapping=ini.eagle2_mapping, agreement=ini.agreement, calibration=calibration,
        calibration_required=required, output_files=files, provenance=prov, fixed=fixed,
        warnings=remaining + job.warnings, source_kind=kind, defaults=why, decision=choice.line(taken),
        target_fit=fit,
    )


def sort_findings(findings: list[Any], written: Path) -> tuple[list[str], list[str]]:
    """The source's findings split by what the written output shows: (fixed, still there). A finding is fixed when
    reading the output back raises no finding of its code (inspect's own checks decide, never the message); what
    remains keeps its severity as the line's one label (``error: ...``, ``warning: ...``)."""
    out_codes = {f.code for f in read_checkpoint(written).findings}
    # a fixed finding is named by its code and the trap table's meaning: its message's advice ("pass --target ...",
    # "drop it") was for the source and no longer applies
    fixed = list(dict.fromkeys(f"{f.code}: {TRAPS[f.code].meaning}" if f.code in TRAPS else f"{f.code}: {f.message}"
                               for f in findings if f.code not in out_codes))
    remaining = [f"{f.severity}: {f.message}" for f in findings if f.code in out_codes]
    return fixed, remaining


def target_fit(job: Job, traits: Any) -> TargetFit | None:
    """Whether the source fits the target it is converted for (:func:`eagle_migrate.target_fit.assess`): the
    config's evidence, and step 0 on the target's own text (the sequences the aux-id measurement made, replayed),
    with ``--trained-for`` the same on that target as the reference. None for a passthrough or EAGLE-2 source;
    the config alone with ``--hidden-states`` (the target is not run) or a target without weights."""
    opts = job.opts
    if traits.passthrough or job.cfg.generation != "eagle3":
        return None
    measure = opts.hidden_states_dir is None
    opts.progress("target fit", 0, 1)
    try:
        fit = assess(job.ck, job.target, job.aux_ids, trained_for_path=opts.trained_for, seed=opts.seed,
                     data=job.data, sequences=job.first_sequences if measure else None, max_length=opts.max_length,
                     measure=measure, progress=lambda which, d, t: opts.progress(f"target fit ({which})", d, t),
                     until="action")
    except TargetError as e:  # e.g. a config-only target folder: the config's evidence alone
        fit = assess(job.ck, job.target, job.aux_ids, measure=False)
        fit.message += f" (not measured: {e.message})"
    opts.progress("target fit", 1, 1)
    return fit


def _recipe_taken(job: Job, kind: SourceKind, retarget: bool = False) -> dict[str, Any]:
    """The options a fine-tune of this kind of source takes from :data:`~.defaults.RECIPE` (``--train norms+fc`` on
    ``--data drift`` for an EAGLE-3 source; ``retarget``: :data:`~.defaults.RETARGET_RECIPE`, every weight on 256
    sequences of the default data) because the run leaves them open; the norm statistics before it ran on the run's
    own data."""
    opts = job.opts
    given = opts.data is not None or opts.hidden_states_dir is not None
    # the tokenizer only when the data is open: asking a --hidden-states run's target for it would load the model
    return recipe(kind, opts.calibration, given, not given and job.target.tokenizer is not None,
                  retarget=retarget, cpu=not str(job.device).startswith("cuda"),
                  n_given="num_sequences" in opts.model_fields_set)


def _calibrate(tmp: Path, job: Job, conv: Converter, ini: Initialised, judge_only: bool = False,
               taken: dict[str, Any] | None = None) -> CalibrationStatus:
    """The calibration step; ``judge_only``: no training (``steps`` 0), the judge scores the written drafter against
    the source on the held-out suites (the default for EAGLE-3 sources on a CPU: convert/defaults.py); ``taken``: the
    fine-tune's options from the recipe of the source's kind (:func:`_recipe_taken`)."""
    opts = job.opts
    settings = opts.calibration_settings(device=job.device, dtype=job.dtype, data=job.data)
    if judge_only:
        settings = settings.replace(steps=0)
    elif taken:
        settings = settings.replace(**taken)
        if "max_minutes" in taken:  # the retarget default on a CPU: the whole convert within 15 minutes
            settings = settings.replace(ends_by=job.t0 + RETARGET_CPU_ENDS_BY * 60.0)
    cal = run_calibration(tmp, job.target.spec, settings,
                          loaded_target=job.target.loaded_or_none,
                          source_checkpoint=job.source if conv.traits.judged_against_source else None,
                          statistics_tokens=ini.statistics.num_tokens if ini.statistics is not None else None,
                          initial="the source as it is" if opts.keep_architecture else "the structural conversion")
    cal.required = conv.traits.calibration_required
    return cal


def check_improvement(res: ConvertResult) -> None:
    """``--require-improvement``: CheckFailed (exit 1; the output is written) when the calibrated drafter is below
    the source beyond noise, or calibration did not beat the initialised drafter."""
    if res.calibration.worse_than_source:
        raise CheckFailed(res.calibration.verdict or "the converted drafter is below the source on the held-out suites",
                          f"{res.output} is written; keep the EAGLE-3 drafter or calibrate with --data / --train")
    if res.calibration.improved is False:
        raise CheckFailed(f"calibration did not improve the drafter ({res.calibration.reason}); {res.output} holds the "
                          "initialised drafter", "more or more varied --data, more --steps, or --train norms+fc")
