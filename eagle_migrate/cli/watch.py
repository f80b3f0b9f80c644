from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ..errors import CheckFailed
from .options import COMMANDS, CommandOptions
from .render import log_plain, print_json_line, stdout

_PANEL_ALERTS = "Alerts"


def _table(title: str, scopes: list[Any], break_even: Any, alerts: list[Any], reference: Any,
           per_request: Any = None) -> Any:
    """The live table: a row per replica and one pooled: AL ± SE, per-position rates, drafts, requests, the
    difference from the reference in SE, status."""
    from rich.table import Table  # lazy: rich.table loads only when a table is printed (--help stays fast)

    cap = f"break-even AL {break_even.al:.3f} ({break_even.formula})" if break_even is not None else ""
    if reference is not None:
        cap += f"; reference: {reference.text()}"
    if per_request is not None:
        from ..watch.responses import window_line  # lazy: the watch package stays out of --help

        cap += "\n" + window_line(per_request)
    if alerts:
        cap += "\n" + "\n".join(f"[red]ALERT[/] {a.message}" for a in alerts)
    t = Table(title=title, caption=cap, caption_justify="left", show_header=True, header_style="bold")
    for c in ("replica", "AL ± SE", "per position", "drafts", "requests", "vs reference", "status"):
        t.add_column(c, justify="left" if c in ("replica", "per position", "status") else "right", no_wrap=True)
    for s in scopes:
        vs = "–"
        if s.vs_reference is not None:
            r = s.vs_reference
            vs = f"{r.diff:+.3f}" + (f" ({r.z:+.1f} SE)" if r.z is not None else "")
        status = s.status + (f"; restarted ({s.restart})" if s.restart else "") + (f"; {s.note}" if s.note else "")
        t.add_row(s.scope, s.al_text(), " ".join(f"{x:.2f}" for x in s.per_position) or "–", str(s.drafts),
                  str(s.requests), vs, status)
    return t


def _window_title(w: Any) -> str:
    import datetime as dt

    when = dt.datetime.fromtimestamp(w.t_end).strftime("%H:%M:%S")
    return f"window {w.index + 1} ({w.seconds:.3g} s, ending {when})" + (" [partial]" if w.partial else "")


def _say_start(s: Any) -> None:
    log_plain(f"watch: {len(s.servers)} replica(s) ({', '.join(s.servers)}), k={s.k}, windows of {s.window:g} s read "
              f"in slices of {s.slice_seconds:g} s; break-even AL {s.break_even.al:.3f} ({s.break_even.formula}"
              + (f", {s.break_even.note}" if s.break_even.note else "") + ")"
              + (f"; reference: {s.reference.text()}" if s.reference is not None else "")
              + "; Ctrl-C ends it with the summary")


@contextmanager
def _sigterm_as_ctrl_c() -> Iterator[None]:
    """SIGTERM (`timeout`, a container stop) ends the watch with its summary, as Ctrl-C does (main thread only)."""
    import signal

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Display:
    """A live rich table on a terminal; elsewhere (or with --json) one JSON line per window, the summary last."""

    def __init__(self, live: bool):
        self.live_mode = live
        self.live: Any = None
        self.started: Any = None

    def start(self, s: Any) -> None:
        self.started = s
        _say_start(s)

    def window(self, w: Any) -> None:
        if not self.live_mode:
            print_json_line(w)
            return
        t = _table(_window_title(w), [*w.replicas, w.pooled], w.break_even, w.alerts,
                   self.started.reference if self.started else None, w.per_request)
        if self.live is None:
            from rich.live import Live  # lazy: rich.live loads only when watching live (--help stays fast)

            self.live = Live(t, console=stdout, auto_refresh=False)
            self.live.start()
        self.live.update(t, refresh=True)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()

    def summary(self, res: Any) -> None:
        if not self.live_mode:
            print_json_line(res)
            return
        stdout.print(_table(f"summary: {res.windows} windows, {res.seconds:.0f} s (ended by {res.ended_by})",
                            [*res.replicas, res.pooled], res.break_even, res.alerts, res.reference))
        for r in res.restarts:
            stdout.print(f"restart: {r['scope']} in window {int(r['window']) + 1} ({r['reason']})", highlight=False)


def options_model():
    """The command's options model (WatchOptions), imported when the command runs."""
    from ..watch.models import WatchOptions  # lazy: the watch package stays out of --help

    return WatchOptions


COMMANDS["watch"] = CommandOptions(options_model, cli_only={
    "json": "how the windows are printed",
    "api_key_env": "the name of the variable the CLI reads the key from (the option is the key, api_key; never stored)"})


