"""``validate()``: acceptance length of a drafter (and a baseline) per suite, in vLLM or the reference engine, with
gates, drift diagnostics and a report folder."""

from __future__ import annotations

import datetime as _dt
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .. import __version__
from ..errors import CheckFailed, DataError, EagleMigrateError, EngineError, InputError
from ..devices import cuda_available, resolve_device, resolve_dtype
from ..target import load_tokenizer
from .engine import EngineRun, resolve_engine, run_engine
from .vllm_engine import DrafterRefused
from .metrics import AcceptanceStats, RequestCounts, cell_stats, paired_comparison, per_request_counts
from .report import (Diagnostics, Gate, GroupResult, Metrics, PairedComparison, SuiteResult, ValidationReport,
                     write_report)

GROUPED_SUITES = ("long", "template-shift")  # measured per group (own counters) for the breakdown tables/plots


def validate(
    checkpoint: str | os.PathLike,
    target: str,
    engine: str = "auto",
    suites: list[str] | tuple[str, ...] | None = None,
    prompts_file: str | os.PathLike | None = None,
    k: int = 3,
    baseline: str | os.PathLike | None = None,
    min_acceptance_length: float | None = None,
    max_regression_pct: float | None = None,
    report_dir: str | os.PathLike | None = None,
    *,
    num_prompts: int | None = None,
    max_tokens: int | None = None,
    temperature: float = 0.0,
    seed: int = 0,
    dtype: str = "auto",
    max_model_len: int | None = None,
    tensor_parallel_size: int = 1,
    vllm_python: str | None = None,
    speedup: bool = False,
    diagnostics: bool = True,
    diagnostic_sequences: int = 4,
    device: str = "auto",
    check: bool = False,
    log: Callable[[str], None] | None = None,
    attention_backend: str | None = None,
) -> ValidationReport:
    """Measure acceptance length per suite and apply the gates.

    ``suites``: names among chat, code, long, template-shift (default: chat, code, long, template-shift; with
    ``prompts_file`` and no ``suites`` only the user's prompts). ``engine``: ``vllm`` (subprocess worker, its own
    Python via ``vllm_python``), ``reference`` (pure torch), or ``auto`` (vLLM when importable). ``dtype``: ``auto`` =
    float32 on CPU (both engines agree bit for bit there), the model's own on GPU. ``attention_backend``: vLLM's
    attention backend for MLA models (e.g. CPU_MLA, AMX_MLA; default chosen for the host and recorded in
    ``settings["attention"]``, validate/attention_backend.py). With ``check`` a failed gate raises
    :class:`CheckFailed` (after the report is written); otherwise ``report.passed`` says it.
    """
    t_start = time.perf_counter()
    say = log or (lambda m: None)
    _quiet_transformers()
    inp = _resolve_inputs(checkpoint, target, engine, baseline, max_regression_pct, k, report_dir, prompts_file,
                          max_model_len, vllm_python)
    aux, warnings = aux_ids_status({"new": inp.ckpt, "baseline": inp.baseline}, str(target))
    for w in warnings:
        say("warning: " + w)
    built, jobs = _build_suites(inp, suites, prompts_file, num_prompts=num_prompts, max_tokens=max_tokens, seed=seed)
    say("suites: " + ", ".join(f"{s.name} ({s.size} prompts)" for s in built))
    drafters: list[str | None] = [inp.ckpt] + ([inp.baseline] if inp.baseline else []) + ([None] if speedup else [])
    settings = {"num_speculative_tokens": k, "temperature": temperature, "seed": seed, "dtype": dtype,
                "max_model_len": inp.mml, "tensor_parallel_size": tensor_parallel_size, "speedup": speedup}
    say(f"engine: {inp.engine}; drafters: {len([d for d in drafters if d])}" + (" + target alone" if speedup else ""))
    run, refusal = _measure(inp, target, drafters, jobs, k=k, temperature=temperature, seed=seed, dtype=dtype,
                            tensor_parallel_size=tensor_parallel_size, vllm_python=vllm_python, device=device,
                            attention_backend=attention_backend)
    settings["dtype"] = run.dtype
    if run.attention is not None:
        settings["attention"] = run.attention
        if run.attention["target"] or run.attention["drafter"]:
            say(f"attention backend: {run.attention['target'] or run.attention['drafter']} ({run.attention['reason']})")
    new_r = run.results[0]
    base_r = run.results[1] if inp.baseline else None
    plain_r = run.results[-1] if speedup else None

    suite_results = ([_suite_result(s, jobs, new_r, base_r, plain_r, k=k, log=say) for s in built]
                     if new_r is not None else [])
    gates, failures = _apply_gates(suite_results, min_acceptance_length,
                                   max_regression_pct if base_r is not None else None)
    overall = _overall(jobs, new_r, base_r, k)
    failures += [refusal] if refusal else []
    diag = None
    if diagnostics and refusal is None:
        diag = _diagnostics(target, run.target_obj, inp.ckpt, inp.baseline, built, jobs, new_r, k,
                            diagnostic_sequences, say)

    report = ValidationReport(
        tool=f"eagle-migrate {__version__}", created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        checkpoint=inp.ckpt, weights_sha256=inp.weights_sha, baseline=inp.baseline, target=str(target),
        engine=inp.engine, engine_version=run.engine_version, settings=settings, suites=suite_results,
        overall=overall, gates=gates, passed=not failures, failures=failures, diagnostics=diag, aux_ids=aux,
        warnings=warnings,
    )
    report.seconds = round(time.perf_counter() - t_start, 1)
    if report_dir is not None:
        write_report(report, Path(report_dir))
    if refusal is not None:
        raise EngineError(refusal, (f"the report records what was measured ({Path(report_dir) / 'report.json'}); " if
                                    report_dir is not None else "") + "see `eagle-migrate inspect` on that drafter, "
                          "or measure it with --engine reference")
    if check and not report.passed:
        raise CheckFailed("; ".join(failures))
    return report


