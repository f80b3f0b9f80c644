"""The lineage of a published drafter: every stage it went through, source first (the source's format and producer,
the conversion and its verdict, the quantization, the validation), read from the provenance records each stage wrote
(quantize keeps convert's record under ``parent``) and the validation report. One line per stage, no local path.

Imports: ``publish.provenance`` (the record chain, hub ids), ``publish.card`` (LineageStep, number formatting),
``publish.report`` (AL ± SE and the paired ratio as the card writes them).
"""

from __future__ import annotations

from typing import Any

from .card import LineageStep, fixed, scalar_str
from .provenance import chain, hub_id
from .report import al_cell, as_number, paired_cells, paired_of


_GENERATIONS = {"eagle1": "EAGLE-1", "eagle2": "EAGLE-2", "eagle3": "EAGLE-3", "eagle3.1": "EAGLE-3.1"}


def _gen(fmt: Any) -> str:
    return _GENERATIONS.get(fmt, str(fmt)) if fmt else "a drafter of unknown format"


def _kind(node: dict[str, Any]) -> str | None:
    """Which stage wrote a provenance record: convert (``convert.result.Provenance``) or quantize (``quantize.stage``)."""
    if node.get("command") == "quantize" or (isinstance(node.get("options"), dict) and "scheme" in node["options"]):
        return "quantize"
    if "source_format" in node or "norm_init" in node:
        return "convert"
    return None


def _source_of(node: dict[str, Any]) -> tuple[Any, Any, Any, str | None]:
    """(format, producer, weights sha256, Hub id when the source was one) of the oldest record's source."""
    if "source_format" in node:
        return node.get("source_format"), node.get("source_producer"), node.get("source_sha256"), hub_id(node.get("source"))
    src = node.get("source")
    if isinstance(src, dict):
        return src.get("format"), src.get("producer"), src.get("sha256"), hub_id(src.get("path") or src.get("repo_id"))
    return None, None, None, None


def _convert_step(node: dict[str, Any]) -> LineageStep:
    fmt = node.get("source_format")
    parts = ["already EAGLE-3.1: re-written as it is" if fmt == "eagle3.1"
             else f"{_gen(fmt)} -> EAGLE-3.1 (`fc_norm` before `fc`, post-norm feedback `norm_output`)"]
    if node.get("norm_init"):
        parts.append(f"`fc_norm` initialised by {node['norm_init']}")
    if (a := as_number(node.get("step0_agreement"))) is not None:
        parts.append(f"step-0 agreement with the source {fixed(a)}")
    cal = node.get("calibration")
    if isinstance(cal, str) and cal:
        verdict = node.get("calibration_verdict")
        parts.append(f"calibration: {cal}" + (f"; verdict: {verdict}" if isinstance(verdict, str) and verdict else ""))
    return LineageStep(stage="convert", summary="; ".join(parts))


def _quantize_step(node: dict[str, Any]) -> LineageStep:
    o = node.get("options") if isinstance(node.get("options"), dict) else {}
    r = node.get("result") if isinstance(node.get("result"), dict) else {}
    scheme = o.get("scheme") or r.get("scheme") or "quantized"
    parts = [f"{scheme}" + (f" ({r['scheme_description']})" if isinstance(r.get("scheme_description"), str) else "")]
    if (ratio := as_number(r.get("checkpoint_ratio"))) is not None:
        parts.append(f"checkpoint {ratio:.2f}x smaller")
    if (sq := as_number(r.get("min_sqnr_db"))) is not None:
        parts.append(f"lowest SQNR {sq:.1f} dB")
    acc = r.get("acceptance")
    if isinstance(acc, dict) and as_number(acc.get("before")) is not None and as_number(acc.get("after")) is not None:
        parts.append(f"AL {al_cell(acc['before'], acc.get('before_se'))} -> {al_cell(acc['after'], acc.get('after_se'))} "
                     f"({acc.get('engine', '?')}{_paired_words(acc.get('paired'))})")
    return LineageStep(stage="quantize", summary="; ".join(parts))


def _other_steps(node: dict[str, Any]) -> list[LineageStep]:
    """A hand-made record: its ``convert`` / ``quantize`` / ``calibrate`` sections' scalar values."""
    out = []
    for key in ("convert", "calibrate", "quantize"):
        sec = node.get(key)
        if isinstance(sec, dict):
            vals = [f"{k} {scalar_str(v)}" for k, v in sec.items() if isinstance(v, (str, int, float, bool))]
            if vals:
                out.append(LineageStep(stage=key, summary=", ".join(vals[:8])))
    return out


