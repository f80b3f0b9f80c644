"""The validation report as publish reads it (``report.json`` written by ``validate``, read defensively): its verdict,
its gate rows and suite table for the card (validate's own layout: each AL with its standard error and, with a
baseline, the paired ratio with its SE and verdict; other layouts: whatever numbers their suites hold), its plots,
and the sha256 of the weights it measured.

Imports: pydantic, ``errors``, ``formats.io``, ``engines.metrics`` (PairedComparison), ``publish.models``,
``publish.card`` (row types, cell text).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..engines.metrics import PairedComparison
from ..errors import CheckpointError, InputError
from ..formats.io import read_json
from .card import GateRow, ValidationInfo, fixed, scalar_str
from .models import MAX_PLOTS, REPORT_FILE, VALIDATION_DIR

_SHA_KEYS = ("drafter_sha256", "checkpoint_sha256", "weights_sha256")
_DROP_KEYS = {"outputs", "drafts", "accepted_per_position", "num_drafts", "num_draft_tokens", "num_accepted_tokens",
              "num_output_tokens", "seconds", "prompts"}
_PRETTY = {"acceptance_length": "AL", "draft_acceptance_rate": "acceptance rate", "per_position_rate": "per-position rate",
           "num_prompts": "prompts", "baseline_acceptance_length": "baseline AL",
           "regression_pct": "regression % (> 0 = worse)"}
_RERUN = "re-run `eagle-migrate validate ... --report DIR`"


class ReportView(BaseModel):
    """report.json as written by ``validate`` (read defensively: unknown keys kept, shapes checked on use)."""

    model_config = ConfigDict(extra="allow")

    passed: bool | None = None
    ok: bool | None = None
    status: str | None = None
    gates: Any = None
    suites: Any = None
    results: Any = None
    num_speculative_tokens: int | None = None
    engine: str | None = None
    target: Any = None
    temperature: float | None = None
    vllm_version: str | None = None
    engine_version: str | None = None  # what validate writes (vllm_version: older reports)
    settings: Any = None  # validate writes k and the temperature here


class LoadedReport(BaseModel):
    """A report read for publishing: the raw JSON, its view, the verdict and what the card shows of it."""

    path: Path
    raw: dict[str, Any]
    model: ReportView
    passed: bool | None = Field(..., description="publishable: True when the report says it passed and no gate failed "
                                "(measured without a gate counts: see ``gated``), False when it did not pass, None: no verdict")
    reason: str | None
    gated: bool = Field(False, description="the report has at least one gate; \"passed\" is only said when it has")
    info: ValidationInfo
    files: list[Path]  # report.json, report.md, plots


# ----- gate rows and the suite table ---------------------------------------------------------------------------------
def _passed_of(d: Any) -> bool | None:
    if isinstance(d, bool):
        return d
    if not isinstance(d, dict):
        return None
    for k in ("passed", "ok", "pass"):
        if isinstance(d.get(k), bool):
            return d[k]
    st = d.get("status") or d.get("result")
    if isinstance(st, str):
        return st.lower() in ("pass", "passed", "ok", "success")
    return None


def gate_rows(raw: Any) -> list[GateRow]:
    """The report's gates (a list of gate objects or a name -> gate mapping) as card rows."""
    items: list[tuple[str, Any]] = []
    if isinstance(raw, list):
        items = [(str((g or {}).get("name") or (g or {}).get("gate") or f"gate {i + 1}") if isinstance(g, dict) else f"gate {i + 1}", g)
                 for i, g in enumerate(raw)]
    elif isinstance(raw, dict):
        items = [(str(k), v) for k, v in raw.items()]
    rows = []
    for name, g in items:
        detail = None
        if isinstance(g, dict):
            parts = []
            for key in ("message", "detail", "reason"):
                if isinstance(g.get(key), str):
                    parts.append(g[key])
                    break
            else:
                for key in ("value", "threshold", "min", "max"):
                    if key in g and isinstance(g[key], (int, float, str)) and not isinstance(g[key], bool):
                        parts.append(f"{key} {scalar_str(g[key])}")
            detail = "; ".join(parts) or None
        rows.append(GateRow(name=name, passed=_passed_of(g), detail=detail))
    return rows


