"""Calibration's results: :class:`CalibrationResult` (JSON via ``model_dump``, Markdown via
:meth:`CalibrationResult.markdown`), the judge's findings (:class:`Judge`, :func:`source_verdict`) and the
``--require-improvement`` check. Imports: errors, judge (Comparison, SimulatedAcceptance, JUDGE_Z)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field

from ..errors import CheckFailed
from ..judge import JUDGE_Z, Comparison, PairedDifference, SimulatedAcceptance


class SuiteAcceptance(BaseModel):
    """Simulated greedy acceptance on one held-out suite."""

    suite: str
    num_sequences: int
    before: SimulatedAcceptance = Field(description="the drafter as it came in (initialised / converted)")
    after: SimulatedAcceptance = Field(description="the drafter handed back (best checkpoint)")
    source: SimulatedAcceptance | None = Field(None, description="the original source drafter, when given")

    @property
    def delta(self) -> float:
        return self.after.acceptance_length - self.before.acceptance_length


class Judge(BaseModel):
    """The held-out judge's findings: every comparison is paired over the same positions (docs/calibration.md)."""

    z: float = JUDGE_Z
    block: int = Field(description="consecutive positions per independent unit of the paired standard error")
    heldout_sequences: int
    heldout_drafts: int = Field(description="drafts of the returned drafter's greedy walk over the held-out suites")
    heldout_positions: int = Field(description="draftable positions every drafter is scored on")
    statistics_tokens: int | None = Field(None, description="tokens of the fc_norm statistics (convert's pass)")
    training_tokens: int | None = Field(None, description="tokens in the training sequences (each step sees a batch "
                                        "of them); None for precomputed features")
    vs_initial: Comparison | None = Field(None, description="returned minus initial (the structural conversion)")
    vs_source: Comparison | None = Field(None, description="returned minus the source drafter")
    initial_vs_source: Comparison | None = Field(None, description="structural conversion minus the source")
    worse_than_source: bool | None = Field(None, description="the returned drafter is below the source beyond noise "
                                           "on some suite (None: no source given)")
    verdict: str = Field("", description="one plain line")


def _below_by(d: PairedDifference, source: SimulatedAcceptance, z: float) -> float:
    """The relative change of AL a suite is below by: every position's where that is below beyond noise, else the
    walk's (AL difference over the source's walked AL)."""
    return d.relative if d.below_everywhere(z) else d.walk_diff / source.acceptance_length


def source_verdict(vs_source: Comparison, after: Mapping[str, SimulatedAcceptance],
                   source: Mapping[str, SimulatedAcceptance], z: float = JUDGE_Z,
                   what: str = "EAGLE-3.1 conversion") -> tuple[bool, str]:
    """(worse than the source beyond noise, one plain line saying how the returned drafter, ``what``, compares)."""
    below = vs_source.below(z)
    if below:
        n, d = min(below.items(), key=lambda kv: _below_by(kv[1], source[kv[0]], z))
        a, b = after[n].acceptance_length, source[n].acceptance_length
        how = (f"paired difference {d.diff:+.3f} +/- {d.se:.3f} over {d.num_positions} positions"
               if d.below_everywhere(z) else f"paired in vLLM's walk {d.walk_diff:+.3f} +/- {d.walk_se:.3f}, though "
               f"{d.diff:+.3f} +/- {d.se:.3f} over every position")
        return True, (f"{what} drafts about {abs(100 * _below_by(d, source[n], z)):.0f} % below the source on {n} "
                      f"(held-out simulated AL {a:.3f} vs {b:.3f}, {how}); keep the "
                      "EAGLE-3 drafter, or calibrate with --data sharegpt (or --data FILE of your traffic) and more "
                      "--steps or --train norms+fc")
    if vs_source.better(z):
        return False, (f"{what} drafts about {100 * vs_source.relative:.1f} % above the source (held-out "
                       f"simulated AL, paired difference {vs_source.diff:+.3f} +/- {vs_source.se:.3f})")
    return False, (f"{what} is within noise of the source (paired difference {vs_source.diff:+.3f} "
                   f"+/- {vs_source.se:.3f} in AL, {100 * vs_source.relative:+.1f} %)")


