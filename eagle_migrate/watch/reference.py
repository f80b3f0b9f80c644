"""What ``watch --reference`` compares live traffic with: the AL (± SE) and per-position rates a drafter was validated
and published at, read from validate's ``report.json`` or from a published repo's model card.

Accepted: a ``report.json``; a folder holding one (validate's ``--report DIR``, or a published repo's
``validation/report.json``); a model card (``README.md``, or a repo folder without the report), whose "Validation"
table (``publish/card.py``) gives each suite's AL (± SE) and per-position rates and "all suites" the pooled AL.
Without ``suite`` the reference is every suite pooled: from a report, the suites' counters summed (AL and rates) with
the pooled SE (``overall.new_se``, else the suites' SEs combined as independent); from a card, its "all suites" row
(AL only) or its one suite. Imports: errors, formats.io, fingerprints, engines.metrics (the report's Metrics).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from ..errors import CheckpointError, InputError
from ..fingerprints import is_hub_id
from ..formats.io import read_json
from ..engines.metrics import Metrics

ALL = "all suites"


class Reference(BaseModel):
    """The validated acceptance a watch compares with."""

    source: str = Field(..., description="the file read")
    kind: str = Field(..., description="report (validate's report.json) | card (a published model card)")
    suite: str = Field(..., description="the suite compared with, or 'all suites' (pooled)")
    k: int | None = Field(None, description="draft tokens per step of the validation")
    al: float
    al_se: float | None = Field(None, description="its standard error as the report / card gives it (request or "
                                "block of requests as the unit); null: none given")
    per_position: list[float] | None = None
    per_position_se: list[float] | None = None
    drafts: int | None = None
    engine: str | None = None
    checkpoint: str | None = None
    weights_sha256: str | None = None

    def text(self) -> str:
        se = f" ± {self.al_se:.3f}" if self.al_se is not None else " (no SE)"
        return f"validated AL {self.al:.3f}{se} ({self.suite}, {self.kind} {self.source})"


def read_reference(path: str | Path, suite: str | None = None) -> Reference:
    """The reference in ``path`` (module docstring); InputError when it cannot be read or has no such suite."""
    p = Path(path)
    if not p.exists():
        if is_hub_id(str(path)):
            raise InputError(f"--reference {path}: not a local file or folder",
                             f"download the published repo first (huggingface-cli download {path} --local-dir DIR) "
                             "and pass DIR")
        raise InputError(f"--reference {path}: no such file or folder")
    if p.is_dir():
        for cand, reader in ((p / "report.json", _from_report), (p / "validation" / "report.json", _from_report),
                             (p / "README.md", _from_card)):
            if cand.is_file():
                return reader(cand, suite)
        raise InputError(f"--reference {p}: no report.json, validation/report.json or README.md in it",
                         "pass validate's --report folder, its report.json, or a published repo's folder or card")
    return (_from_card if p.suffix.lower() in (".md", ".markdown") else _from_report)(p, suite)


# ----- validate's report.json ------------------------------------------------------------------------------------------
def _from_report(path: Path, suite: str | None) -> Reference:
    try:
        raw = read_json(path, "validation report")
    except CheckpointError as e:
        raise InputError(e.message, "pass validate's report.json (--report DIR)") from None
    suites = raw.get("suites") if isinstance(raw, dict) else None
    if not isinstance(suites, list) or not suites:
        raise InputError(f"{path}: no suites in it (not a validate report.json)", "pass validate's report.json")
    try:
        named = {str(s.get("name")): Metrics.model_validate(s.get("new")) for s in suites}
    except (ValidationError, AttributeError):
        raise InputError(f"{path}: its suites are not validate's layout (suites[].new)",
                         "pass a report.json written by eagle-migrate validate") from None
    settings = raw.get("settings") if isinstance(raw.get("settings"), dict) else {}
    k = settings.get("num_speculative_tokens")
    common = {"source": str(path), "kind": "report", "k": int(k) if isinstance(k, int) else None,
              "engine": " ".join(str(x) for x in (raw.get("engine"), raw.get("engine_version")) if x) or None,
              "checkpoint": raw.get("checkpoint") if isinstance(raw.get("checkpoint"), str) else None,
              "weights_sha256": raw.get("weights_sha256") if isinstance(raw.get("weights_sha256"), str) else None}
    if suite is not None:
        if suite not in named:
            raise InputError(f"--reference-suite {suite}: not in {path}", f"choose from {', '.join(named)}")
        m = named[suite]
        return Reference(suite=suite, al=m.acceptance_length, al_se=m.acceptance_length_se,
                         per_position=list(m.per_position_rate), per_position_se=m.per_position_rate_se,
                         drafts=m.num_drafts, **common)
    return _pooled(list(named.values()), raw.get("overall"), common)


def _pooled(ms: list[Metrics], overall: Any, common: dict[str, Any]) -> Reference:
    """Every suite's counters together; the SE from ``overall.new_se`` (the request as the unit over all suites),
    else the suites' SEs combined as independent: var = sum (D_s / D)^2 SE_s^2."""
    d = sum(m.num_drafts for m in ms)
    if d <= 0:
        raise InputError(f"{common['source']}: the report's suites drafted nothing", "pass a report that measured")
    k = max(len(m.accepted_per_position) for m in ms)
    acc = [sum((m.accepted_per_position + [0] * k)[i] for m in ms) for i in range(k)]
    al = 1.0 + sum(m.num_accepted_tokens for m in ms) / d

    def combined(ses: list[float | None]) -> float | None:
        if any(s is None for s in ses):
            return None
        return math.sqrt(sum((m.num_drafts / d) ** 2 * s ** 2 for m, s in zip(ms, ses)))

    o = overall if isinstance(overall, dict) else {}
    se = float(o["new_se"]) if isinstance(o.get("new_se"), (int, float)) else combined([m.acceptance_length_se for m in ms])
    pos_se = None
    if all(m.per_position_rate_se is not None and len(m.per_position_rate_se) >= k for m in ms):
        pos_se = [combined([m.per_position_rate_se[i] for m in ms]) for i in range(k)]
    return Reference(suite=ALL, al=al, al_se=se, per_position=[a / d for a in acc], per_position_se=pos_se, drafts=d,
                     **common)