def _flatten_row(d: dict[str, Any], prefix: str = "", depth: int = 0) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        if k in _DROP_KEYS:
            continue
        key = f"{prefix}{k}"
        if isinstance(v, dict) and depth == 0:
            out.update(_flatten_row(v, key + ".", 1))
        elif isinstance(v, list) and 0 < len(v) <= 16 and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            out[key] = " / ".join(scalar_str(float(x)) if isinstance(x, float) else str(x) for x in v)
        elif v is None or isinstance(v, (str, int, float, bool)):
            out[key] = "" if v is None else scalar_str(v)
    return out


def _pretty_col(c: str) -> str:
    return " ".join(_PRETTY.get(p, p.replace("_", " ")) for p in c.split("."))


def _col_rank(c: str) -> int:
    lc = c.lower()
    if "acceptance_length" in lc and "baseline" not in lc and "source" not in lc:
        return 0
    if "acceptance_length" in lc:
        return 1
    if any(w in lc for w in ("delta", "change", "regression", "ratio")):
        return 2
    if "passed" in lc or lc == "ok":
        return 3
    if "rate" in lc:
        return 4
    return 5


def suite_table(raw: Any, max_cols: int = 8, verdicts: bool = True) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the report's per-suite results: AL first, then changes, verdicts, rates, the rest.
    ``verdicts=False`` leaves out per-suite pass / fail columns (a report without gates has nothing to pass)."""
    if isinstance(raw, dict):
        entries = [(str(k), v) for k, v in raw.items() if isinstance(v, dict)]
    elif isinstance(raw, list):
        entries = [(str(v.get("suite") or v.get("name") or i + 1), v) for i, v in enumerate(raw) if isinstance(v, dict)]
    else:
        return [], []
    flat = [(name, _flatten_row({k: x for k, x in v.items() if k not in ("suite", "name")})) for name, v in entries]
    cols: list[str] = []
    for _, f in flat:
        cols += [c for c in f if c not in cols and (verdicts or c.split(".")[-1] not in ("passed", "ok", "pass", "failures"))]
    cols = sorted(cols, key=lambda c: (_col_rank(c), cols.index(c)))[: max_cols - 1]
    return ["suite"] + [_pretty_col(c) for c in cols], [[name] + [f.get(c, "") for c in cols] for name, f in flat]


# ----- validate's own layout: AL ± SE, the paired ratio ± SE and its verdict ------------------------------------------
def as_number(v: Any) -> float | None:
    """``v`` as a float when the report holds a number there (never a bool), else None (reports are read defensively)."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def al_cell(x: Any, se: Any) -> str:
    """``1.519 ± 0.021``; the AL alone when the report has no SE for it (an older report: never a made-up one)."""
    if as_number(x) is None:
        return ""
    return fixed(float(x)) + (f" ± {fixed(float(se))}" if as_number(se) is not None else "")


def paired_of(d: Any) -> PairedComparison | None:
    """A report's ``paired`` object, or None when there is none (older reports) or it is not one."""
    if not isinstance(d, dict):
        return None
    try:
        return PairedComparison.model_validate(d)
    except ValidationError:
        return None


def paired_cells(p: PairedComparison | None) -> tuple[str, str]:
    """(``1.004 ± 0.006``, ``within noise``) for the card's table; without a ratio or an SE, what there is and why."""
    if p is None:
        return "", ""
    if p.ratio is None:
        return "n/a", p.note or ""
    if p.se is None:
        return fixed(p.ratio), f"no SE ({p.note})" if p.note else "no SE"
    return f"{fixed(p.ratio)} ± {fixed(p.se)}", p.verdict or ""


def _is_validate_layout(raw: Any) -> bool:
    return (isinstance(raw, list) and bool(raw)
            and all(isinstance(v, dict) and isinstance(v.get("new"), dict) and as_number(v["new"].get("acceptance_length")) is not None
                    for v in raw))


