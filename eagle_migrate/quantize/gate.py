"""quantize's acceptance gate: which engine measures the drafter before and after quantization, the default suites,
the measurement (through ``engines.in_process.run_engine``, the one measurement, with per-request counters) and the
drop report: each AL with its standard error and the paired ratio AL(after) / AL(before) with its SE and verdict.

Imports: pydantic, ``corpora``, ``errors``, ``drafter.config``, ``quant.schemes``, ``target``, ``engines.in_process``
(the engines, never validate's stage; what each engine can run and loads is asked of it), ``engines.options`` (the
measurement's options, taken whole), ``engines.metrics`` (the SEs and the paired ratio).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from .. import corpora
from ..drafter.config import DrafterConfig
from ..engines import in_process as engines
from ..engines.metrics import AcceptanceStats, PairedComparison, cell_stats, paired_comparison, per_request_counts
from ..engines.options import ValidateOptions
from ..errors import InputError
from ..quant.schemes import SchemeConfig
from ..target import load_tokenizer, target_info

ValidateMode = str  # auto | none ("off" = none) | a registered in-process engine's name (engines.in_process.in_process_engines)


class SuiteDrop(BaseModel):
    before: float
    after: float
    drop_pct: float = Field(..., description="100 (before - after) / before; negative = the quantized drafter is better")
    num_drafts_before: int = 0
    num_drafts_after: int = 0
    before_se: float | None = Field(None, description="standard error of ``before``, the request as the unit "
                                    "(engines/metrics.py); null without per-request counters (``paired.note`` says why)")
    after_se: float | None = Field(None, description="standard error of ``after``")
    paired: PairedComparison | None = Field(None, description="AL(after) / AL(before) on the same requests, its "
                                            "paired SE and verdict (improved / worse beyond 2 SE of 1.0, within noise)")
    drop_beyond_noise: bool | None = Field(None, description="the change lies beyond 2 paired SEs of none (verdict "
                                           "improved or worse); null without a paired SE")


class AcceptanceReport(BaseModel):
    engine: str  # the registered engine that measured
    num_speculative_tokens: int
    suites: dict[str, SuiteDrop]
    before: float = Field(..., description="acceptance length of the unquantized drafter, all suites pooled")
    after: float = Field(..., description="acceptance length of the quantized drafter, all suites pooled")
    drop_pct: float
    max_drop_pct: float | None = None
    passed: bool | None = Field(None, description="null when no --max-al-drop gate was given; the gate compares "
                                "drop_pct with max_drop_pct (a point estimate): drop_beyond_noise says what the noise allows")
    note: str | None = None
    before_se: float | None = Field(None, description="standard error of ``before`` over every suite's requests")
    after_se: float | None = Field(None, description="standard error of ``after`` over every suite's requests")
    paired: PairedComparison | None = Field(None, description="AL(after) / AL(before) over every suite's requests, "
                                            "paired by prompt: ratio, SE, verdict, or a note saying why there is none")
    drop_beyond_noise: bool | None = Field(None, description="the pooled change lies beyond 2 paired SEs of none; "
                                           "null without a paired SE")

    def paired_text(self) -> str:
        """The pooled comparison in words: ``paired ratio 0.875 ± 0.010 (worse, beyond 2 SE)``, ``... (within
        noise)``, or why there is no ratio or no SE."""
        return paired_words(self.paired)


def paired_words(p: PairedComparison | None) -> str:
    """:meth:`PairedComparison.text` with "beyond 2 SE" spelled out for a verdict of improved / worse."""
    if p is None:
        return "paired ratio n/a (not measured)"
    if p.ratio is not None and p.se is not None and p.verdict in ("improved", "worse"):
        return f"paired ratio {p.ratio:.3f} ± {p.se:.3f} ({p.verdict}, beyond 2 SE)"
    return p.text()


def gate_engine(spec: SchemeConfig, validate: str, target: str | None, max_al_drop_pct: float | None,
                vllm_python: str | None) -> tuple[str, str | None]:
    """(the validate mode, ``off`` read as ``none``; the engine that measures acceptance, None when nothing is
    measured). ``auto``: vLLM when it is installed and has a kernel for the scheme here, else the reference engine."""
    if validate == "off":
        validate = "none"
    if validate != "none" and validate not in engines.engine_choices():
        raise InputError(f"unknown validate mode '{validate}'",
                         f"choose none or an engine: {', '.join(engines.engine_choices())}")
    if max_al_drop_pct is not None and (target is None or validate == "none"):
        raise InputError("--max-al-drop needs an acceptance measurement", "pass --target (and leave validation on)")
    if spec.calibrated and target is None:
        raise InputError(f"scheme {spec.name} calibrates activation scales on data run through the target and drafter",
                         f"pass --target T (and --data SRC), or use {spec.without_target}")
    if validate != "none" and target is None and not engines.get_engine(validate).optional:
        raise InputError(f"--validate {validate} measures acceptance against a target", "pass --target T")
    if target is None or validate == "none":
        return validate, None

    return validate, engines.resolve_engine(validate, vllm_python, scheme=spec)


def max_model_len(target_spec: str, cap: int = 2048) -> int:
    return min(cap, int(target_info(str(target_spec)).max_position_embeddings or cap))


def default_suites(target_spec: str, target=None, *, names: tuple[str, ...] = ("chat", "code"), num_prompts: int = 8,
                   max_tokens: int = 64, max_model_len: int | None = None) -> dict[str, dict[str, Any]]:
    """Acceptance prompts when none are given: small versions of the validate suites (``eagle_migrate.corpora``), with
    the loaded target's tokenizer (else the target's own, as validate loads it)."""
    info = target_info(str(target_spec))
    tok = getattr(target, "tokenizer", None) if target is not None else load_tokenizer(str(target_spec))
    out = {}
    for name in names:
        s = corpora.suite(name, tok, info, num_prompts=num_prompts, max_tokens=max_tokens, max_model_len=max_model_len)
        out[name] = {"prompts": s.prompts, "max_tokens": s.max_tokens}
    return out


def _side(run: dict[str, tuple[Any, dict[str, Any]]], keys: list[str], k: int) -> tuple[float, float | None, tuple]:
    """(AL, its SE or None, the per-request counters and why not) of one drafter over the jobs ``keys`` pooled."""
    stats = AcceptanceStats.total([run[x][0] for x in keys])
    q = per_request_counts(run, keys)
    st = cell_stats(q[0], k) if q[0] else None
    return stats.acceptance_length, None if st is None or st["al_se"] is None else round(st["al_se"], 4), q


def _drop(bal: float, aal: float) -> float:
    return 100 * (bal - aal) / bal if bal else 0.0


def acceptance_report(engine: str, k: int, before: dict[str, tuple[Any, dict[str, Any]]],
                      after: dict[str, tuple[Any, dict[str, Any]]], max_drop: float | None,
                      note: str | None = None) -> AcceptanceReport:
    """The drop per suite and pooled, from the engine's results (``{suite: (stats, extra)}``) of the drafter before
    and after: each AL with its SE and the paired ratio AL(after) / AL(before) with its SE and verdict, the request as
    the unit (engines/metrics.py), where the engine returned per-request counters (``extra["per_request"]``). The
    gate itself stays the point estimate ``drop_pct <= max_drop`` (docs/quantize.md)."""
    suites = {}
    for name in before:
        (bal, bse, bq), (aal, ase, aq) = _side(before, [name], k), _side(after, [name], k)
        p = paired_comparison(aq, bq)
        suites[name] = SuiteDrop(before=round(bal, 4), after=round(aal, 4), drop_pct=round(_drop(bal, aal), 3),
                                 num_drafts_before=before[name][0].num_drafts, num_drafts_after=after[name][0].num_drafts,
                                 before_se=bse, after_se=ase, paired=p, drop_beyond_noise=_beyond(p))
    keys = list(before)
    (bal, bse, bq), (aal, ase, aq) = _side(before, keys, k), _side(after, keys, k)
    p = paired_comparison(aq, bq)
    drop = _drop(bal, aal)
    return AcceptanceReport(engine=engine, num_speculative_tokens=k, suites=suites, before=round(bal, 4),
                            after=round(aal, 4), drop_pct=round(drop, 3), max_drop_pct=max_drop,
                            passed=None if max_drop is None else drop <= max_drop, note=note, before_se=bse,
                            after_se=ase, paired=p, drop_beyond_noise=_beyond(p))


def _beyond(p: PairedComparison) -> bool | None:
    return None if p.verdict is None else p.verdict != "within noise"


def measure_acceptance(engine: str, spec: SchemeConfig, *, source: Path, quantized: Path, work_parent: Path,
                       cfg: DrafterConfig, sd: dict[str, Any], target: str, target_obj, suites: dict | None, k: int,
                       max_al_drop_pct: float | None, vllm_options: dict[str, Any] | None,
                       load_target: Callable[[], Any]) -> AcceptanceReport:
    """Acceptance of the source drafter and of the quantized one (``quantized``: its folder) on the same suites in
    ``engine``. vLLM loads the source written dense in its own layout; the reference engine reads any layout and the
    quantized output through the one loader (``load_target()`` gives the loaded target when none is yet)."""
    vopts = dict(vllm_options or {})
    mp = max_model_len(target)
    sts = suites if suites is not None else default_suites(target, target_obj, max_model_len=mp)
    eng = engines.get_engine(engine)
    with tempfile.TemporaryDirectory(prefix=".eagle-migrate-quantize-", dir=str(work_parent)) as work:
        before = eng.dense_source(source, cfg, sd, work)  # the source, unquantized, in a layout the engine loads
        if eng.reuses_loaded_target:
            target_obj = target_obj if target_obj is not None else load_target()
        max_len = int(vopts.pop("max_model_len", mp))
        opts = ValidateOptions.of(k=k, vllm_python=vopts.pop("python", None), **vopts)
        run = engines.run_engine(engine, target, [str(before), str(quantized)], sts, opts, max_model_len=max_len,
                                 skip_tokenizer_init=all(isinstance(x, list) for st in sts.values() for x in st["prompts"]),
                                 target_obj=target_obj if eng.reuses_loaded_target else None, per_request=True)
    before_s, after_s = run.results
    return acceptance_report(engine, k, before_s, after_s, max_al_drop_pct, eng.quantized_note(spec))
