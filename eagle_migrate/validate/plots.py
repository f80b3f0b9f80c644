"""The validation report's PNG plots, one builder per plot (a matplotlib Figure, or None when there is nothing worth
drawing) so that tests read back what is drawn; :func:`write_plots` saves them (``report.write_report`` calls it).
Typed on :class:`~.report.ValidationReport` by duck typing only: report imports this module, not the other way round.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# ----- plots ---------------------------------------------------------------------------------------------------------
# Every plot is built by its own function (a matplotlib Figure, or None when there is nothing worth drawing) so tests
# can read back what is drawn; write_plots saves them. Three rules (issue 28):
# * no axis is zoomed onto float noise: a y-range is never narrower than its floor (:func:`_floor_ylim`);
# * curves that coincide stay distinguishable: each suite has its own marker, new and baseline their own line style,
#   and each series is shifted sideways by a small offset (:func:`_series_style`);
# * a plot over one point is not drawn: the report says it in one line instead (``report.single_bucket_line``).
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
OFFSET = 0.06  # x shift between series, in units of the x axis (draft position / speculation step)
RMS_FLOOR = 0.10  # an RMS axis spans at least 10 % of the largest RMS shown
MASS_FLOOR = 0.02  # an attention-mass axis spans at least 0..0.02


def _floor_ylim(ax: Any, vals: list[float], floor: float, lo: float | None = None) -> None:
    """Y limits around ``vals`` at least ``floor`` wide (centred on the data); ``lo`` pins the bottom."""
    vals = [v for v in vals if v == v]  # no NaN
    if not vals:
        return
    a, b = min(vals), max(vals)
    if lo is not None:  # pinned bottom (a rate, a mass, an AL): lo .. at least lo + floor
        a = min(a, lo)
        span = max(b - a, floor)
        ax.set_ylim(a - span * 0.03, a + span * 1.08)  # a point on the floor is drawn above the frame
    else:
        span = max(b - a, floor)
        mid = (a + b) / 2
        ax.set_ylim(mid - span * 0.54, mid + span * 0.54)
    ax.ticklabel_format(axis="y", useOffset=False, style="plain")


def _series_style(i_suite: int, baseline: bool, n_series: int, j_series: int) -> dict[str, Any]:
    """Colour and marker per suite, solid line for the new drafter and dashed for the baseline, and an x offset so
    series with equal values do not hide each other."""
    return {"color": f"C{i_suite % 10}", "marker": MARKERS[i_suite % len(MARKERS)], "ls": "--" if baseline else "-",
            "alpha": 0.7 if baseline else 1.0, "mfc": "none" if baseline else None,
            "offset": (j_series - (n_series - 1) / 2) * OFFSET}


def _plot_series(ax: Any, xs: list[float], ys: list[float], style: dict[str, Any], label: str) -> None:
    st = dict(style)
    off = st.pop("offset")
    if st.get("mfc") is None:
        st.pop("mfc")
    ax.plot([x + off for x in xs], ys, label=label, **st)


def plot_acceptance(r: Any) -> Any:
    import matplotlib.pyplot as plt  # lazy: matplotlib (0.5 s), only when plots are drawn

    has_base = any(s.baseline for s in r.suites)
    names = [s.name for s in r.suites]
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(names), 3.6))
    w = 0.38 if has_base else 0.6
    xs = range(len(names))
    se = any(m is not None and m.acceptance_length_se is not None for s in r.suites for m in (s.new, s.baseline))

    def err(ms: list[Any]) -> list[float] | None:  # +-1 SE whiskers where the engine gave SEs
        return [(m.acceptance_length_se or 0.0) if m is not None else 0.0 for m in ms] if se else None

    ax.bar([x - (w / 2 if has_base else 0) for x in xs], [s.new.acceptance_length for s in r.suites], w, label="new",
           color="#2b7bba", yerr=err([s.new for s in r.suites]), capsize=3)
    if has_base:
        ax.bar([x + w / 2 for x in xs], [s.baseline.acceptance_length if s.baseline else 0 for s in r.suites], w,
               label="baseline", color="#bbbbbb", hatch="//", edgecolor="#666666",
               yerr=err([s.baseline for s in r.suites]), capsize=3)
    k = r.settings.get("num_speculative_tokens")
    if k:
        ax.axhline(k + 1, color="#999999", lw=0.8, ls=":")
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("acceptance length" + (" (±1 SE)" if se else ""))
    top = max([k + 1 if k else 0] + [s.new.acceptance_length for s in r.suites]
              + [s.baseline.acceptance_length for s in r.suites if s.baseline])
    ax.set_ylim(1.0, max(top, 2.0) * 1.25)  # AL >= 1; room for the legend above the bars
    ax.set_title(f"Acceptance length per suite (k={k}, {r.engine})")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return fig


def plot_per_position(r: Any) -> Any:
    import matplotlib.pyplot as plt  # lazy: matplotlib (0.5 s), only when plots are drawn

    fig, ax = plt.subplots(figsize=(5.6, 3.6))
    n_series = sum(1 + bool(s.baseline) for s in r.suites)
    j = 0
    for i, s in enumerate(r.suites):
        pos = list(range(1, len(s.new.per_position_rate) + 1))
        _plot_series(ax, pos, s.new.per_position_rate, _series_style(i, False, n_series, j), f"{s.name} new")
        j += 1
        if s.baseline:
            _plot_series(ax, pos, s.baseline.per_position_rate, _series_style(i, True, n_series, j), f"{s.name} baseline")
            j += 1
    ax.set_xticks(range(1, 1 + max(len(s.new.per_position_rate) for s in r.suites)))
    ax.set_xlabel("draft position (series shifted apart)")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(-0.03, 1.05)  # a rate: the whole 0..1 range, never zoomed
    ax.set_title("Per-position acceptance")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def plot_al_vs_context(r: Any) -> Any:
    """AL per context bucket of the long suite; None with fewer than two buckets (``report.single_bucket_line`` says it)."""
    import matplotlib.pyplot as plt  # lazy: matplotlib (0.5 s), only when plots are drawn

    long = next((s for s in r.suites if s.name == "long" and s.groups), None)
    if long is None or len(long.groups) < 2:
        return None
    fig, ax = plt.subplots(figsize=(5.6, 3.6))
    gs = sorted(long.groups, key=lambda g: g.mean_prompt_tokens)
    x = [g.mean_prompt_tokens for g in gs]
    ys = [g.new.acceptance_length for g in gs]
    ax.plot(x, ys, "-o", label="new", color="#2b7bba")
    if any(g.baseline for g in gs):
        yb = [g.baseline.acceptance_length if g.baseline else float("nan") for g in gs]
        ax.plot(x, yb, "--s", mfc="none", label="baseline", color="#888888")
        ys = ys + yb
    k = r.settings.get("num_speculative_tokens")
    if k:
        ax.axhline(k + 1, color="#999999", lw=0.8, ls=":")
    _floor_ylim(ax, ys + ([k + 1] if k else []), floor=1.0, lo=1.0)  # AL >= 1, and at least one token of range
    ax.set_xscale("log", base=2)
    ax.set_xticks(x, [g.name for g in gs])
    ax.minorticks_off()
    ax.set_xlabel("prompt length (bucket)")
    ax.set_ylabel("acceptance length")
    ax.set_title("Acceptance length vs context length")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_drift(r: Any) -> Any:
    import matplotlib.pyplot as plt  # lazy: matplotlib (0.5 s), only when plots are drawn

    d = r.diagnostics
    if d is None or not d.new:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    panels = (("fed_rms", "fed-back hidden RMS"), ("sink_mass", f"attention on first {d.sink_tokens} tokens"),
              ("draft_mass", "attention on own draft tokens"))
    n_series = sum(1 + (suite in d.baseline) for suite in d.new)
    for ax, (field, title) in zip(axes, panels):
        j = 0
        for i, (suite, dn) in enumerate(d.new.items()):
            _plot_series(ax, [st.step for st in dn.steps], [getattr(st, field) for st in dn.steps],
                         _series_style(i, False, n_series, j), f"{suite} new")
            j += 1
            db = d.baseline.get(suite)
            if db:
                _plot_series(ax, [st.step for st in db.steps], [getattr(st, field) for st in db.steps],
                             _series_style(i, True, n_series, j), f"{suite} baseline")
                j += 1
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("speculation step")
        ax.set_xticks([st.step for st in next(iter(d.new.values())).steps])
        vals = [getattr(st, field) for dd in (*d.new.values(), *d.baseline.values()) for st in dd.steps]
        if field == "fed_rms" and vals and min(vals) > 0 and max(vals) / min(vals) > 20:
            ax.set_yscale("log")
        elif field == "fed_rms":
            _floor_ylim(ax, vals, floor=RMS_FLOOR * max([abs(v) for v in vals] + [1e-12]))
        else:
            _floor_ylim(ax, vals, floor=MASS_FLOOR, lo=0.0)
    axes[0].legend(fontsize=7)
    fig.suptitle("Drift diagnostics (new vs baseline; series shifted apart)", fontsize=11)
    fig.tight_layout()
    return fig


def plot_speedup(r: Any) -> Any:
    """speedup.png: the serving speed-up per concurrency with its min-max over rounds (--baseline-server); the axis
    always shows 1.0 (no speed-up) and spans at least 0.2."""
    import matplotlib.pyplot as plt  # lazy: matplotlib (0.5 s), only when plots are drawn

    if r.serving_speed is None or not r.serving_speed.levels:
        return None
    lv = r.serving_speed.levels
    fig, ax = plt.subplots(figsize=(5.6, 3.6))
    xs_c = [x.concurrency for x in lv]
    ax.errorbar(xs_c, [x.speedup for x in lv], yerr=[[x.speedup - x.speedup_min for x in lv],
                                                     [x.speedup_max - x.speedup for x in lv]],
                fmt="-o", color="#2b7bba", capsize=3)
    ax.axhline(1.0, color="#999999", lw=0.8, ls=":")
    _floor_ylim(ax, [1.0] + [x.speedup_min for x in lv] + [x.speedup_max for x in lv], floor=0.2)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs_c, [str(c) for c in xs_c])
    ax.minorticks_off()
    ax.set_xlabel("concurrent users")
    ax.set_ylabel("per-user output tokens/s ratio")
    ax.set_title("Speed-up over the baseline server (min-max over rounds)")
    fig.tight_layout()
    return fig


def write_plots(r: Any, out: Path) -> list[str]:
    import matplotlib  # lazy: matplotlib (0.5 s), only when plots are drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib (0.5 s), only when plots are drawn

    files = []
    for name, build in (("acceptance_length.png", plot_acceptance), ("per_position.png", plot_per_position),
                        ("al_vs_context.png", plot_al_vs_context), ("drift.png", plot_drift),
                        ("speedup.png", plot_speedup)):
        fig = build(r)
        if fig is None:
            continue
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        files.append(name)
    return files