def _measure(inp: _Inputs, target: str, drafters: list[str | None], jobs: dict[str, dict[str, Any]], *,
             dtype: str, **kw: Any) -> tuple[EngineRun, str | None]:
    """Step 2: the engine's counters for every drafter, and the refusal line when vLLM refused one of them (the
    others' counters are kept: the report records what was measured)."""
    try:
        return run_engine(inp.engine, target, drafters, jobs, dtype=dtype, max_model_len=inp.mml,
                          skip_tokenizer_init=inp.tokenizer is None, per_request=True, **kw), None
    except DrafterRefused as e:
        role = "checkpoint" if e.index == 0 else ("baseline" if inp.baseline and e.index == 1 else "target alone")
        dt = dtype if dtype != "auto" else ("auto" if cuda_available() else "float32")
        return EngineRun(e.results, e.vllm_version, dt), refused_message(role, e.drafter, e.reason)


def refused_message(role: str, drafter: str | None, reason: str) -> str:
    """One line naming the drafter vLLM refused (its role and path), vLLM's reason (the first line, in full) and the
    ``inspect`` finding that explains it, when reading the drafter raises an error-severity one."""
    msg = f"vLLM refused the {role} drafter {drafter}: {reason}"
    if drafter:
        try:
            from ..formats import read_checkpoint

            errs = [f for f in read_checkpoint(drafter).findings if f.severity == "error"]
        except Exception:  # noqa: BLE001 - an unreadable drafter explains itself through vLLM's reason
            errs = []
        if errs:
            msg += f"; inspect finds {errs[0].code}: {errs[0].message}"
    return msg


@dataclass
class _Inputs:
    """What :func:`validate` measures with, checked: the checkpoint (and its weights' hash), the baseline, the engine,
    the target's config and tokenizer, and the context length the suites must fit."""

    ckpt: str
    baseline: str | None
    engine: str
    weights_sha: str
    info: Any
    tokenizer: Any
    mml: int


