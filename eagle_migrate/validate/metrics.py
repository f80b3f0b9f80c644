"""Acceptance metrics shared by both engines (vLLM's conventions, vllm/v1/spec_decode/metrics.py)."""

from __future__ import annotations

from collections.abc import Iterable

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
    import math

    n, total = len(num), float(sum(den))
    if n < 2 or total <= 0:
        return None
    r = sum(num) / total
    ss = sum((a - r * d) ** 2 for a, d in zip(num, den))
    return math.sqrt(n / (n - 1) * ss) / total
