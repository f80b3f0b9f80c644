"""Acceptance metrics shared by the engines (vLLM's conventions, vllm/v1/spec_decode/metrics.py), and their
standard errors.

Standard errors. The independent unit is the request, not the draft: drafts within one request share its text and
are correlated, so a binomial SE over drafts would be too small. Each request i contributes its drafts D_i and
accepted tokens A_i (vLLM's per-request spec-decode histogram; the reference engine counts per prompt), and
AL - 1 = sum(A) / sum(D) is a ratio estimator whose linearised (delta-method, cluster-robust) variance is
n / (n - 1) * sum((A_i - r D_i)^2) / sum(D)^2 with r = sum(A) / sum(D) (:func:`ratio_se`); per-position rates
likewise (:func:`cell_stats`). The ratio of two drafters is paired (the same requests; under greedy decoding the
target writes the same text for both): with T_i = D_i + A_i, log(ratio) = log sum(T') - log sum(D') - log sum(T)
+ log sum(D), whose per-request influence z_i = T'_i / sum(T') - D'_i / sum(D') - T_i / sum(T) + D_i / sum(D) gives
var(log ratio) = n / (n - 1) * sum(z_i^2) and SE(ratio) = ratio * sqrt(var) (:func:`paired_ratio`). The pairing
removes the between-prompt variance that two independent SEs would carry. :func:`verdict` calls a ratio improved /
worse only beyond 2 SE of 1.0. :func:`per_request_counts` reads an engine's per-request counters (checked against its
totals) and :func:`paired_comparison` turns two of them into a :class:`PairedComparison` (ratio, SE, verdict, or
why there is none): validate's report, quantize's gate and publish's card share them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field


class AcceptanceStats(BaseModel):
    """Spec-decode counters over one set of prompts and the metrics derived from them."""

    num_drafts: int = Field(0, description="request-steps that carried a draft")
    num_draft_tokens: int = Field(0, description="draft tokens proposed")
    num_accepted_tokens: int = Field(0, description="draft tokens accepted")
    accepted_per_position: list[int] = Field(default_factory=list, description="accepted count at draft position i")
    num_prompts: int = 0
    num_output_tokens: int = 0

    @property
    def acceptance_length(self) -> float:
        """AL = 1 + accepted / drafts (the bonus token included); 1.0 when nothing was drafted."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def draft_acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def per_position_rate(self) -> list[float]:
        return [a / self.num_drafts if self.num_drafts else 0.0 for a in self.accepted_per_position]

    def minus(self, other: AcceptanceStats) -> AcceptanceStats:
        """Difference of cumulative counters (vLLM counters only grow within one engine)."""
        n = max(len(self.accepted_per_position), len(other.accepted_per_position))
        a = self.accepted_per_position + [0] * (n - len(self.accepted_per_position))
        b = other.accepted_per_position + [0] * (n - len(other.accepted_per_position))
        return AcceptanceStats(
            num_drafts=self.num_drafts - other.num_drafts,
            num_draft_tokens=self.num_draft_tokens - other.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens - other.num_accepted_tokens,
            accepted_per_position=[x - y for x, y in zip(a, b)],
        )

    def plus(self, other: AcceptanceStats) -> AcceptanceStats:
        """The counters of two sets of prompts together (per-position counts padded to the longer list)."""
        n = max(len(self.accepted_per_position), len(other.accepted_per_position))
        a = self.accepted_per_position + [0] * (n - len(self.accepted_per_position))
        b = other.accepted_per_position + [0] * (n - len(other.accepted_per_position))
        return AcceptanceStats(
            num_drafts=self.num_drafts + other.num_drafts,
            num_draft_tokens=self.num_draft_tokens + other.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens + other.num_accepted_tokens,
            accepted_per_position=[x + y for x, y in zip(a, b)],
            num_prompts=self.num_prompts + other.num_prompts,
            num_output_tokens=self.num_output_tokens + other.num_output_tokens,
        )

    @classmethod
    def total(cls, stats: Iterable[AcceptanceStats]) -> AcceptanceStats:
        """The sum of :meth:`plus` over ``stats`` (all-zero counters for none)."""
        out = cls()
        for s in stats:
            out = out.plus(s)
        return out

    def summary(self) -> dict:
        return {
            "acceptance_length": round(self.acceptance_length, 4),
            "draft_acceptance_rate": round(self.draft_acceptance_rate, 4),
            "per_position_rate": [round(x, 4) for x in self.per_position_rate],
            **self.model_dump(),
        }


def ratio_se(num: list[float], den: list[float]) -> float | None:
    """Standard error of sum(num) / sum(den) with each (num_i, den_i) pair a cluster (the delta method: residuals
    num_i - r * den_i). None with fewer than two clusters or nothing in the denominator."""
    n, total = len(num), float(sum(den))
    if n < 2 or total <= 0:
        return None
    r = sum(num) / total
    ss = sum((a - r * d) ** 2 for a, d in zip(num, den))
    return math.sqrt(n / (n - 1) * ss) / total


