"""The arithmetic of ``watch``: counters between two /metrics readings (a restart detected, never read as negative
traffic), a window's AL and per-position rates with their standard errors, the comparison with a reference, the
break-even AL, and the alert rules counted over consecutive windows.

Standard errors. /metrics has only server-wide counters, so the request cannot be the unit here (validate's engines
count per request; docs/validate.md). A window is read as several *slices* (the counters between two consecutive
readings, ``--scrape-every``), and each slice of each replica is a cluster of drafts: the SE is the ratio estimator's
across slices (validate/metrics.ratio_se, as validate --server does across blocks of requests). Requests that run
across a slice boundary make neighbouring slices alike, so with slices shorter than a request this SE is too small.
It is therefore never taken below the SE the window's drafts give as independent trials: the variance of the
accepted tokens per draft, from the per-position counts (a chain: position j accepted implies every earlier one), each
rate smoothed by half a draft, so it is never 0 (an AL of exactly 4.0 in every slice, as the toy pair serves, is not
evidence of no noise). ``se_basis`` says which of the two was used.

Break-even. A verification step costs k draft forwards and one target forward over k + 1 tokens, and yields AL
tokens; without speculation each token costs one target forward. With c = (one draft forward) / (one target decode
forward) and verification costing one decode step (memory-bound decoding), speculation saves time iff
AL > 1 + k * c. Measured instead (``--baseline-server``): vLLM's ``vllm:inter_token_latency_seconds`` is observed
once per request per engine step, so its mean is the step time on the speculative servers and the per-token time on
the baseline; speculation saves iff AL > ITL(speculative) / ITL(baseline).
Imports: engines.metrics, engines.server_client.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..engines.metrics import AcceptanceStats, ratio_se
from ..engines.server_client import Scrape


# ----- one slice: the counters between two readings ----------------------------------------------------------------
@dataclass
class Slice:
    """What one replica served between two readings: spec-decode counters (``num_prompts`` = finished requests,
    ``num_output_tokens`` = generated tokens), prompt tokens and the ITL histogram's sum and count."""

    stats: AcceptanceStats
    prompt_tokens: int = 0
    itl_sum: float = 0.0
    itl_count: float = 0.0


def restart_reason(before: Scrape, after: Scrape) -> str | None:
    """Why ``after`` comes from a new server process, or None: ``process_start_time_seconds`` changed, or a counter
    went backwards (vLLM's counters only grow within one process)."""
    if before.start_time is not None and after.start_time is not None and after.start_time != before.start_time:
        return "its process start time changed"
    pairs = [("vllm:request_success", before.requests, after.requests),
             ("vllm:generation_tokens", before.generation_tokens, after.generation_tokens),
             ("vllm:prompt_tokens", before.prompt_tokens, after.prompt_tokens)]
    if before.spec is not None and after.spec is not None:
        pairs += [("vllm:spec_decode_num_drafts", before.spec.num_drafts, after.spec.num_drafts),
                  ("vllm:spec_decode_num_accepted_tokens", before.spec.num_accepted_tokens, after.spec.num_accepted_tokens)]
    back = [n for n, a, b in pairs if b < a]
    return f"its counters went back ({', '.join(back)})" if back else None


def _as_slice(after: Scrape, before: Scrape | None) -> Slice:
    zero = Scrape(spec=AcceptanceStats(accepted_per_position=[0] * after.num_positions))
    b = before if before is not None else zero
    spec = (after.spec or AcceptanceStats()).minus(b.spec or AcceptanceStats())
    spec.num_prompts = int(round(after.requests - b.requests))
    spec.num_output_tokens = int(round(after.generation_tokens - b.generation_tokens))
    return Slice(spec, int(round(after.prompt_tokens - b.prompt_tokens)), after.itl_sum - b.itl_sum,
                 after.itl_count - b.itl_count)


def difference(before: Scrape, after: Scrape) -> tuple[Slice, str | None]:
    """The slice between two readings of one replica, and the restart seen between them (None: none). After a
    restart the new process counted from zero, so the slice is its counters as they stand: what it served since it
    started (what the old process served after the earlier reading is lost, and said so)."""
    why = restart_reason(before, after)
    return _as_slice(after, None if why else before), why


# ----- a window's AL and rates, with standard errors -------------------------------------------------------------------
def drafts_se(stats: AcceptanceStats) -> tuple[float | None, list[float]]:
    """SE of the AL and of each per-position rate with the drafts as independent trials (the floor; module
    docstring): rates smoothed by half a draft, the accepted-per-draft variance from the chain of positions."""
    d = stats.num_drafts
    if d <= 0:
        return None, []
    q = [(a + 0.5) / (d + 1.0) for a in stats.accepted_per_position]
    mean = sum(q)
    second = sum((2 * m + 1) * x for m, x in enumerate(q))  # E[X^2] = sum_m (2m - 1) P(X >= m), m from 1
    var = max(second - mean * mean, min((x * (1 - x) for x in q), default=0.0))
    return math.sqrt(var / d), [math.sqrt(x * (1 - x) / d) for x in q]


