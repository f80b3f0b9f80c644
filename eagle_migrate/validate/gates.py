"""The gates of a validation, the same for every engine: per suite a minimum acceptance length and a maximum
regression against the baseline; each suite marked passed or failed, with its failure lines in full.
Imports: validate.report (the result models)."""

from __future__ import annotations

from .report import Gate, PairedComparison, SuiteResult


def apply_gates(suite_results: list[SuiteResult], min_acceptance_length: float | None,
                max_regression_pct: float | None) -> tuple[list[Gate], list[str]]:
    """The gates per suite (minimum AL, maximum regression against the baseline); marks each suite passed or failed
    and returns (gates, failure lines)."""
    gates: list[Gate] = []
    for res in suite_results:
        if min_acceptance_length is not None:
            ok = res.new.acceptance_length >= min_acceptance_length
            gates.append(Gate(name="min_acceptance_length", threshold=min_acceptance_length, suite=res.name,
                              value=res.new.acceptance_length, passed=ok))
            if not ok:
                se = res.new.acceptance_length_se
                res.failures.append(f"AL {res.new.acceptance_length:.3f} < {min_acceptance_length}"
                                    + (f" (AL's SE {se:.3f})" if se is not None else ""))
        if max_regression_pct is not None:
            ok = res.regression_pct is not None and res.regression_pct <= max_regression_pct
            gates.append(Gate(name="max_regression_pct", threshold=max_regression_pct, suite=res.name,
                              value=res.regression_pct, passed=ok))
            if not ok:
                res.failures.append(f"regression {_pct(res.regression_pct)} > {max_regression_pct}% "
                                    f"(AL {res.new.acceptance_length:.3f} vs baseline "
                                    f"{res.baseline.acceptance_length if res.baseline else float('nan'):.3f}"
                                    + _paired_text(res.paired) + ")")
        res.passed = not res.failures
    return gates, [f"suite {r.name}: {'; '.join(r.failures)}" for r in suite_results if r.failures]


def _paired_text(p: PairedComparison | None) -> str:
    """``; paired ratio 0.987 ± 0.004 (worse)`` for a gate's message, or nothing without a paired SE."""
    return f"; {p.text()}" if p is not None and p.ratio is not None and p.se is not None else ""


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}%"
