"""``validate()``: acceptance length of a drafter (and a baseline) per suite, in any registered engine (vLLM or the
reference engine in-process, or a running vLLM server), with gates, drift diagnostics and a report folder.

:func:`run_validation` is the one code path: the engine (``engines/registry.py``'s registry, by
``ValidateOptions.engine`` or ``server``) opens a session that says what the suites are built with and measures
them; the suites (``suites.py``), the results and overall AL (``report.py``), the gates (``gates.py``) and the
report folder are the same code for every engine. :func:`validate` and :func:`validate_server` are its keyword
forms (``validate_server``: a running server). Imports: transformers (lazily: its progress bars, quieted), devices,
errors, loader and target (the drift diagnostics), the version string, engines.{registry, in_process, server (both register
their engines), options}, validate.{suites, report, gates, diagnostics}."""

from __future__ import annotations

import datetime as _dt
import os
import time
from pathlib import Path
from typing import Any, Callable

from .. import __version__
from ..devices import resolve_device, resolve_dtype
from ..engines import in_process as _in_process  # noqa: F401  (registers the vllm, reference and auto engines)
from ..engines import server as _server  # noqa: F401  (registers the server engine)
from ..engines.options import ValidateOptions
from ..engines.registry import Progress, get_engine
from ..errors import CheckFailed, EngineError
from ..loader import load_drafter
from ..target import load_target
from .diagnostics import drift_diagnostics
from .gates import apply_gates
from .report import Diagnostics, ValidationReport, overall, suite_result, write_report
from .suites import build_suites


def validate(checkpoint: str | os.PathLike, target: str, engine: str = "auto", suites: Any = None,
             prompts_file: str | os.PathLike | None = None, k: int = 3, baseline: str | os.PathLike | None = None,
             min_acceptance_length: float | None = None, max_regression_pct: float | None = None,
             report_dir: str | os.PathLike | None = None, *, log: Callable[[str], None] | None = None,
             progress: Progress | None = None, **options: Any) -> ValidationReport:
    """Measure acceptance length per suite and apply the gates: :func:`run_validation` with these keywords as its
    :class:`ValidateOptions` (documented there: ``num_prompts``, ``max_tokens``, ``temperature``, ``seed``,
    ``dtype``, ``max_model_len``, ``tensor_parallel_size``, ``vllm_python``, ``speedup``, ``diagnostics``,
    ``diagnostic_sequences``, ``device``, ``check``, ``attention_backend``).

    ``suites``: names among chat, code, long, template-shift (default: chat, code, long, template-shift; with
    ``prompts_file`` and no ``suites`` only the user's prompts). ``engine``: ``vllm`` (subprocess worker, its own
    Python via ``vllm_python``), ``reference`` (pure torch), or ``auto`` (vLLM when importable). ``dtype``: ``auto`` =
    float32 on CPU (both engines agree bit for bit there), the model's own on GPU. ``attention_backend``: vLLM's
    attention backend for MLA models (e.g. CPU_MLA, AMX_MLA; default chosen for the host and recorded in
    ``settings["attention"]``, engines/attention_backend.py). With ``check`` a failed gate raises
    :class:`CheckFailed` (after the report is written); otherwise ``report.passed`` says it.
    """
    opts = ValidateOptions.of(engine=engine, suites=suites, prompts_file=prompts_file, k=k, baseline=baseline,
                              min_acceptance_length=min_acceptance_length, max_regression_pct=max_regression_pct,
                              report_dir=report_dir, **options)
    return run_validation(checkpoint, target, opts, log=log, progress=progress)


def validate_server(checkpoint: str | os.PathLike | None, target: str | None, server: str, *,
                    api_key: str | None = None, log: Callable[[str], None] | None = None, **options: Any) -> ValidationReport:
    """``validate`` against a running vLLM server (engine ``server``): the keyword form of
    :func:`run_validation` with ``ValidateOptions(server=server, **options)``
    (``concurrency``, ``speed_rounds``, ``block_size``, ``baseline_server``, the suites' and gates' options).
    ``api_key``: the server's key (send-only, never stored)."""
    opts = ValidateOptions.of(server=server, api_key=api_key, **options)
    return run_validation(checkpoint, target, opts, log=log)