def aux_ids_status(drafters: dict[str, str | None], target: str) -> tuple[dict[str, Any], list[str]]:
    """How each drafter's aux layer ids are served (validate changes nothing, so it never decides or refuses): the
    stored ids, the ids vLLM reads, their convention and why; a warning for ids whose convention nothing decided
    (vLLM reads them literally, which is what is measured; if written output-of-layer they are one layer off)."""
    from ..formats import read_checkpoint

    out: dict[str, Any] = {}
    warnings: list[str] = []
    for label, path in drafters.items():
        if path is None:
            continue
        try:
            ck = read_checkpoint(path)
        except EagleMigrateError:  # the engine says what is wrong with it
            continue
        a = ck.aux
        if a is None or a.stored is None or ck.config.generation != "eagle3":
            continue
        out[label] = {"stored": a.stored, "served": list(ck.config.aux_layer_ids or []),
                      "convention": a.convention or "undecided", "decided_by": a.decided_by}
        if not a.decided:
            o = a.candidate("output-of-layer")
            warnings.append(f"{label} drafter {path}: aux layer ids {a.stored} carry nothing that says which convention "
                            f"they were written in; vLLM reads them literally and that is what is measured here (if the "
                            f"drafter was trained on layer outputs, SpecForge / ModelOpt style, it is served one layer "
                            f"off: vLLM ids {o.ids if o else '?'} were meant). `eagle-migrate inspect {path} --target "
                            f"{target}` measures which")
    return out, warnings


def _resolve_inputs(checkpoint: str | os.PathLike, target: str, engine: str, baseline: str | os.PathLike | None,
                    max_regression_pct: float | None, k: int, report_dir: str | os.PathLike | None,
                    prompts_file: str | os.PathLike | None, max_model_len: int | None,
                    vllm_python: str | None) -> _Inputs:
    """Step 1: check the inputs (InputError / EngineError before anything is loaded) and resolve engine, target
    config, tokenizer and context length."""
    from ..formats.io import open_checkpoint_path, sha256_files
    from ..formats.output import check_no_overlap
    from ..target import target_info

    ckpt = str(checkpoint)
    for p, what in ((ckpt, "checkpoint"), (str(baseline) if baseline else None, "baseline")):
        if p is not None and not Path(p).exists():
            raise InputError(f"{p}: no such {what} folder")
    if max_regression_pct is not None and baseline is None:
        raise InputError("--max-regression needs --baseline (the checkpoint to compare against)")
    if k < 1:
        raise InputError("-k must be at least 1")
    eng = resolve_engine(engine, vllm_python)
    weights_sha = sha256_files(open_checkpoint_path(Path(ckpt))[1])  # what is measured; publish checks it
    if report_dir is not None:
        check_no_overlap(Path(report_dir), [ckpt, target, baseline, prompts_file], what="--report")
    info = target_info(target)
    tok = load_tokenizer(target)
    mml = max_model_len or min(int(info.max_position_embeddings or 8192), 8192 if not cuda_available() else 1 << 20)
    return _Inputs(ckpt, str(baseline) if baseline else None, eng, weights_sha, info, tok, mml)


def _with_se(m: Metrics, reqs: list[RequestCounts] | None, k: int) -> Metrics:
    """``m`` with the standard errors of its AL and per-position rates, the request as the unit (validate/metrics.py);
    None without per-request counters or below two requests."""
    st = cell_stats(reqs, max(k, len(m.per_position_rate))) if reqs else None
    if st is not None and st["al_se"] is not None:
        m.acceptance_length_se = round(st["al_se"], 4)
        m.per_position_rate_se = [round(x or 0.0, 4) for x in st["per_position_se"]][:len(m.per_position_rate)]
    return m


