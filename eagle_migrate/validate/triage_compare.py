"""Before and after: the groups of an earlier triage re-measured on a new run, paired request by request
(``validate --server URL --prompts FILE --triage --compare OLD/triage.json``).

After a team recalibrates its drafter and redeploys, the same prompts are replayed on the new server, and the groups
of the old report (every group it listed, the ones below the pool first) are shown before and after. A group's
members are the old run's: the requests that were in it then (their features as the old report recorded them).

Pairing. A request of the new run pairs with one of the old run when both have the same line in the prompts file and
the same prompt (``TriagedRequest.prompt_hash``: a hash of the prompt's record, not of how the server rendered it);
a prompt repeated on one line (a JSON list file, line 0) pairs in order. Requests present in one run only are left
out and counted (``only_before``, ``only_after``, with their first lines). An old report without prompt hashes (written
before they existed) pairs by line alone, and says so. Nothing paired is an InputError, raised before any request
is sent (:func:`check_pairs` on the new file's records).

Statistics (engines/metrics.py, no new math): per group, AL before and after over its paired requests
(``al_of``: 1 + accepted / drafts, SE across requests) and the paired ratio AL(after) / AL(before) with its
delta-method SE, the request as the unit (``paired_comparison``: the between-prompt variance cancels), and its
verdict: improved / worse beyond 2 SE of 1.0, else within noise (no verdict below two requests). The same over every
paired request: the pooled ratio.
Imports: pydantic, errors, corpora (Conversation), engines.metrics, validate.triage.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, Field, ValidationError

from ..corpora import Conversation
from ..engines.metrics import PairedComparison, RequestCounts, paired_comparison
from ..errors import InputError
from .triage import GroupAL, TriagedRequest, al_of, prompt_hash

LINES_SHOWN = 10  # lines of unpaired requests listed in the report (all are counted)


class BeforeReport(BaseModel):
    """The parts of an earlier triage.json that a comparison reads (other fields are ignored)."""

    prompts_file: str = ""
    server: dict = Field(default_factory=dict)
    requests: list[TriagedRequest]
    groups: list[GroupAL] = Field(default_factory=list)


class GroupChange(BaseModel):
    """One group of the old report (or the pool of every paired request), before and after on the same requests."""

    feature: str
    name: str
    below_before: bool = Field(False, description="named below the pool in the old report")
    requests: int = Field(..., description="the group's requests that paired")
    al_before: Optional[float] = None
    se_before: Optional[float] = None
    al_after: Optional[float] = None
    se_after: Optional[float] = None
    paired: PairedComparison
    text: str = ""


class TriageComparison(BaseModel):
    """A triage compared with an earlier one (module docstring)."""

    before_file: str
    before_prompts_file: str = ""
    before_server: Optional[str] = None
    keyed_by: str = Field(..., description="what pairs two requests: line and prompt hash (or line alone for an "
                                           "old report without prompt hashes)")
    paired: int = Field(..., description="requests in both runs")
    only_before: int = Field(0, description="requests of the old report with no match in this run (left out)")
    only_after: int = Field(0, description="requests of this run with no match in the old report (left out)")
    only_before_lines: list[int] = Field(default_factory=list, description=f"their first {LINES_SHOWN} lines")
    only_after_lines: list[int] = Field(default_factory=list, description=f"their first {LINES_SHOWN} lines")
    pooled: GroupChange
    groups: list[GroupChange] = Field(default_factory=list)
    improved: list[str] = Field(default_factory=list, description="groups improved beyond 2 SE, in words")
    worse: list[str] = Field(default_factory=list, description="groups worse beyond 2 SE, in words")


def read_before(path: str | Path) -> BeforeReport:
    """An earlier triage's report (``--report DIR`` wrote it as ``DIR/triage.json``); InputError when it is missing,
    not JSON or not a triage report."""
    p = Path(path)
    hint = "pass the triage.json that validate --server URL --prompts FILE --triage --report DIR wrote"
    if p.is_dir() and (p / "triage.json").is_file():
        p = p / "triage.json"
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"--compare {path}: no such file", hint) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"--compare {path}: not a JSON triage report ({e})", hint) from None
    if not isinstance(doc, dict) or "requests" not in doc:
        raise InputError(f"--compare {path}: not a triage report (no per-request list)", hint)
    try:
        return BeforeReport.model_validate(doc)
    except ValidationError as e:
        raise InputError(f"--compare {path}: not a triage report ({e.error_count()} fields do not parse, first: "
                         f"{'.'.join(map(str, e.errors()[0]['loc']))}: {e.errors()[0]['msg']})", hint) from None


def _hashed(before: BeforeReport) -> bool:
    return bool(before.requests) and all(r.prompt_hash for r in before.requests)


def _key(line: int, h: str, hashed: bool) -> tuple[int, str]:
    return (line, h if hashed else "")


def check_pairs(before: BeforeReport, convs: list[Conversation], path: str | Path, prompts_file: str | Path) -> None:
    """Refuse (InputError) a comparison in which no request of the new prompts file can pair with the old report's:
    another file's prompts (checked before any request is sent)."""
    hashed = _hashed(before)
    old = {_key(r.line, r.prompt_hash, hashed) for r in before.requests}
    if not any(_key(c.line, prompt_hash(c), hashed) in old for c in convs):
        raise InputError(f"--compare {path}: none of its {len(before.requests)} requests has a match in "
                         f"{prompts_file} ({len(convs)} records; a pair is the same line and the same prompt): "
                         f"it triaged other prompts" + (f" ({before.prompts_file})" if before.prompts_file else ""),
                         "compare with the triage of the same prompts file, replayed before the change")


