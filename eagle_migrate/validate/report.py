"""The validation report: typed results (pydantic), built from any engine's counters (:func:`suite_result`,
:func:`overall`: the same code for every engine), report.json / report.md, and the PNG plots.

The schema of report.json is documented in docs/validate.md (``schema_version`` 1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ..engines.metrics import (  # noqa: F401  (PairedComparison, al_text, fmt_value, value_se: re-exported)
    AcceptanceStats,
    Metrics,
    PairedComparison,
    RequestCounts,
    al_text,
    cell_stats,
    fmt_value,
    paired_comparison,
    per_request_counts,
    value_se,
)
from ..engines.server_models import LatencyStats, LoadRun, ServerInfo, ServingSpeed, SpeedLevel  # noqa: F401  (re-exported: the report's fields)
from ..formats.output import atomic_write_text
from .diagnostics import DriftDiagnostics
from .plots import write_plots

SCHEMA_VERSION = 1


class GroupResult(BaseModel):
    """One slice of a suite: a context-length bucket (long) or a template variant (template-shift)."""

    name: str
    mean_prompt_tokens: float
    new: Metrics
    baseline: Metrics | None = None
    paired: PairedComparison | None = None


class SuiteResult(BaseModel):
    name: str
    description: str
    prompt_set: dict[str, Any] = Field(..., description="name, size, max_tokens, hash, prompt_tokens, groups, sources")
    new: Metrics
    baseline: Metrics | None = None
    regression_pct: float | None = Field(None, description="100 * (baseline AL - new AL) / baseline AL; > 0 = worse")
    paired: PairedComparison | None = Field(None, description="with a baseline: the paired ratio, its SE and verdict")
    speedup: float | None = Field(None, description="output tokens/s with the new drafter / without speculation")
    groups: list[GroupResult] = Field(default_factory=list)
    passed: bool = True
    failures: list[str] = Field(default_factory=list)


class Gate(BaseModel):
    name: str = Field(..., description="min_acceptance_length | max_regression_pct")
    threshold: float
    suite: str
    value: float | None
    passed: bool


class Diagnostics(BaseModel):
    """Drift diagnostics per suite, for the new drafter and the baseline."""

    sink_tokens: int
    new: dict[str, DriftDiagnostics] = Field(default_factory=dict)
    baseline: dict[str, DriftDiagnostics] = Field(default_factory=dict)
    error: str | None = None


class ValidationReport(BaseModel):
    schema_version: int = SCHEMA_VERSION
    tool: str
    created: str
    checkpoint: str | None = Field(..., description="the drafter as given; null: validate --server with no CKPT and "
                                   "a server that does not name it")
    weights_sha256: str | None = Field(None, description="sha256 of the weights measured (formats.io.sha256_files): publish checks it")
    baseline: str | None
    target: str
    engine: str = Field(..., description="vllm | reference | server")
    engine_version: str | None
    settings: dict[str, Any]
    suites: list[SuiteResult]
    overall: dict[str, Any] = Field(default_factory=dict, description="AL over every suite's counters, new and "
                                    "baseline; their SEs (new_se, baseline_se) and the paired comparison (paired)")
    gates: list[Gate] = Field(default_factory=list)
    passed: bool = True
    failures: list[str] = Field(default_factory=list)
    diagnostics: Diagnostics | None = None
    aux_ids: dict[str, Any] = Field(default_factory=dict, description="per drafter (new, baseline): stored aux layer "
                                    "ids, the ids vLLM serves, their convention (undecided: read literally) and why")
    warnings: list[str] = Field(default_factory=list)
    server: ServerInfo | None = Field(None, description="engine server: what the server reported about itself")
    serving_speed: ServingSpeed | None = Field(None, description="--baseline-server: speed-up at each concurrency")
    report_dir: str | None = None
    files: list[str] = Field(default_factory=list)
    seconds: float = 0.0

    def suite(self, name: str) -> SuiteResult:
        return next(s for s in self.suites if s.name == name)


# ----- writing -------------------------------------------------------------------------------------------------------
# ----- building the report from an engine's counters (every engine) ---------------------------------------------------
def with_se(m: Metrics, reqs: list[RequestCounts] | None, k: int) -> Metrics:
    """``m`` with the standard errors of its AL and per-position rates, the request as the unit (engines/metrics.py);
    None without per-request counters or below two requests."""
    st = cell_stats(reqs, max(k, len(m.per_position_rate))) if reqs else None
    if st is not None and st["al_se"] is not None:
        m.acceptance_length_se = round(st["al_se"], 4)
        m.per_position_rate_se = [round(x or 0.0, 4) for x in st["per_position_se"]][:len(m.per_position_rate)]
    return m


def suite_result(s: Any, jobs: dict[str, dict[str, Any]], new_r: dict, base_r: dict | None, plain_r: dict | None,
                 *, k: int = 0, log: Any = None) -> SuiteResult:
    """One suite's metrics from the engine's counters: the new drafter, the baseline (and the regression, and the
    paired ratio with its SE where the engine counted per request), the speed-up over the target alone, and per
    group for a grouped suite."""
    keys = [k_ for k_ in jobs if k_ == s.name or k_.startswith(s.name + "/")]
    new_stats = AcceptanceStats.total([new_r[x][0] for x in keys])
    new_secs = sum(new_r[x][1]["seconds"] for x in keys)
    new_q = per_request_counts(new_r, keys)
    res = SuiteResult(name=s.name, description=s.description, prompt_set=s.manifest(),
                      new=with_se(Metrics.from_stats(new_stats, new_secs), new_q[0], k))
    if new_q[1] and log:
        log(f"{s.name}: no standard errors ({new_q[1]})")
    if base_r is not None:
        bs = AcceptanceStats.total([base_r[x][0] for x in keys])
        base_q = per_request_counts(base_r, keys)
        res.baseline = with_se(Metrics.from_stats(bs, sum(base_r[x][1]["seconds"] for x in keys)), base_q[0], k)
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
                             new=with_se(Metrics.from_stats(new_r[x][0], new_r[x][1]["seconds"]), gq[0], k))
            if base_r is not None:
                gbq = per_request_counts(base_r, [x])
                gr.baseline = with_se(Metrics.from_stats(base_r[x][0], base_r[x][1]["seconds"]), gbq[0], k)
                gr.paired = paired_comparison(gq, gbq)
            res.groups.append(gr)
    return res


def overall(jobs: dict[str, Any], new_r: dict | None, base_r: dict | None, k: int) -> dict[str, Any]:
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
        m = with_se(Metrics.from_stats(AcceptanceStats.total([r[x][0] for x in keys])), reqs[role][0], k)
        out[role] = m.acceptance_length
        if m.acceptance_length_se is not None:
            out[f"{role}_se"] = m.acceptance_length_se
    if base_r is not None:
        out["paired"] = paired_comparison(reqs["new"], reqs["baseline"]).model_dump()
    return out


def write_report(report: ValidationReport, out: Path) -> list[str]:
    """report.json, report.md and the plots into ``out`` (created); returns the file names written."""
    out.mkdir(parents=True, exist_ok=True)
    files = write_plots(report, out) if report.suites else []  # a run vLLM refused may have measured nothing
    files = ["report.json", "report.md", *files]
    report.report_dir = str(out)
    report.files = files
    (out / "report.md").write_text(render_markdown(report), encoding="utf-8")
    atomic_write_text(out / "report.json", json.dumps(report.model_dump(mode="json"), indent=2) + "\n")
    return files


def comparison_line(new: Metrics, base: Metrics | None, paired: PairedComparison | None) -> str:
    """``AL 1.519 ± 0.021 vs baseline 1.513 ± 0.020; paired ratio 1.004 ± 0.006 (within noise)``."""
    return _comparison(al_text(new), al_text(base) if base is not None else None, paired)


def overall_line(r: ValidationReport) -> str | None:
    """The overall comparison (all suites' requests together), in :func:`comparison_line`'s words."""
    o = r.overall
    if o.get("new") is None:
        return None
    base = value_se(o["baseline"], o.get("baseline_se")) if o.get("baseline") is not None else None
    paired = PairedComparison.model_validate(o["paired"]) if o.get("paired") else None
    return _comparison(value_se(o["new"], o.get("new_se")), base, paired)


def _comparison(new: str, base: str | None, paired: PairedComparison | None) -> str:
    return f"AL {new}" + (f" vs baseline {base}" if base is not None else "") + (f"; {paired.text()}" if paired else "")


def verdict_line(r: ValidationReport) -> str:
    """The report's verdict: "PASSED" only when a gate was set, "MEASURED" when none was, "FAILED" with reasons."""
    if not r.passed:
        return "FAILED: " + "; ".join(r.failures)
    if r.gates:
        return "PASSED (" + ("the gate" if len(r.gates) == 1 else f"all {len(r.gates)} gates") + ")"
    return "MEASURED: no gate was set (--min-acceptance-length / --max-regression)"


def _server_markdown(r: ValidationReport) -> list[str]:
    """The server engine's lines: standard errors across blocks, what the server reported, the speed-up table."""
    lines: list[str] = []
    if any(s.new.num_blocks is not None and s.new.acceptance_length_se is not None for s in r.suites):
        lines += ["", "Standard errors across blocks of requests (server engine): "
                  + ", ".join(f"{s.name} AL {s.new.acceptance_length:.3f} ± {fmt_value(s.new.acceptance_length_se)} "
                              f"({s.new.num_blocks} blocks)" for s in r.suites)]
    if r.server is not None:
        sv = r.server
        lines += ["", f"Server: {sv.url}, vLLM {sv.vllm_version or '?'}, model `{sv.model}`"
                  + (f" ({sv.model_root})" if sv.model_root and sv.model_root != sv.model else "")
                  + f", max_model_len {sv.max_model_len}; speculative config as reported: "
                  + ", ".join(f"{k}={v} (from {sv.sources.get(k, '?')})" for k, v in sv.speculative_config.items())]
    if r.serving_speed is not None:
        sp = r.serving_speed
        lines += ["", "## Serving speed-up", "",
                  f"Per-user output tokens/s (median over requests of output tokens / request latency), speculative "
                  f"server vs `{sp.baseline_url}` (vLLM {sp.baseline_vllm_version or '?'}), {sp.max_tokens} output "
                  "tokens per request, both measured in alternation; speed-up = median of the per-round ratios "
                  "(min-max, SE across rounds). Latencies: speculative / baseline, p50 (p99) in ms.", "",
                  "| concurrency | spec tok/s/user | base tok/s/user | speed-up | min-max | SE | TTFT | ITL | TPOT |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for lv in sp.levels:
            def med(runs, f):
                xs = sorted(f(x) for x in runs)
                return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2

            def lat(f):
                return (f"{med(lv.speculative, lambda x: f(x).p50):.1f} ({med(lv.speculative, lambda x: f(x).p99):.1f}) / "
                        f"{med(lv.baseline, lambda x: f(x).p50):.1f} ({med(lv.baseline, lambda x: f(x).p99):.1f})")

            lines.append(f"| {lv.concurrency} | {med(lv.speculative, lambda x: x.per_user_tokens_per_second):.1f} | "
                         f"{med(lv.baseline, lambda x: x.per_user_tokens_per_second):.1f} | {lv.speedup:.3f}x | "
                         f"{lv.speedup_min:.3f}-{lv.speedup_max:.3f} | {fmt_value(lv.speedup_se)} | "
                         f"{lat(lambda x: x.ttft_ms)} | {lat(lambda x: x.itl_ms)} | {lat(lambda x: x.tpot_ms)} |")
    return lines


def render_markdown(r: ValidationReport) -> str:
    lines = [f"# Validation report: `{Path(r.checkpoint).name if r.checkpoint else 'drafter not named'}`", ""]
    verdict = verdict_line(r)
    lines += [f"**{verdict}**", "",
              f"- target: `{r.target}`", (f"- drafter: `{r.checkpoint}`" if r.checkpoint else "- drafter: not named (the server does not say)")
              + (f"\n- baseline: `{r.baseline}`" if r.baseline else ""),
              f"- engine: {r.engine} {r.engine_version or ''}".rstrip(),
              "- settings: " + ", ".join(f"{k}={v}" for k, v in r.settings.items() if v is not None),
              f"- created: {r.created} by {r.tool} in {r.seconds:.0f} s", ""]
    lines += [f"- warning: {w}" for w in r.warnings] + ([""] if r.warnings else [])
    has_base = any(s.baseline for s in r.suites)
    has_speed = any(s.speedup is not None for s in r.suites)
    hdr = ["suite", "prompts", "AL new ± SE"] + (["AL baseline ± SE", "regression % (> 0 = worse)",
                                                   "paired ratio ± SE (verdict)"] if has_base else []) + \
          ["draft acc. rate", "per-position rate"] + (["speedup"] if has_speed else []) + ["gate"]
    lines += ["## Acceptance length per suite", "", "| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for s in r.suites:
        row = [s.name, str(s.prompt_set.get("size")), al_text(s.new)]
        if has_base:
            row += [al_text(s.baseline), fmt_value(s.regression_pct, 1),
                    s.paired.text().removeprefix("paired ratio ") if s.paired else "–"]
        row += [fmt_value(s.new.draft_acceptance_rate), " / ".join(f"{x:.2f}" for x in s.new.per_position_rate)]
        if has_speed:
            row += [fmt_value(s.speedup, 2) + ("x" if s.speedup is not None else "")]
        row += [("pass" if r.gates else "–") if s.passed else "**fail**: " + "; ".join(s.failures)]
        lines.append("| " + " | ".join(row) + " |")
    lines += _server_markdown(r)
    if overall_line(r):
        lines += ["", f"Overall (all suites' requests): {overall_line(r)}"]
    if has_base:
        lines += ["", "Standard errors take the request as the unit (drafts within a request are correlated); the "
                  "ratio is paired over the same prompts; improved / worse = beyond 2 SE of 1.0 (docs/validate.md)."]
    for s in r.suites:
        if not s.groups:
            continue
        lines += ["", f"### {s.name} by {'context length' if s.name == 'long' else 'group'}", "",
                  "| group | prompts | mean prompt tokens | AL new ± SE"
                  + (" | AL baseline ± SE | paired ratio ± SE (verdict)" if has_base else "") + " |",
                  "|---|---|---|---|" + ("---|---|" if has_base else "")]
        for g in s.groups:
            lines.append(f"| {g.name} | {g.new.num_prompts} | {g.mean_prompt_tokens:.0f} | {al_text(g.new)}"
                         + (f" | {al_text(g.baseline)} | "
                            + (g.paired.text().removeprefix("paired ratio ") if g.paired else "–") if has_base else "")
                         + " |")
    if r.diagnostics and (r.diagnostics.new or r.diagnostics.error):
        d = r.diagnostics
        lines += ["", "## Drift diagnostics", "",
                  f"Per speculation step: RMS of the hidden state the drafter received (`fed_rms`), attention mass on the "
                  f"first {d.sink_tokens} tokens (`sink`) and on the drafter's own draft tokens (`draft`), and the "
                  "teacher-forced match rate.", ""]
        if d.error:
            lines.append(f"Not measured: {d.error}")
        for suite, dn in d.new.items():
            db = d.baseline.get(suite)
            lines += [f"### {suite}", "", "| step | fed_rms new | sink new | draft new | match new"
                      + (" | fed_rms base | sink base | draft base | match base" if db else "") + " |",
                      "|---|---|---|---|---|" + ("---|---|---|---|" if db else "")]
            for j, st in enumerate(dn.steps):
                row = f"| {j} | {st.fed_rms:.3f} | {st.sink_mass:.3f} | {st.draft_mass:.3f} | {st.match_rate:.3f}"
                if db and j < len(db.steps):
                    b = db.steps[j]
                    row += f" | {b.fed_rms:.3f} | {b.sink_mass:.3f} | {b.draft_mass:.3f} | {b.match_rate:.3f}"
                lines.append(row + " |")
            lines.append("")
    lines += ["", "## Prompt sets", "", "| suite | size | max tokens | prompt tokens | hash | sources |", "|---|---|---|---|---|---|"]
    for s in r.suites:
        p = s.prompt_set
        lines.append(f"| {s.name} | {p.get('size')} | {p.get('max_tokens')} | {p.get('prompt_tokens')} | `{p.get('hash')}` | "
                     f"{', '.join(p.get('sources') or []) or '–'} |")
    if r.gates:
        lines += ["", "## Gates", "", "| gate | threshold | suite | value | result |", "|---|---|---|---|---|"]
        for g in r.gates:
            lines.append(f"| {g.name} | {g.threshold} | {g.suite} | {fmt_value(g.value)} | {'pass' if g.passed else 'FAIL'} |")
    pngs = [f for f in r.files if f.endswith(".png")]
    one = single_bucket_line(r)
    if pngs or one:
        lines += ["", "## Plots", ""] + [f"![{f}]({f})" for f in pngs] + ([f"{one}."] if one else [])
    return "\n".join(lines) + "\n"


def single_bucket_line(r: ValidationReport) -> str | None:
    """The one line that replaces al_vs_context.png when the long suite has a single context bucket."""
    long = next((s for s in r.suites if s.name == "long" and s.groups), None)
    if long is None or len(long.groups) != 1:
        return None
    g = long.groups[0]
    base = f", baseline {fmt_value(g.baseline.acceptance_length)}" if g.baseline else ""
    return (f"AL vs context length: one bucket only ({g.name}, {g.mean_prompt_tokens:.0f} prompt tokens): "
            f"new {fmt_value(g.new.acceptance_length)}{base}; no plot over a single point")