def _overall(jobs: dict[str, Any], new_r: dict | None, base_r: dict | None, k: int) -> dict[str, Any]:
    """AL over every suite's counters together (new, baseline), their SEs and the paired comparison over all the
    requests, where the engine counted per request."""
    if new_r is None:
        return {}
    keys = list(jobs)
    out: dict[str, Any] = {}
    reqs = {}
    for role, r in (("new", new_r), ("baseline", base_r)):
        if r is None:
            continue
        reqs[role] = per_request_counts(r, keys)
        m = _with_se(Metrics.from_stats(AcceptanceStats.total([r[x][0] for x in keys])), reqs[role][0], k)
        out[role] = m.acceptance_length
        if m.acceptance_length_se is not None:
            out[f"{role}_se"] = m.acceptance_length_se
    if base_r is not None:
        out["paired"] = paired_comparison(reqs["new"], reqs["baseline"]).model_dump()
    return out


def _build_suites(inp: _Inputs, suites: list[str] | tuple[str, ...] | None, prompts_file: str | os.PathLike | None,
                  *, num_prompts: int | None, max_tokens: int | None, seed: int) -> tuple[list[Any], dict[str, dict[str, Any]]]:
    """Step 2: the suites (corpora) and what the engines run: ``{job: {"prompts", "max_tokens"}}``, a grouped suite
    as one job per group, so each group has its own counters."""
    from .. import corpora

    names = list(suites) if suites else ([] if prompts_file else ["chat", "code", "long", "template-shift"])
    if prompts_file is not None:
        names.append("prompts")
    for n in names:
        if n not in (*corpora.SUITE_NAMES, "prompts"):
            raise DataError(f"unknown suite '{n}'", f"choose from {', '.join(corpora.SUITE_NAMES)} or pass --prompts FILE")
    built = [corpora.suite(n, inp.tokenizer, inp.info, num_prompts=num_prompts, max_tokens=max_tokens, seed=seed,
                           max_model_len=inp.mml, prompts_file=prompts_file) for n in names]
    jobs: dict[str, dict[str, Any]] = {}
    for s in built:
        if s.name in GROUPED_SUITES and s.groups:
            for g, ps in s.by_group().items():
                jobs[f"{s.name}/{g}"] = {"prompts": ps, "max_tokens": s.max_tokens}
        else:
            jobs[s.name] = {"prompts": s.prompts, "max_tokens": s.max_tokens}
    return built, jobs


def _suite_result(s: Any, jobs: dict[str, dict[str, Any]], new_r: dict, base_r: dict | None,
                  plain_r: dict | None, *, k: int = 0, log: Callable[[str], None] | None = None) -> SuiteResult:
    """Step 3: one suite's metrics from the engines' counters: the new drafter, the baseline (and the regression,
    and the paired ratio with its SE where the engine counted per request), the speed-up over the target alone, and
    per group for a grouped suite."""
    keys = [k_ for k_ in jobs if k_ == s.name or k_.startswith(s.name + "/")]
    new_stats = AcceptanceStats.total([new_r[x][0] for x in keys])
    new_secs = sum(new_r[x][1]["seconds"] for x in keys)
    new_q = per_request_counts(new_r, keys)
    res = SuiteResult(name=s.name, description=s.description, prompt_set=s.manifest(),
                      new=_with_se(Metrics.from_stats(new_stats, new_secs), new_q[0], k))
    if new_q[1] and log:
        log(f"{s.name}: no standard errors ({new_q[1]})")
    if base_r is not None:
        bs = AcceptanceStats.total([base_r[x][0] for x in keys])
        base_q = per_request_counts(base_r, keys)
        res.baseline = _with_se(Metrics.from_stats(bs, sum(base_r[x][1]["seconds"] for x in keys)), base_q[0], k)
        b_al = res.baseline.acceptance_length
        res.regression_pct = round(100.0 * (b_al - res.new.acceptance_length) / b_al, 2) if b_al else None
        res.paired = paired_comparison(new_q, base_q)
        if res.paired.note and log:
            log(f"{s.name}: paired comparison: {res.paired.note}")
    if plain_r is not None:
        ps = AcceptanceStats.total([plain_r[x][0] for x in keys])
        psecs = sum(plain_r[x][1]["seconds"] for x in keys)
        if psecs > 0 and new_secs > 0 and ps.num_output_tokens:
            res.speedup = round((new_stats.num_output_tokens / new_secs) / (ps.num_output_tokens / psecs), 3)
    if len(keys) > 1 or (keys and keys[0] != s.name):
        by_group = s.by_group()
        for x in keys:
            g = x.split("/", 1)[1]
            ps_ = by_group[g]
            gq = per_request_counts(new_r, [x])
            gr = GroupResult(name=g, mean_prompt_tokens=sum(map(len, ps_)) / len(ps_),
                             new=_with_se(Metrics.from_stats(new_r[x][0], new_r[x][1]["seconds"]), gq[0], k))
            if base_r is not None:
                gbq = per_request_counts(base_r, [x])
                gr.baseline = _with_se(Metrics.from_stats(base_r[x][0], base_r[x][1]["seconds"]), gbq[0], k)
                gr.paired = paired_comparison(gq, gbq)
            res.groups.append(gr)
    return res