class CalibrationResult(BaseModel):
    """What a calibration run did and what it achieved (JSON via ``model_dump``; Markdown via :meth:`markdown`)."""

    train: str = Field(description="norms | norms+fc | all")
    trainable: list[str]
    device: str
    settings: dict[str, Any]
    steps_run: int
    best_step: int = Field(description="0 = the initial weights were kept")
    stopped_early: bool
    stop_reason: str | None = Field(None, description="why it stopped early: patience | time limit | no reachable "
                                    "improvement (judge.futility: no candidate can beat the initial weights in the "
                                    "steps left)")
    resumed_from: int | None = None
    improved: bool = Field(description="the held-out score of the returned drafter beats the initial one")
    score_before: float = Field(description="mean simulated AL over the suites, initial drafter")
    score_after: float = Field(description="mean simulated AL over the suites, returned drafter")
    score_source: float | None = None
    suites: dict[str, SuiteAcceptance]
    seconds: float
    tokens_seen: int = Field(description="training positions (step 0) the drafter was trained on")
    train_sequences: int
    history: list[dict[str, Any]] = Field(default_factory=list)
    warning: str | None = None
    judge: Judge | None = Field(None, description="the paired held-out comparisons (None: no held-out suites)")
    data: str | None = Field(None, description="where the training sequences came from")
    data_warning: str | None = Field(None, description="set when the data cannot carry the decision (the built-in set)")
    not_measured: list[str] = Field(default_factory=list, description="what this run could not measure and why "
                                    "(--hidden-states: no target generation)")

    def markdown(self) -> str:
        k = self.settings.get("k", 3)
        j = self.judge
        counts = (f" Held-out: {j.heldout_sequences} sequences, {j.heldout_drafts} drafts, {j.heldout_positions} "
                  f"positions; training set {j.training_tokens} tokens"
                  + (f"; statistics {j.statistics_tokens} tokens" if j.statistics_tokens is not None else "") + "."
                  if j else "")
        lines = [
            f"## Calibration ({self.train}, {self.device})", "",
            f"{self.steps_run} steps (best at {self.best_step}{f', stopped early: {self.stop_reason}' if self.stopped_early else ''}), "
            f"{self.tokens_seen} training tokens, {self.seconds:.0f} s. Simulated greedy AL +/- standard error, k = {k}."
            + counts, "",
            "| suite | drafts | source | before | after | after - before (paired) | after - source (paired) | per-position after |",
            "|---|---|---|---|---|---|---|---|",
        ]

        def al(a: SimulatedAcceptance | None) -> str:
            return "-" if a is None else f"{a.acceptance_length:.3f} +/- {a.acceptance_length_se or 0:.3f}"

        def pd(c: Comparison | None, n: str) -> str:
            d = c.suites.get(n) if c else None
            return "-" if d is None else f"{d.diff:+.3f} +/- {d.se:.3f} ({100 * d.relative:+.1f} %)"

        for s in self.suites.values():
            pp = ", ".join(f"{x:.3f}" for x in s.after.per_position_rate)
            lines.append(f"| {s.suite} | {s.after.num_drafts} | {al(s.source)} | {al(s.before)} | {al(s.after)} | "
                         f"{pd(j.vs_initial if j else None, s.suite)} | {pd(j.vs_source if j else None, s.suite)} | {pp} |")
        if j and j.verdict:
            lines += ["", f"**Verdict:** {j.verdict}"]
        if self.data_warning:
            lines += ["", f"**Data:** {self.data_warning}"]
        if self.warning:
            lines += ["", f"**Warning:** {self.warning}"]
        return "\n".join(lines) + "\n"



def check_improvement(res: CalibrationResult) -> None:
    """``--require-improvement``: CheckFailed (exit 1) when the calibration did not beat the initial drafter
    beyond noise, or the returned drafter is below the source beyond noise."""
    if res.judge is not None and res.judge.worse_than_source:
        raise CheckFailed(res.judge.verdict)
    if not res.improved:
        raise CheckFailed(f"calibration did not improve the drafter: held-out simulated AL {res.score_before:.3f} -> {res.score_after:.3f}",
                          "more or more varied --data, more --steps, or --train norms+fc; the output keeps the initial weights")