def run_validation(checkpoint: str | os.PathLike | None, target: str | None, opts: ValidateOptions, *,
                   log: Callable[[str], None] | None = None, progress: Progress | None = None) -> ValidationReport:
    """One validation of ``checkpoint`` on ``target`` with ``opts``, whichever engine measures: the engine's session
    (inputs checked, what the suites are built with), the suites and their jobs, the measurement (``progress``: the
    engine's events, suite by suite or batch by batch), each suite's results, the engine's own additions, the gates,
    the drift diagnostics (engines that load the drafters), the report (written to ``opts.report_dir``).
    EngineError when vLLM refused a drafter (after the report is written); CheckFailed with ``opts.check`` and a
    failed gate."""
    t_start = time.perf_counter()
    say = log or (lambda m: None)
    _quiet_transformers()
    engine = get_engine(opts.engine_name)
    with engine.open(checkpoint, target, opts, say) as sess:
        built, jobs = build_suites(sess.tokenizer, sess.info, sess.max_model_len, opts.suites, opts.prompts_file,
                                   num_prompts=opts.num_prompts, max_tokens=opts.max_tokens, seed=opts.seed)
        say("suites: " + ", ".join(f"{s.name} ({s.size} prompts)" for s in built))
        m = sess.measure(jobs, progress)
        suite_results = ([suite_result(s, jobs, m.new, m.baseline, m.plain, k=sess.k, log=say if sess.per_request else None)
                          for s in built] if m.new is not None else [])
        sess.finish(built, jobs, m, suite_results)
    gates, failures = apply_gates(suite_results, opts.min_acceptance_length,
                                  opts.max_regression_pct if m.baseline is not None else None)
    failures += [m.refusal] if m.refusal else []
    diag = None
    if engine.in_process and opts.diagnostics and m.refusal is None:
        diag = _diagnostics(sess.target, m.target_obj, sess.checkpoint, sess.baseline, built, jobs, m.new, sess.k,
                            opts.diagnostic_sequences, say)
    report = ValidationReport(
        tool=f"eagle-migrate {__version__}", created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        checkpoint=sess.checkpoint, weights_sha256=sess.weights_sha, baseline=sess.baseline, target=sess.target,
        engine=sess.engine, engine_version=m.engine_version, settings=sess.settings(m), suites=suite_results,
        overall=overall(jobs, m.new, m.baseline, sess.k), gates=gates, passed=not failures, failures=failures,
        diagnostics=diag, aux_ids=sess.aux, warnings=sess.warnings, **sess.report_fields())
    report.seconds = round(time.perf_counter() - t_start, 1)
    if opts.report_dir is not None:
        write_report(report, Path(opts.report_dir))
    if m.refusal is not None:
        raise EngineError(m.refusal, (f"the report records what was measured ({Path(opts.report_dir) / 'report.json'}); "
                                      if opts.report_dir is not None else "") + "see `eagle-migrate inspect` on that "
                          "drafter, or measure it with --engine reference")
    if opts.check and not report.passed:
        raise CheckFailed("; ".join(failures))
    return report


def _quiet_transformers() -> None:
    """No per-load progress bars from transformers on stderr (the CLI has its own log lines)."""
    try:
        from transformers.utils import logging as hf_logging  # lazy: transformers (0.8 s) loads when a validation runs, not when migrate imports this module

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except Exception:
        pass


def _diagnostics(target: str, target_obj: Any, ckpt: str, baseline: str | None, built: list, jobs: dict,
                 new_r: dict, k: int, per_suite: int, say: Callable[[str], None]) -> Diagnostics:
    """Drift diagnostics on the new drafter's finished sequences (a few per suite, spread over its groups)."""
    out = Diagnostics(sink_tokens=4)
    try:
        if target_obj is None:
            dev = resolve_device("auto")
            target_obj = load_target(target, device=dev, dtype=resolve_dtype("auto", dev), with_tokenizer=False)
        dev = target_obj.device
        dt = next(target_obj.model.parameters()).dtype
        models = {"new": load_drafter(ckpt, target_obj, device=dev, dtype=dt)}
        if baseline:
            models["baseline"] = load_drafter(baseline, target_obj, device=dev, dtype=dt)
        for s in built:
            keys = [x for x in jobs if x == s.name or x.startswith(s.name + "/")]
            seqs, plens = [], []
            i = 0
            while len(seqs) < per_suite and any(i < len(jobs[x]["prompts"]) for x in keys):
                for x in keys:  # round-robin over groups: every bucket / variant is represented
                    if i < len(jobs[x]["prompts"]) and len(seqs) < per_suite:
                        p = jobs[x]["prompts"][i]
                        seqs.append(list(p) + list(new_r[x][1]["outputs"][i]))
                        plens.append(len(p))
                i += 1
            say(f"drift diagnostics: {s.name} ({len(seqs)} sequences)")
            for role, m in models.items():
                getattr(out, role)[s.name] = drift_diagnostics(target_obj, m, seqs, plens, num_speculative_tokens=k,
                                                               sink_tokens=out.sink_tokens)
    except Exception as e:  # diagnostics never hide the acceptance results
        out.error = f"{e.__class__.__name__}: {str(e)[:300]}"
    return out