def watch(
    servers: Annotated[list[str], typer.Option("--server", metavar="URL", help="A replica's URL (e.g. http://HOST:8000/v1); repeat "
                                              "for each replica of the deployment. Only its /metrics is read.",
                                              show_default=False)],
    window: Annotated[float, typer.Option("--window", min=0.1, help="Seconds per window.")] = 60.0,
    scrape_every: Annotated[Optional[float], typer.Option("--scrape-every", min=0.05, help="Seconds between /metrics "
                                                          "readings (default: window / 6); each slice is a cluster "
                                                          "for the SE.")] = None,
    duration: Annotated[Optional[float], typer.Option("--duration", min=0.1, help="End after this many seconds "
                                                      "(default: until Ctrl-C).")] = None,
    reference: Annotated[Optional[Path], typer.Option("--reference", help="What was validated: validate's report.json "
                                                      "(or its --report folder), or a published repo's folder or "
                                                      "model card.")] = None,
    reference_suite: Annotated[Optional[str], typer.Option("--reference-suite", help="Compare with this suite of the "
                                                           "reference (default: all suites pooled).")] = None,
    min_al: Annotated[Optional[float], typer.Option("--min-al", min=1.0, help="Alert when the AL is below this "
                                                    "floor.", rich_help_panel=_PANEL_ALERTS)] = None,
    baseline_server: Annotated[Optional[str], typer.Option("--baseline-server", help="The same target served "
                                                           "without speculation: the break-even AL is measured, "
                                                           "ITL(speculative) / ITL(baseline), from both /metrics.",
                                                           rich_help_panel=_PANEL_ALERTS)] = None,
    draft_cost: Annotated[float, typer.Option("--draft-cost", min=0.0, help="c = one draft forward / one target "
                                              "decode forward: break-even AL 1 + k c without --baseline-server.",
                                              rich_help_panel=_PANEL_ALERTS)] = 0.1,
    sigma: Annotated[float, typer.Option("--sigma", min=0.1, help="An alert needs the AL below its threshold by "
                                         "more than this many SE.", rich_help_panel=_PANEL_ALERTS)] = 3.0,
    tolerance: Annotated[float, typer.Option("--tolerance", min=0.0, max=0.99, help="Drops within this share of the "
                                             "reference AL are not alerted (live traffic is not the validation "
                                             "suite).", rich_help_panel=_PANEL_ALERTS)] = 0.05,
    alert_windows: Annotated[int, typer.Option("--alert-windows", min=1, help="Consecutive windows (with drafts) a "
                                               "rule must hold in before it alerts.",
                                               rich_help_panel=_PANEL_ALERTS)] = 2,
    exit_on_alert: Annotated[bool, typer.Option("--exit-on-alert", help="End the watch at the first alert, exit 1 "
                                                "(CI, cron).", rich_help_panel=_PANEL_ALERTS)] = False,
    api_key_env: Annotated[Optional[str], typer.Option("--api-key-env", help="Name of the environment variable that "
                                                       "holds the servers' API key (never printed or stored).")] = None,
    responses: Annotated[Optional[Path], typer.Option("--responses", help="A JSONL file your gateway appends the "
                                                      "servers' responses to (vLLM >= 0.32 with "
                                                      "--per-request-spec-decode-metrics summary: "
                                                      "metrics.speculative_decoding): one line per window with the "
                                                      "per-request AL histogram and how many requests fell below "
                                                      "--min-al.")] = None,
    json: Annotated[bool, typer.Option("--json", help="One JSON line per window on stdout, the summary last (logs go "
                                       "to stderr); also without a TTY.")] = False,
) -> None:
    """Acceptance over live traffic, window after window, per replica and pooled, against what was validated.

    Reads only the replicas' /metrics (the counters validate --server reads) and sends no traffic. Every window:
    AL ± SE, acceptance per draft position, drafts and requests, per replica and pooled; with --reference the
    difference from the validated AL in SE; alerts (--min-al, below the reference, below the break-even AL) after
    --alert-windows windows. A live table on a terminal; one JSON line per window (and the summary last) with
    --json or without a TTY. Ctrl-C prints the summary so far.

    Example: eagle-migrate watch --server http://HOST1:8000/v1 --server http://HOST2:8000/v1 --reference
    ./report/report.json --min-al 2.0 --exit-on-alert --duration 3600
    """
    from ..engines.server_client import api_key_from_env  # lazy: the engines package stays out of --help
    from ..watch.loop import WatchOptions, watch as run  # lazy: the watch package (pydantic, httpx) stays out of --help

    opts = WatchOptions.parse(servers=list(servers), window=window, scrape_every=scrape_every, duration=duration,
                              reference=reference, reference_suite=reference_suite, min_al=min_al,
                              baseline_server=baseline_server, draft_cost=draft_cost, sigma=sigma, tolerance=tolerance,
                              alert_windows=alert_windows, exit_on_alert=exit_on_alert,
                              api_key=api_key_from_env(api_key_env), responses=responses)
    display = _Display(live=stdout.is_terminal and not json)
    try:
        with _sigterm_as_ctrl_c():
            res = run(opts, on_start=display.start, on_window=display.window, log=lambda m: log_plain(f"watch: {m}"))
    finally:
        display.close()
    display.summary(res)
    if res.ended_by == "alert":
        fired = [a for a in res.alerts if a.fired] or res.alerts
        raise CheckFailed(f"alert: {fired[-1].message}", "the watch ended at the first alert (--exit-on-alert); its "
                          "windows are above, the reference and thresholds are the options you passed")