@dataclass
class WindowStats:
    """AL, per-position rates and their SEs of a set of slices (one replica's window, or all replicas pooled)."""

    stats: AcceptanceStats
    prompt_tokens: int
    slices: int  # slices with drafts
    al: float | None
    al_se: float | None
    al_se_slices: float | None
    al_se_drafts: float | None
    se_basis: str | None
    per_position: list[float] = field(default_factory=list)
    per_position_se: list[float] = field(default_factory=list)


def window_stats(slices: list[Slice], k: int) -> WindowStats:
    """The counters of ``slices`` summed, the AL (None without drafts: an idle window is "no drafts", not AL 1.0)
    and the SEs: across slices (each a cluster), never below the drafts' own (module docstring)."""
    total = AcceptanceStats.total(s.stats for s in slices)
    total.accepted_per_position = (total.accepted_per_position + [0] * k)[:max(k, len(total.accepted_per_position))]
    prompt = sum(s.prompt_tokens for s in slices)
    busy = [s.stats for s in slices if s.stats.num_drafts > 0]
    if total.num_drafts <= 0:
        return WindowStats(total, prompt, 0, None, None, None, None, None)
    d = [float(s.num_drafts) for s in busy]
    se_sl = ratio_se([float(s.num_accepted_tokens) for s in busy], d)
    pos_sl = [ratio_se([float((s.accepted_per_position + [0] * k)[i]) for s in busy], d) for i in range(k)]
    se_dr, pos_dr = drafts_se(total)
    use_slices = se_sl is not None and se_sl >= (se_dr or 0.0)
    pos_se = [max(a or 0.0, b) for a, b in zip(pos_sl, pos_dr)]
    return WindowStats(total, prompt, len(busy), total.acceptance_length, se_sl if use_slices else se_dr, se_sl,
                       se_dr, "slices" if use_slices else "drafts", total.per_position_rate[:k], pos_se)


# ----- the reference, the break-even AL, the alert rules ---------------------------------------------------------------
def compare(w: WindowStats, ref_al: float, ref_se: float | None, ref_pos: list[float] | None = None,
            ref_pos_se: list[float] | None = None) -> dict[str, Any] | None:
    """The window against the reference: the AL difference (negative = below), its SE (the window's and the
    reference's together), z, and per position where the reference has rates for every position."""
    if w.al is None:
        return None
    se = math.sqrt((w.al_se or 0.0) ** 2 + (ref_se or 0.0) ** 2)
    diff = w.al - ref_al
    out: dict[str, Any] = {"reference_al": ref_al, "reference_se": ref_se, "diff": diff, "se": se,
                           "z": diff / se if se > 0 else None, "per_position": None}
    if ref_pos is not None and len(ref_pos) == len(w.per_position):
        rs = ref_pos_se if ref_pos_se is not None and len(ref_pos_se) == len(ref_pos) else [0.0] * len(ref_pos)
        rows = []
        for i, (r, rse, x, xse) in enumerate(zip(ref_pos, rs, w.per_position, w.per_position_se)):
            s = math.sqrt(xse ** 2 + (rse or 0.0) ** 2)
            rows.append({"position": i, "rate": x, "reference": r, "diff": x - r, "z": (x - r) / s if s > 0 else None})
        out["per_position"] = rows
    return out


def break_even_formula(k: int, draft_cost: float) -> float:
    """1 + k * c (module docstring)."""
    return 1.0 + k * draft_cost


def break_even_measured(spec_sum: float, spec_count: float, base_sum: float, base_count: float) -> float | None:
    """ITL(speculative) / ITL(baseline), the mean step time over the mean token time; None without samples."""
    if spec_count <= 0 or base_count <= 0 or base_sum <= 0:
        return None
    return (spec_sum / spec_count) / (base_sum / base_count)


@dataclass
class AlertState:
    """Consecutive windows (with drafts) in which one rule held for one scope."""

    count: int = 0
    fired: bool = False


class AlertTracker:
    """Counts, per (scope, rule), the consecutive windows with drafts in which the rule held; an alert fires on the
    ``windows``-th. Windows without drafts (idle, unreachable) neither count nor break a run."""

    def __init__(self, windows: int):
        self.windows = max(1, int(windows))
        self.state: dict[tuple[str, str], AlertState] = {}

    def update(self, scope: str, rule: str, held: bool | None) -> tuple[int, bool]:
        """(consecutive windows, fired now) after this window; ``held`` None: not judged (no drafts)."""
        st = self.state.setdefault((scope, rule), AlertState())
        if held is None:
            return st.count, False
        if not held:
            st.count, st.fired = 0, False
            return 0, False
        st.count += 1
        fire = st.count >= self.windows and not st.fired
        st.fired = st.fired or fire
        return st.count, fire