def se_table(raw: Any, overall: Any, verdicts: bool = True) -> tuple[list[str], list[list[str]], str | None] | None:
    """(header, rows, legend) of validate's suites (``SuiteResult``: ``new`` / ``baseline`` metrics, ``paired``), each
    AL with its SE and, with a baseline, the paired ratio with its SE and verdict, then "all suites" from ``overall``;
    None for another layout (:func:`suite_table` reads those). Columns without a value in any row are left out, so an
    older report (no SEs, no ``paired``) shows its ALs alone; the legend is given only when some SE is shown."""
    if not _is_validate_layout(raw):
        return None
    base = {i: v["baseline"] for i, v in enumerate(raw) if isinstance(v.get("baseline"), dict)}
    rows = []
    for i, v in enumerate(raw):
        new, b = v["new"], base.get(i, {})
        ratio, verdict = paired_cells(paired_of(v.get("paired")))
        pos = new.get("per_position_rate")
        rows.append([str(v.get("name") or v.get("suite") or i + 1), al_cell(new.get("acceptance_length"), new.get("acceptance_length_se")),
                     al_cell(b.get("acceptance_length"), b.get("acceptance_length_se")), ratio, verdict,
                     "" if as_number(v.get("regression_pct")) is None else fixed(float(v["regression_pct"])),
                     " / ".join(fixed(float(x)) for x in pos if as_number(x) is not None) if isinstance(pos, list) else "",
                     scalar_str(v["passed"]) if verdicts and isinstance(v.get("passed"), bool) else ""])
    o = overall if isinstance(overall, dict) else {}
    if len(raw) > 1 and as_number(o.get("new")) is not None:
        rows.append(["all suites", al_cell(o["new"], o.get("new_se")), al_cell(o.get("baseline"), o.get("baseline_se")),
                     *paired_cells(paired_of(o.get("paired"))), "", "", ""])
    header = ["suite", "AL", "baseline AL", "paired ratio (AL / baseline AL)", "verdict", "regression % (> 0 = worse)",
              "per-position rate", "passed"]
    keep = [0] + [j for j in range(1, len(header)) if any(r[j] for r in rows)]
    se_shown = any("±" in r[j] for r in rows for j in (1, 2, 3))
    blocks = any(as_number(v["new"].get("num_blocks")) is not None for v in raw)
    legend = None
    if se_shown:
        legend = (f"AL ± its standard error ({'blocks of requests' if blocks else 'the request'} as the unit)"
                  + ("; paired ratio = AL / baseline AL on the same prompts ± its paired standard error: improved or "
                     "worse only beyond 2 SE of 1.0, else within noise" if base else "") + ".")
    return [header[j] for j in keep], [[r[j] for j in keep] for r in rows], legend


# ----- reading it ----------------------------------------------------------------------------------------------------
def _verdict(model: ReportView, gates: list[GateRow]) -> tuple[bool | None, str | None]:
    explicit = next((x for x in (model.passed, model.ok) if x is not None), None)
    if explicit is None and model.status:
        explicit = model.status.lower() in ("pass", "passed", "ok", "success")
    failing = [g.name for g in gates if g.passed is False]
    unknown = [g.name for g in gates if g.passed is None]
    if explicit is False:
        return False, "the report says it did not pass" + (f" (gates: {', '.join(failing)})" if failing else "")
    if failing:
        return False, f"gates failed: {', '.join(failing)}"
    if explicit is True or (gates and not unknown):
        return True, None
    return None, "the report records no verdict (no `passed` and no gate results)"