def _apply_gates(suite_results: list[SuiteResult], min_acceptance_length: float | None,
                 max_regression_pct: float | None) -> tuple[list[Gate], list[str]]:
    """Step 4: the gates per suite (minimum AL, maximum regression against the baseline); marks each suite passed
    or failed and returns (gates, failure lines)."""
    gates: list[Gate] = []
    for res in suite_results:
        if min_acceptance_length is not None:
            ok = res.new.acceptance_length >= min_acceptance_length
            gates.append(Gate(name="min_acceptance_length", threshold=min_acceptance_length, suite=res.name,
                              value=res.new.acceptance_length, passed=ok))
            if not ok:
                se = res.new.acceptance_length_se
                res.failures.append(f"AL {res.new.acceptance_length:.3f} < {min_acceptance_length}"
                                    + (f" (AL's SE {se:.3f})" if se is not None else ""))
        if max_regression_pct is not None:
            ok = res.regression_pct is not None and res.regression_pct <= max_regression_pct
            gates.append(Gate(name="max_regression_pct", threshold=max_regression_pct, suite=res.name,
                              value=res.regression_pct, passed=ok))
            if not ok:
                res.failures.append(f"regression {_pct(res.regression_pct)} > {max_regression_pct}% "
                                    f"(AL {res.new.acceptance_length:.3f} vs baseline "
                                    f"{res.baseline.acceptance_length if res.baseline else float('nan'):.3f}"
                                    + _paired_text(res.paired) + ")")
        res.passed = not res.failures
    return gates, [f"suite {r.name}: {'; '.join(r.failures)}" for r in suite_results if r.failures]


def _quiet_transformers() -> None:
    """No per-load progress bars from transformers on stderr (the CLI has its own log lines)."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except Exception:
        pass


def _paired_text(p: PairedComparison | None) -> str:
    """``; paired ratio 0.987 ± 0.004 (worse)`` for a gate's message, or nothing without a paired SE."""
    return f"; {p.text()}" if p is not None and p.ratio is not None and p.se is not None else ""


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}%"


def _diagnostics(target: str, target_obj: Any, ckpt: str, baseline: str | None, built: list, jobs: dict,
                 new_r: dict, k: int, per_suite: int, say: Callable[[str], None]) -> Diagnostics:
    """Drift diagnostics on the new drafter's finished sequences (a few per suite, spread over its groups)."""
    from .diagnostics import drift_diagnostics
    from ..drafter.load import load_drafter

    out = Diagnostics(sink_tokens=4)
    try:
        if target_obj is None:
            from ..target import load_target

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
