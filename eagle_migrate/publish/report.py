"""The validation report as publish reads it (``report.json`` written by ``validate``, read defensively): its verdict,
its gate rows and suite table for the card, its plots, and the sha256 of the weights it measured.

Imports: pydantic, ``errors``, ``formats.io``, ``publish.models``, ``publish.card`` (row types, cell text).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import CheckpointError, InputError
from ..formats.io import read_json
from .card import GateRow, ValidationInfo, scalar_str
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
    cols, rows = suite_table(model.suites if model.suites is not None else model.results, verdicts=bool(gates))
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
        passed=passed, gated=bool(gates), gates=gates, columns=cols, rows=rows, details=details,
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
