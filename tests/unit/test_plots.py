"""The validation report's plots (issue 28.8): no axis zoomed onto float noise, coinciding curves kept apart, no plot
over a single context bucket (a line in report.md instead). Built from synthetic reports; the figures are read back."""

from __future__ import annotations

import itertools

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from eagle_migrate.validate.diagnostics import DriftDiagnostics, StepDiagnostics  # noqa: E402
from eagle_migrate.validate.plots import RMS_FLOOR, plot_al_vs_context, plot_drift, plot_per_position  # noqa: E402
from eagle_migrate.validate.report import (  # noqa: E402
    Diagnostics,
    GroupResult,
    Metrics,
    SuiteResult,
    ValidationReport,
    write_report,
)


def metrics(rates: list[float], drafts: int = 100) -> Metrics:
    acc = [round(r * drafts) for r in rates]
    return Metrics(acceptance_length=1 + sum(acc) / drafts, draft_acceptance_rate=sum(acc) / (len(acc) * drafts),
                   per_position_rate=rates, num_drafts=drafts, num_draft_tokens=len(acc) * drafts,
                   num_accepted_tokens=sum(acc), accepted_per_position=acc, num_prompts=2, num_output_tokens=300)


def drift(fed: list[float], sink: float = 1e-9) -> DriftDiagnostics:
    return DriftDiagnostics(sink_tokens=4, num_sequences=2, num_positions=8,
                            steps=[StepDiagnostics(step=j, count=8, fed_rms=f, out_rms=f, sink_mass=sink, draft_mass=sink,
                                                   match_rate=1.0) for j, f in enumerate(fed)])


def report(buckets: list[tuple[str, float, float, float]], fed_new: list[float], fed_base: list[float]) -> ValidationReport:
    """chat + long (one group per bucket: name, tokens, AL new, AL baseline), identical per-position rates."""
    full = [1.0, 1.0, 1.0]
    long = SuiteResult(name="long", description="", prompt_set={"size": 2}, new=metrics(full), baseline=metrics(full),
                       groups=[GroupResult(name=n, mean_prompt_tokens=t, new=metrics(full), baseline=metrics(full))
                               for n, t, _, _ in buckets])
    for g, (_, _, a_new, a_base) in zip(long.groups, buckets):
        g.new.acceptance_length, g.baseline.acceptance_length = a_new, a_base
    chat = SuiteResult(name="chat", description="", prompt_set={"size": 2}, new=metrics(full), baseline=metrics(full))
    diag = Diagnostics(sink_tokens=4, new={"chat": drift(fed_new), "long": drift(fed_new)},
                       baseline={"chat": drift(fed_base), "long": drift(fed_base)})
    return ValidationReport(tool="t", created="now", checkpoint="/x/new", baseline="/x/base", target="/x/t",
                            engine="reference", engine_version=None, settings={"num_speculative_tokens": 3},
                            suites=[chat, long], diagnostics=diag)


NOISE = [0.9999990, 0.9999994, 0.9999998]  # what drift.png used to draw as a drop (issue 28)


def test_fed_rms_axis_is_never_zoomed_onto_float_noise():
    fig = plot_drift(report([("1k", 1024, 4.0, 4.0)], NOISE, NOISE))
    lo, hi = fig.axes[0].get_ylim()
    assert hi - lo >= RMS_FLOOR * max(NOISE)  # at least 10 % of the RMS: 1e-6 of noise is a flat line
    assert lo < min(NOISE) and hi > max(NOISE)
    assert not fig.axes[0].yaxis.get_major_formatter().get_useOffset()  # no "+9.99999e-1" offset label
    for ax in fig.axes[1:]:  # attention masses of 1e-9: 0 .. >= 0.02, not 0 .. 1e-9
        lo, hi = ax.get_ylim()
        assert -0.001 <= lo <= 0.0 and hi >= 0.02
    plt.close(fig)