# ----- a model card --------------------------------------------------------------------------------------------------
_NUM = r"([0-9]+(?:\.[0-9]+)?)"


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _card_table(text: str) -> tuple[list[str], list[list[str]]]:
    """The Validation section's suite table (header with ``suite`` and ``AL``)."""
    section = text.split("## Validation", 1)[1] if "## Validation" in text else text
    section = section.split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.strip().startswith("|")]
    for i, ln in enumerate(lines):
        head = [c.lower() for c in _cells(ln)]
        if head and head[0] == "suite" and "al" in head:
            rows = [_cells(r) for r in lines[i + 2:]]
            return head, [r for r in rows if len(r) == len(head)]
    return [], []


def _from_card(path: Path, suite: str | None) -> Reference:
    text = path.read_text(encoding="utf-8", errors="replace")
    head, rows = _card_table(text)
    if not rows:
        raise InputError(f"{path}: no validation table (| suite | AL | ...) in this card",
                         "pass the card of a repo published by eagle-migrate, or validate's report.json")
    by_name = {r[0]: r for r in rows}
    if suite is not None:
        if suite not in by_name:
            raise InputError(f"--reference-suite {suite}: not in {path}", f"choose from {', '.join(by_name)}")
        row = by_name[suite]
    elif ALL in by_name:
        row = by_name[ALL]
    elif len(rows) == 1:
        row = rows[0]
    else:
        raise InputError(f"{path}: the card lists {len(rows)} suites and no pooled row",
                         f"pick one with --reference-suite ({', '.join(by_name)})")
    al_cell = row[head.index("al")]
    m = re.match(_NUM + r"(?:\s*±\s*" + _NUM + ")?", al_cell)
    if not m:
        raise InputError(f"{path}: suite {row[0]}: no AL in '{al_cell}'")
    pos = None
    if "per-position rate" in head:
        vals = re.findall(_NUM, row[head.index("per-position rate")])
        pos = [float(x) for x in vals] or None
    km = re.search(r"\bk:\s*(\d+)", text)
    em = re.search(r"engine:\s*([^,\n]+)", text)
    return Reference(source=str(path), kind="card", suite=row[0], k=int(km.group(1)) if km else None,
                     al=float(m.group(1)), al_se=float(m.group(2)) if m.group(2) else None, per_position=pos,
                     engine=em.group(1).strip() if em else None)