@dataclass
class RequestCounts:
    """One request's spec-decode counters (the unit of every standard error here)."""

    drafts: int
    accepted: int
    per_position: list[int] = field(default_factory=list)

    @classmethod
    def from_counts(cls, d: dict[str, Any]) -> RequestCounts:
        """From vllm_worker's per-request dict (``num_drafts``, ``num_accepted_tokens``, ``accepted_per_position``)."""
        return cls(int(d["num_drafts"]), int(d["num_accepted_tokens"]),
                   [int(x) for x in d.get("accepted_per_position", [])])

    @classmethod
    def from_stats(cls, s: AcceptanceStats) -> RequestCounts:
        return cls(s.num_drafts, s.num_accepted_tokens, list(s.accepted_per_position))

    def counts(self) -> dict[str, Any]:
        return {"num_drafts": self.drafts, "num_accepted_tokens": self.accepted, "accepted_per_position": self.per_position}


def cell_stats(reqs: list[RequestCounts], k: int) -> dict[str, Any]:
    """AL and its SE, per-position acceptance rates and their SEs, drafts, accepted and requests of one prompt set
    (module docstring; an SE is None below two requests)."""
    d = [float(r.drafts) for r in reqs]
    drafts = int(sum(d))
    accepted = sum(r.accepted for r in reqs)
    pos = [[float(r.per_position[i]) if i < len(r.per_position) else 0.0 for r in reqs] for i in range(k)]
    return {
        "requests": len(reqs), "drafts": drafts, "accepted": accepted,
        "al": 1.0 + accepted / drafts if drafts else 1.0,
        "al_se": ratio_se([float(r.accepted) for r in reqs], d),
        "per_position": [sum(p) / drafts if drafts else 0.0 for p in pos],
        "per_position_se": [ratio_se(p, d) for p in pos],
    }


def paired_ratio(ref: list[RequestCounts], new: list[RequestCounts]) -> dict[str, Any]:
    """AL(new) / AL(ref) over the same requests (``ref[i]`` and ``new[i]`` are one prompt), with the paired
    delta-method SE (module docstring): ``{ratio, se, requests}``; ratio None when either drafted nothing, se None
    below two requests. Raises ValueError when the lists differ in length (not the same requests)."""
    if len(ref) != len(new):
        raise ValueError(f"paired ratio needs the same requests ({len(ref)} vs {len(new)})")
    t0 = [float(r.drafts + r.accepted) for r in ref]
    d0 = [float(r.drafts) for r in ref]
    t1 = [float(r.drafts + r.accepted) for r in new]
    d1 = [float(r.drafts) for r in new]
    s = [sum(x) for x in (t0, d0, t1, d1)]
    n = len(ref)
    if n == 0 or min(s) <= 0:
        return {"ratio": None, "se": None, "requests": n}
    ratio = (s[2] / s[3]) / (s[0] / s[1])
    if n < 2:
        return {"ratio": ratio, "se": None, "requests": n}
    z = [a / s[2] - b / s[3] - c / s[0] + e / s[1] for a, b, c, e in zip(t1, d1, t0, d0)]
    return {"ratio": ratio, "se": ratio * math.sqrt(n / (n - 1) * sum(x * x for x in z)), "requests": n}


def verdict(ratio: float | None, se: float | None) -> str | None:
    """``improved`` / ``worse`` when the ratio lies beyond 2 SE of 1.0, else ``within noise``; None without a ratio
    or an SE (fewer than two requests): no claim without its noise."""
    if ratio is None or se is None:
        return None
    if ratio - 2.0 * se > 1.0:
        return "improved"
    if ratio + 2.0 * se < 1.0:
        return "worse"
    return "within noise"


class PairedComparison(BaseModel):
    """AL(new) / AL(baseline) on the same requests (paired by prompt), its standard error and what it means."""

    ratio: float | None = Field(None, description="AL(new) / AL(baseline); > 1 = the new drafter accepts more")
    se: float | None = Field(None, description="paired delta-method standard error of the ratio, the request as "
                             "the unit (engines/metrics.py)")
    requests: int = Field(..., description="requests paired")
    verdict: str | None = Field(None, description="improved | worse (beyond 2 SE of 1.0) | within noise; null "
                                "without an SE")
    note: str | None = Field(None, description="why there is no ratio or no SE (not paired, < 2 requests)")

    def text(self) -> str:
        """``paired ratio 1.004 ± 0.006 (within noise)``, or why there is none."""
        if self.ratio is None:
            return f"paired ratio n/a ({self.note})"
        if self.se is None:
            return f"paired ratio {self.ratio:.3f} (no SE: {self.note})"
        return f"paired ratio {self.ratio:.3f} ± {self.se:.3f} ({self.verdict})"