def test_a_real_rms_difference_is_still_drawn_to_scale():
    fig = plot_drift(report([("1k", 1024, 4.0, 4.0)], [1.0, 1.0, 1.0], [2.5, 3.0, 3.5]))
    lo, hi = fig.axes[0].get_ylim()
    assert lo <= 1.0 and hi >= 3.5 and hi - lo < 3.5  # the data's own range (plus a margin), not the floor
    plt.close(fig)


def _xy(line) -> tuple[tuple[float, ...], tuple[float, ...]]:
    return tuple(map(float, line.get_xdata())), tuple(map(float, line.get_ydata()))


@pytest.mark.parametrize("which", ["per_position", "drift"])
def test_coinciding_curves_stay_distinguishable(which):
    r = report([("1k", 1024, 4.0, 4.0), ("2k", 2048, 4.0, 4.0)], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0])
    fig = plot_per_position(r) if which == "per_position" else plot_drift(r)
    lines = [ln for ln in fig.axes[0].get_lines() if ln.get_label() and not ln.get_label().startswith("_")]
    assert len(lines) == 4  # chat new/baseline, long new/baseline, all equal values
    for a, b in itertools.combinations(lines, 2):
        assert _xy(a) != _xy(b)  # shifted apart: never drawn on top of each other
        assert (a.get_marker(), a.get_linestyle()) != (b.get_marker(), b.get_linestyle())
    suites = {ln.get_label().split()[0]: ln.get_marker() for ln in lines}
    assert suites["chat"] != suites["long"]  # one marker per suite
    styles = {ln.get_label().split()[1]: ln.get_linestyle() for ln in lines}
    assert styles["new"] != styles["baseline"]
    plt.close(fig)


def test_a_single_bucket_is_a_table_line_not_a_plot(tmp_path):
    r = report([("991", 991, 4.0, 1.2)], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0])
    assert plot_al_vs_context(r) is None
    files = write_report(r, tmp_path / "one")
    assert "al_vs_context.png" not in files and not (tmp_path / "one" / "al_vs_context.png").exists()
    md = (tmp_path / "one" / "report.md").read_text()
    assert "AL vs context length: one bucket only (991, 991 prompt tokens): new 4.000, baseline 1.200" in md


def test_several_buckets_are_plotted_on_an_acceptance_axis(tmp_path):
    r = report([("1k", 1024, 4.0, 2.0), ("2k", 2048, 4.0, 1.0)], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0])
    fig = plot_al_vs_context(r)
    lo, hi = fig.axes[0].get_ylim()
    assert 0.9 <= lo <= 1.0 and hi >= 4.0  # AL's own scale, 1 .. the ceiling
    plt.close(fig)
    flat = report([("1k", 1024, 3.9999999, 4.0), ("2k", 2048, 4.0, 3.9999998)], [1.0] * 3, [1.0] * 3)
    lo, hi = plot_al_vs_context(flat).axes[0].get_ylim()
    assert hi - lo >= 1.0  # 1e-7 of AL is not a drop
    files = write_report(r, tmp_path / "two")
    assert "al_vs_context.png" in files and "one bucket only" not in (tmp_path / "two" / "report.md").read_text()


def test_speedup_axis_shows_no_speedup_and_is_never_zoomed_onto_noise():
    from eagle_migrate.validate.plots import plot_speedup
    from eagle_migrate.validate.report import ServingSpeed, SpeedLevel

    r = report([("1k", 1024, 4.0, 4.0)], [1.0] * 3, [1.0] * 3)
    lv = [SpeedLevel(concurrency=c, rounds=2, speculative=[], baseline=[], ratios=[1.3, 1.3000001], speedup=1.3000001,
                     speedup_min=1.3, speedup_max=1.3000002) for c in (1, 4)]
    r.serving_speed = ServingSpeed(baseline_url="http://b", max_tokens=8, levels=lv)
    fig = plot_speedup(r)
    lo, hi = fig.axes[0].get_ylim()
    assert lo < 1.0 < 1.3 < hi and hi - lo >= 0.3  # 1.0 (no speed-up) in view, 2e-7 of noise is flat
    plt.close(fig)