def pair(before: list[TriagedRequest], after: list[TriagedRequest],
         hashed: bool = True) -> tuple[list[tuple[TriagedRequest, TriagedRequest]], list[TriagedRequest],
                                      list[TriagedRequest]]:
    """(pairs (before, after), the old run's requests without a match, the new run's without one): same line and
    same prompt hash (``hashed`` false: same line), repeated keys paired in order."""
    by_key: dict[tuple[int, str], list[TriagedRequest]] = defaultdict(list)
    for r in sorted(before, key=lambda r: r.index):
        by_key[_key(r.line, r.prompt_hash, hashed)].append(r)
    pairs, only_after = [], []
    for a in sorted(after, key=lambda r: r.index):
        olds = by_key.get(_key(a.line, a.prompt_hash, hashed))
        if olds:
            pairs.append((olds.pop(0), a))
        else:
            only_after.append(a)
    only_before = sorted((r for rs in by_key.values() for r in rs), key=lambda r: r.index)
    return pairs, only_before, only_after


def _counts(reqs: list[TriagedRequest]) -> list[RequestCounts]:
    return [RequestCounts(r.num_drafts, r.num_accepted_tokens) for r in reqs]


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def change(feature: str, name: str, pairs: list[tuple[TriagedRequest, TriagedRequest]],
           below_before: bool = False) -> GroupChange:
    """AL before and after over ``pairs`` and their paired ratio (engines/metrics.py's ``paired_comparison``)."""
    b, a = [p[0] for p in pairs], [p[1] for p in pairs]
    (alb, seb), (ala, sea) = al_of(b), al_of(a)
    pc = (paired_comparison((_counts(a), None), (_counts(b), None)) if pairs
          else PairedComparison(requests=0, note="no request of this group paired"))
    g = GroupChange(feature=feature, name=name, below_before=below_before, requests=len(pairs), al_before=_r(alb),
                    se_before=_r(seb), al_after=_r(ala), se_after=_r(sea), paired=pc)

    def al(x: float | None, se: float | None) -> str:
        return "n/a" if x is None else f"{x:.2f}" + ("" if se is None else f" +- {se:.2f}")

    g.text = f"{name}: AL {al(alb, seb)} before, {al(ala, sea)} after, {pc.text()} ({len(pairs)} paired requests)"
    return g


def compare(before: BeforeReport, after: list[TriagedRequest], path: str | Path) -> TriageComparison:
    """The old report's groups and the pool, before and after on the paired requests (module docstring)."""
    hashed = _hashed(before)
    pairs, only_b, only_a = pair(before.requests, after, hashed)
    # the groups and the pool count the requests that drafted on both sides, as the triage's groups do
    drafted = [p for p in pairs if p[0].num_drafts > 0 and p[1].num_drafts > 0]
    groups = [change(g.feature, g.name, [p for p in drafted if p[0].feature(g.feature) == g.name], g.named)
              for g in before.groups]
    out = TriageComparison(
        before_file=str(path), before_prompts_file=before.prompts_file, before_server=before.server.get("url"),
        keyed_by="line and prompt hash" if hashed else "line alone (the old report has no prompt hashes)",
        paired=len(pairs), only_before=len(only_b), only_after=len(only_a),
        only_before_lines=[r.line for r in only_b[:LINES_SHOWN]], only_after_lines=[r.line for r in only_a[:LINES_SHOWN]],
        pooled=change("pool", "all paired requests", drafted), groups=groups)
    out.improved = [g.text for g in groups if g.paired.verdict == "improved"]
    out.worse = [g.text for g in groups if g.paired.verdict == "worse"]
    return out