def per_request_counts(results: dict[str, tuple[AcceptanceStats, dict[str, Any]]] | None,
                       keys: Iterable[str]) -> tuple[list[RequestCounts] | None, str | None]:
    """The per-request counters of the jobs ``keys`` of one drafter's engine results (``{job: (stats, extra)}``), in
    job and prompt order (the pairing order), or None and why not: the engine returned none, missed some requests,
    or their sums disagree with its totals (never an SE from counters that do not add up)."""
    if results is None:
        return None, None
    out: list[RequestCounts] = []
    for x in keys:
        stats, extra = results[x]
        pr = extra.get("per_request")
        if pr is None:
            return None, "the engine returned no per-request counters"
        if len(pr) != stats.num_prompts or any(q is None for q in pr):
            return None, f"{x}: per-request counters for {sum(q is not None for q in pr)} of {stats.num_prompts} requests"
        reqs = [RequestCounts.from_counts(q) for q in pr]
        tot = (sum(q.drafts for q in reqs), sum(q.accepted for q in reqs))
        if tot != (stats.num_drafts, stats.num_accepted_tokens):
            return None, (f"{x}: per-request counters (drafts, accepted) {tot} disagree with the engine's totals "
                          f"{(stats.num_drafts, stats.num_accepted_tokens)}")
        out += reqs
    return out, None


def paired_comparison(new: tuple[list[RequestCounts] | None, str | None],
                      base: tuple[list[RequestCounts] | None, str | None]) -> PairedComparison:
    """AL(new) / AL(baseline) paired on the same requests (prompt index), its SE and the verdict, from two
    :func:`per_request_counts` answers; with a note when it cannot be paired (no per-request counters, or different
    request counts) or has no SE."""
    (nr, nwhy), (br, bwhy) = new, base
    if nr is None or br is None:
        return PairedComparison(requests=0, note=f"not paired: {nwhy or bwhy}")
    if len(nr) != len(br):
        return PairedComparison(requests=0, note=f"not paired: {len(nr)} requests measured for the new drafter, "
                                                  f"{len(br)} for the baseline")
    pr = paired_ratio(br, nr)
    ratio, se = pr["ratio"], pr["se"]
    note = ("nothing drafted" if ratio is None else "fewer than 2 requests" if se is None else None)
    return PairedComparison(ratio=None if ratio is None else round(ratio, 4), se=None if se is None else round(se, 4),
                            requests=pr["requests"], verdict=verdict(ratio, se), note=note)


class Metrics(BaseModel):
    """Acceptance metrics of one drafter on one prompt set (vLLM's conventions)."""

    acceptance_length: float = Field(..., description="1 + accepted / drafts (bonus token included)")
    draft_acceptance_rate: float = Field(..., description="accepted / draft tokens")
    per_position_rate: list[float] = Field(..., description="accepted at draft position i / drafts")
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_position: list[int]
    num_prompts: int
    num_output_tokens: int
    seconds: float | None = Field(None, description="wall time of generation (engine-side)")
    output_tokens_per_second: float | None = None
    acceptance_length_se: float | None = Field(None, description="standard error of the AL (ratio estimator, "
                                               "delta method): each request a cluster (vllm / reference engines), "
                                               "each block of requests (server engine); None below two")
    per_position_rate_se: list[float] | None = Field(None, description="standard error of each per-position rate")
    num_blocks: int | None = Field(None, description="blocks of requests the counters were read around (server)")

    @classmethod
    def from_stats(cls, s: AcceptanceStats, seconds: float | None = None) -> Metrics:
        tps = s.num_output_tokens / seconds if seconds else None
        return cls(acceptance_length=round(s.acceptance_length, 4), draft_acceptance_rate=round(s.draft_acceptance_rate, 4),
                   per_position_rate=[round(x, 4) for x in s.per_position_rate], num_drafts=s.num_drafts,
                   num_draft_tokens=s.num_draft_tokens, num_accepted_tokens=s.num_accepted_tokens,
                   accepted_per_position=list(s.accepted_per_position), num_prompts=s.num_prompts,
                   num_output_tokens=s.num_output_tokens, seconds=None if seconds is None else round(seconds, 3),
                   output_tokens_per_second=None if tps is None else round(tps, 2))


def fmt_value(x: float | None, nd: int = 3, sign: bool = False) -> str:
    """``x`` to ``nd`` decimals ("–" for None); a value that rounds to zero is "0.0", never "-0.0"."""
    if x is None:
        return "–"
    s = f"{x:+.{nd}f}" if sign else f"{x:.{nd}f}"
    return f"{0.0:.{nd}f}" if float(s) == 0 else s


def al_text(m: Metrics | None, nd: int = 3) -> str:
    """``1.519 ± 0.021`` (the AL and its standard error; the AL alone when there is no SE)."""
    return "–" if m is None else value_se(m.acceptance_length, m.acceptance_length_se, nd)


def value_se(x: float | None, se: float | None, nd: int = 3) -> str:
    return fmt_value(x, nd) + (f" ± {se:.{nd}f}" if x is not None and se is not None else "")
