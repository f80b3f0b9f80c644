"""The typed options and results of ``watch`` (watch/loop.py): :class:`WatchOptions` (every option, checked once),
:class:`WindowResult` (one window: per replica and pooled :class:`ScopeWindow`, the break-even AL, the alerts) and
:class:`WatchResult` (the summary), and how a scope's window is built from its slices. Imports: errors,
watch.{stats, reference}.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..errors import InputError
from .reference import Reference
from .stats import Slice, break_even_formula, compare, window_stats

POOLED = "pooled"
SE_NOTE = ("SE: each slice of each replica (the counters between two /metrics readings) is a cluster of drafts, the "
           "ratio estimator's SE across slices, never below the SE of the drafts as independent trials (se_basis); "
           "/metrics has no per-request counters")
RULES = {"below_reference": "below the validated AL", "below_min_al": "below --min-al",
         "below_break_even": "below the break-even AL"}


class WatchOptions(BaseModel):
    """Everything :func:`watch` needs, checked once (:meth:`parse` turns a bad value into InputError)."""

    model_config = ConfigDict(extra="forbid")

    servers: list[str] = Field(..., min_length=1, description="the replicas' URLs (…/v1 or the server root)")
    window: float = Field(60.0, gt=0, description="seconds per window")
    scrape_every: float | None = Field(None, gt=0, description="seconds per slice (default: window / 6)")
    duration: float | None = Field(None, gt=0, description="end after this many seconds (default: until Ctrl-C)")
    reference: Path | None = Field(None, description="report.json, validate's --report folder, a repo folder or card")
    reference_suite: str | None = None
    min_al: float | None = Field(None, ge=1.0, description="absolute floor")
    baseline_server: str | None = Field(None, description="the target without speculation: the measured break-even")
    draft_cost: float = Field(0.1, ge=0.0, description="c = one draft forward / one target decode forward "
                              "(break-even 1 + k c without --baseline-server)")
    sigma: float = Field(3.0, gt=0, description="an alert needs the AL below its threshold by more than sigma SE")
    tolerance: float = Field(0.05, ge=0.0, lt=1.0, description="drops within this share of the reference AL are "
                             "not alerted")
    alert_windows: int = Field(2, ge=1, description="consecutive windows with drafts a rule must hold in")
    exit_on_alert: bool = False
    api_key: str | None = Field(None, repr=False, exclude=True, description="sent as a Bearer token, never shown")
    responses: Path | None = Field(None, description="a JSONL file the deployment appends its responses to "
                                   "(metrics.speculative_decoding): the per-request histogram of each window")

    @model_validator(mode="after")
    def _check(self) -> WatchOptions:
        if len(set(self.servers)) != len(self.servers):
            raise ValueError("a --server is given twice")
        if self.scrape_every is not None and self.scrape_every > self.window:
            raise ValueError(f"--scrape-every {self.scrape_every:g} is longer than --window {self.window:g}")
        if self.reference_suite is not None and self.reference is None:
            raise ValueError("--reference-suite needs --reference")
        return self

    @classmethod
    def parse(cls, **kw: Any) -> WatchOptions:
        try:
            return cls(**kw)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(x) for x in err["loc"])
            msg = str(err["msg"]).removeprefix("Value error, ")
            raise InputError(f"watch: {where + ': ' if where else ''}{msg}", "see eagle-migrate watch --help") from None

    @property
    def slice_seconds(self) -> float:
        return self.scrape_every if self.scrape_every is not None else self.window / 6.0


class Comparison(BaseModel):
    reference_al: float
    reference_se: float | None
    diff: float = Field(..., description="window AL - reference AL (negative: below)")
    se: float = Field(..., description="the window's SE and the reference's together")
    z: float | None
    per_position: list[dict[str, Any]] | None = Field(None, description="position, rate, reference, diff, z")


class ScopeWindow(BaseModel):
    """One replica (``scope`` = its URL) or all replicas (``pooled``) in one window, or over the whole watch."""

    scope: str
    status: Literal["ok", "no drafts", "unreachable"]
    drafts: int
    draft_tokens: int
    accepted: int
    accepted_per_position: list[int]
    requests: int = Field(..., description="requests finished (vllm:request_success)")
    generation_tokens: int
    prompt_tokens: int
    al: float | None = Field(None, description="1 + accepted / drafts; null without drafts (never 1.0)")
    al_se: float | None = None
    se_basis: str | None = Field(None, description="slices | drafts (watch/stats.py)")
    al_se_slices: float | None = None
    al_se_drafts: float | None = None
    slices: int = Field(0, description="slices with drafts")
    per_position: list[float] = Field(default_factory=list)
    per_position_se: list[float] = Field(default_factory=list)
    vs_reference: Comparison | None = None
    restart: str | None = Field(None, description="a restart seen in this window: what gave it away")
    note: str | None = None

    def al_text(self) -> str:
        if self.al is None:
            return "no drafts" if self.status != "unreachable" else "unreachable"
        return f"{self.al:.3f} ± {self.al_se:.3f}" if self.al_se is not None else f"{self.al:.3f}"


class BreakEven(BaseModel):
    al: float
    source: Literal["baseline-server", "formula"]
    formula: str
    itl_ms_speculative: float | None = None
    itl_ms_baseline: float | None = None
    note: str | None = None


class Alert(BaseModel):
    scope: str
    rule: str = Field(..., description="below_reference | below_min_al | below_break_even")
    windows: int = Field(..., description="consecutive windows the rule has held in")
    fired: bool = Field(..., description="this window is the one it fired in")
    al: float
    se: float
    threshold: float
    message: str


class PerRequestWindow(BaseModel):
    """A window's requests as their responses report them (``--responses``; watch/responses.py)."""

    requests: int
    no_drafts: int = 0
    skipped_lines: int = Field(0, description="new lines without per-request metrics")
    floor: float | None = None
    below_floor: int | None = Field(None, description="requests whose AL is under --min-al")
    al_histogram: dict[str, int] = Field(default_factory=dict, description="requests per AL bucket of 0.5")
    acceptance_histogram: list[int] = Field(default_factory=list, description="drafts accepting exactly j tokens")