def _paired_words(d: Any) -> str:
    """``; paired ratio 0.875 ± 0.006, worse`` (the ratio's cells as the card's table has them), or nothing when
    the record has no paired comparison (older records)."""
    ratio, verdict = paired_cells(paired_of(d))
    return f"; paired ratio {ratio}" + (f", {verdict}" if verdict else "") if ratio else ""


def suite_acceptance(raw: Any) -> list[tuple[str, str, str | None]]:
    """(suite, AL, the baseline comparison) as text from a report's suites (validate's layout, with each AL's SE and
    the paired ratio where the report has them, or flat ``acceptance_length`` keys); suites without an AL left out."""
    suites = raw.get("suites") if isinstance(raw, dict) else None
    if isinstance(suites, dict):
        entries = [(str(k), v) for k, v in suites.items() if isinstance(v, dict)]
    elif isinstance(suites, list):
        entries = [(str(v.get("name") or v.get("suite") or i + 1), v) for i, v in enumerate(suites) if isinstance(v, dict)]
    else:
        return []
    out = []
    for name, d in entries:
        new = d.get("new") if isinstance(d.get("new"), dict) else {}
        base = d.get("baseline") if isinstance(d.get("baseline"), dict) else {}
        al = al_cell(new.get("acceptance_length", d.get("acceptance_length")), new.get("acceptance_length_se"))
        b = al_cell(base.get("acceptance_length", d.get("baseline_acceptance_length")), base.get("acceptance_length_se"))
        if al:
            out.append((name, al, (b + _paired_words(d.get("paired"))) if b else None))
    return out


def _validate_step(report: Any, forced_by: str | None, reason: str | None) -> LineageStep:
    """``report``: a ``publish.report.LoadedReport`` (None: none was given)."""
    if report is None:
        if forced_by == "--no-validate":
            return LineageStep(stage="validate", summary="not run (`--no-validate`): the acceptance length was never measured")
        return LineageStep(stage="validate", summary="no validation report" + (f"; published with `{forced_by}`" if forced_by else ""))
    m = report.model
    version = m.vllm_version or m.engine_version
    head = f"engine {m.engine or 'unknown'}" + (f" {version}" if version else "")
    if m.num_speculative_tokens:
        head += f", k={m.num_speculative_tokens}"
    als = [f"{n} AL {a}" + (f" (baseline {b})" if b is not None else "") for n, a, b in suite_acceptance(report.raw)[:6]]
    if report.passed is True and report.gated:
        n = len(report.info.gates)
        verdict = "the gate passed" if n == 1 else f"all {n} gates passed"
    elif report.passed is True:
        verdict = "measured only: no acceptance gate was set"
    else:
        verdict = ("did not pass" if report.passed is False else "no verdict") + (f" ({reason})" if reason else "") \
            + (f"; published with `{forced_by}`" if forced_by else "")
    return LineageStep(stage="validate", summary="; ".join([head, *als, verdict]))


def lineage(prov: dict[str, Any], report: Any, forced_by: str | None = None, reason: str | None = None) -> list[LineageStep]:
    """Every stage the drafter went through, source first: the source's format and producer, the conversion and its
    verdict, the quantization, the validation (``report``, a ``LoadedReport``, or why there is none). Local paths
    are left out (the summaries name no path); pass the result through :func:`public` all the same."""
    nodes = list(reversed(chain(prov)))
    steps: list[LineageStep] = []
    if nodes:
        fmt, producer, sha, hub = _source_of(nodes[0])
        if fmt or producer:
            steps.append(LineageStep(stage="source", summary=f"{_gen(fmt)} drafter" + (f" `{hub}`" if hub else "")
                                     + (f" from {producer}" if producer else "")
                                     + (f", weights sha256 {sha[:12]}..." if isinstance(sha, str) and sha else "")))
    for node in nodes:
        kind = _kind(node)
        if kind == "convert":
            steps.append(_convert_step(node))
        elif kind == "quantize":
            steps.append(_quantize_step(node))
        else:
            steps += _other_steps(node)
    steps.append(_validate_step(report, forced_by, reason))
    return steps