def load_report(report_dir: Path) -> LoadedReport:
    """The report in ``report_dir`` (or the report.json given), its verdict and what the card shows of it."""
    report_dir = Path(report_dir)
    path = report_dir / REPORT_FILE if report_dir.is_dir() else report_dir
    if not path.is_file():
        raise InputError(f"{report_dir}: no {REPORT_FILE}", "pass the folder given to `eagle-migrate validate --report DIR`")
    try:
        raw = read_json(path, "validation report")
    except CheckpointError as e:
        raise InputError(e.message, _RERUN) from None
    if not isinstance(raw, dict):
        raise InputError(f"{path}: expected a JSON object, found {type(raw).__name__}", _RERUN)
    try:
        model = ReportView.model_validate(raw)
    except ValidationError as e:
        raise InputError(f"{path}: unexpected report layout ({e.errors()[0]['loc']}: {e.errors()[0]['msg']})", _RERUN) from None
    st = model.settings if isinstance(model.settings, dict) else {}
    if model.num_speculative_tokens is None and isinstance(st.get("num_speculative_tokens"), int):
        model.num_speculative_tokens = st["num_speculative_tokens"]
    if model.temperature is None and isinstance(st.get("temperature"), (int, float)):
        model.temperature = float(st["temperature"])
    gates = gate_rows(model.gates)
    passed, reason = _verdict(model, gates)
    suites = model.suites if model.suites is not None else model.results
    table = se_table(suites, raw.get("overall"), verdicts=bool(gates))
    (cols, rows), legend = (table[:2], table[2]) if table else (suite_table(suites, verdicts=bool(gates)), None)
    details: list[tuple[str, str]] = []
    if model.engine:
        version = model.vllm_version or model.engine_version
        details.append(("engine", model.engine + (f" {version}" if version else "")))
    if model.num_speculative_tokens:
        details.append(("k", str(model.num_speculative_tokens)))
    if model.temperature is not None:
        details.append(("temperature", f"{model.temperature:g}"))
    speed = speedup_detail(raw.get("serving_speed"))
    if speed:
        details.append(speed)
    folder = path.parent
    plots = sorted(p for p in folder.glob("*.png") if p.is_file())[:MAX_PLOTS]
    md = folder / "report.md"
    files = [path] + ([md] if md.is_file() else []) + plots
    info = ValidationInfo(
        passed=passed, gated=bool(gates), gates=gates, columns=cols, rows=rows, legend=legend, details=details,
        images=[f"{VALIDATION_DIR}/{p.name}" for p in plots], report_path=f"{VALIDATION_DIR}/{REPORT_FILE}",
    )
    return LoadedReport(path=path, raw=raw, model=model, passed=passed, reason=reason, gated=bool(gates), info=info, files=files)


def gated_verdict(report: LoadedReport | None) -> bool | None:
    """"passed" as it may be stated: True only when the report has gates and all of them passed; False when it did
    not pass; None when there is no report, no verdict, or no gate was set (measured only)."""
    if report is None or report.passed is None:
        return None
    return report.passed if (report.gated or report.passed is False) else None


def speedup_detail(speed: Any) -> tuple[str, str] | None:
    """The card's speed-up row from ``serving_speed`` (``validate --server --baseline-server``): per concurrency the
    ratio of per-user output tokens/s to the same target served without speculation, with its min-max over rounds."""
    if not isinstance(speed, dict) or not isinstance(speed.get("levels"), list):
        return None
    cells = []
    for lv in speed["levels"]:
        if not isinstance(lv, dict) or not isinstance(lv.get("speedup"), (int, float)):
            continue
        spread = (f" ({lv['speedup_min']:.2f}-{lv['speedup_max']:.2f})"
                  if isinstance(lv.get("speedup_min"), (int, float)) and isinstance(lv.get("speedup_max"), (int, float)) else "")
        cells.append(f"C={lv.get('concurrency')} {lv['speedup']:.2f}x{spread}")
    if not cells:
        return None
    return ("serving speed-up (per-user output tokens/s vs the target served without speculation, min-max over rounds)",
            ", ".join(cells))


def report_sha(raw: dict[str, Any]) -> str | None:
    """The sha256 of the weights a report measured (None when it records none)."""
    for d in (raw, raw.get("drafter") if isinstance(raw.get("drafter"), dict) else {}, raw.get("checkpoint") if isinstance(raw.get("checkpoint"), dict) else {}):
        for k in _SHA_KEYS + ("sha256",):
            if isinstance(d.get(k), str) and len(d[k]) == 64:
                return d[k].lower()
    return None