class WindowResult(BaseModel):
    type: Literal["window"] = "window"
    index: int
    t_start: float = Field(..., description="unix time of the reading the window's counts start from (the last one "
                                            "before it)")
    t_end: float = Field(..., description="unix time of the window's last reading: its counts lie between the two")
    seconds: float
    partial: bool = Field(False, description="cut short (Ctrl-C)")
    replicas: list[ScopeWindow]
    pooled: ScopeWindow
    break_even: BreakEven
    alerts: list[Alert] = Field(default_factory=list, description="rules holding for at least alert_windows windows")
    per_request: PerRequestWindow | None = Field(None, description="with --responses: the window's requests")


class WatchResult(BaseModel):
    type: Literal["summary"] = "summary"
    servers: list[str]
    k: int
    windows: int
    seconds: float
    ended_by: Literal["duration", "alert", "interrupt"]
    replicas: list[ScopeWindow] = Field(..., description="each replica over the whole watch")
    pooled: ScopeWindow
    reference: Reference | None = None
    break_even: BreakEven | None = None
    restarts: list[dict[str, Any]] = Field(default_factory=list, description="{scope, window, reason}")
    alerts: list[Alert] = Field(default_factory=list, description="every alert that fired")
    se_note: str = SE_NOTE
    options: dict[str, Any] = Field(default_factory=dict)

    @property
    def alerted(self) -> bool:
        return bool(self.alerts)


class WatchStart(BaseModel):
    servers: list[str]
    k: int
    window: float
    slice_seconds: float
    reference: Reference | None
    break_even: BreakEven


def scope_window(name: str, parts: list[Slice], k: int, reached: bool, ref: Reference | None,
                 restart: str | None = None) -> ScopeWindow:
    """One scope's counters and statistics over ``parts`` (its slices), compared with the reference."""
    w = window_stats(parts, k)
    s = w.stats
    status = "unreachable" if not reached else ("ok" if w.al is not None else "no drafts")
    cmp = None
    if ref is not None and w.al is not None:
        c = compare(w, ref.al, ref.al_se, ref.per_position, ref.per_position_se)
        cmp = Comparison(**c) if c else None
    return ScopeWindow(
        scope=name, status=status, drafts=s.num_drafts, draft_tokens=s.num_draft_tokens, accepted=s.num_accepted_tokens,
        accepted_per_position=list(s.accepted_per_position), requests=s.num_prompts,
        generation_tokens=s.num_output_tokens, prompt_tokens=w.prompt_tokens, al=w.al, al_se=w.al_se,
        se_basis=w.se_basis, al_se_slices=w.al_se_slices, al_se_drafts=w.al_se_drafts, slices=w.slices,
        per_position=w.per_position, per_position_se=w.per_position_se, vs_reference=cmp, restart=restart)


def break_even_of(k: int, draft_cost: float, measured: float | None, itl: tuple[float, float, float, float] | None,
                  note: str | None) -> BreakEven:
    """The break-even AL as measured (ITL sums and counts: speculative, baseline), else the formula 1 + k c."""
    formula = f"1 + k * c = 1 + {k} * {draft_cost:g}"
    if measured is not None and itl is not None:
        s_sum, s_n, b_sum, b_n = itl
        return BreakEven(al=measured, source="baseline-server", formula="ITL(speculative) / ITL(baseline)",
                         itl_ms_speculative=1000 * s_sum / s_n, itl_ms_baseline=1000 * b_sum / b_n, note=note)
    return BreakEven(al=break_even_formula(k, draft_cost), source="formula", formula=formula, note=note)
