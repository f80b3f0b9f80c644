"""``watch``: acceptance of a live deployment, window after window, per replica and pooled, against what was validated.

It reads only the replicas' ``GET /metrics`` (``server_client.parse_metrics``: the counters and names
``validate --server`` reads) and sends no traffic. Each window (``--window`` seconds) is read as slices of
``--scrape-every`` seconds; per replica and pooled over the replicas it gives the drafts, finished requests, AL ± SE and
the per-position rates (``watch.stats``: the SE's unit, restart detection, the break-even AL), compares them with the
reference (``watch.reference``: a report.json or a model card) and applies the alert rules (below the reference, below
``min_al``, below the break-even AL, each by more than ``sigma`` SE, for ``alert_windows`` consecutive windows with
drafts). The options and results are ``watch.models``'.

:func:`watch` takes one :class:`WatchOptions`, reports every window to ``on_window`` and returns the summary
(:class:`WatchResult`), on Ctrl-C too (with the window in progress, marked partial). With ``responses`` (a JSONL
file of the deployment's responses) each window also counts its requests by their own AL (``watch.responses``: one
line per window, how many fell below ``min_al``). The scrape is injectable
(``scrape(url) -> Scrape``), as are the clocks, so all of it runs without a server. Imports: errors,
engines.server_client, watch.{models, reference, responses, stats}.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from ..engines.server_client import Scrape, ServerClient, check_metric_names
from ..errors import EagleMigrateError, InputError, ServerError, redact
from .models import (
    POOLED,
    RULES,
    Alert,
    BreakEven,
    ScopeWindow,
    WatchOptions,
    WatchResult,
    WatchStart,
    WindowResult,
    break_even_of,
    scope_window,
)
from .reference import Reference, read_reference
from .responses import ResponsesTail, per_request_window, window_line
from .stats import AlertTracker, Slice, break_even_measured, difference

BREAK_EVEN_WINDOWS = 10  # the measured break-even AL: ITL sums over this many windows (the last ones)


def watch(opts: WatchOptions, *, scrape: Callable[[str], Scrape] | None = None,
          on_start: Callable[[WatchStart], None] | None = None, on_window: Callable[[WindowResult], None] | None = None,
          log: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep, wall: Callable[[], float] = time.time) -> WatchResult:
    """Watch the replicas ``opts.servers`` until ``opts.duration`` has passed, an alert fires with
    ``opts.exit_on_alert``, or Ctrl-C (module docstring). ``scrape``: one /metrics reading of a URL (default: GET
    it); every window goes to ``on_window``; returns the summary."""
    clients: dict[str, ServerClient] = {}
    if scrape is None:
        for u in [*opts.servers, *([opts.baseline_server] if opts.baseline_server else [])]:
            clients[u] = ServerClient(u, opts.api_key, timeout=max(5.0, opts.slice_seconds * 2))
        scrape = lambda u: clients[u].metrics()  # noqa: E731
    try:
        names = {u: clients[u].url if u in clients else u for u in opts.servers}  # the API URL, credentials out
        w = Watcher(opts, scrape, log or (lambda m: None), clock, sleep, wall, names)
        w.begin()
        if on_start:
            on_start(w.start_info())
        return w.run(on_window or (lambda r: None))
    finally:
        for c in clients.values():
            c.close()


def first_readings(opts: WatchOptions, scrape: Callable[[str], Scrape],
                   names: dict[str, str]) -> tuple[dict[str, Scrape], int, Reference | None, Scrape | None]:
    """Read every replica once (refusing one that cannot be measured, as validate --server does: not vLLM, other
    metric names, no speculation), check they draft the same k, read the reference (same k) and the baseline
    server (no speculation)."""
    first: dict[str, Scrape] = {}
    for u in opts.servers:
        s = scrape(u)
        check_metric_names(s, names[u], None, speculative=True)
        first[u] = s
    ks = {names[u]: s.num_positions for u, s in first.items()}
    if len(set(ks.values())) > 1:
        raise InputError("the replicas draft different numbers of tokens per step: "
                         + ", ".join(f"{u} k={k}" for u, k in ks.items()),
                         "watch replicas of one deployment (the same --speculative-config)")
    k = next(iter(ks.values()))
    ref = read_reference(opts.reference, opts.reference_suite) if opts.reference is not None else None
    if ref is not None and ref.k is not None and ref.k != k:
        raise InputError(f"the reference was measured at k={ref.k}, the deployment drafts k={k}: their ALs do not "
                         "compare", "pass the report of a validation at the served k")
    base = None
    if opts.baseline_server:
        base = scrape(opts.baseline_server)
        check_metric_names(base, opts.baseline_server, None, speculative=False)
        if base.spec is not None:
            raise ServerError(f"the baseline server {opts.baseline_server} has speculative decoding configured",
                              "serve the same target without --speculative-config for --baseline-server")
    return first, k, ref, base


def read_or_none(scrape: Callable[[str], Scrape], url: str) -> tuple[Scrape | None, str | None]:
    """One reading, or None and why (unreachable, an HTTP error): a replica that is down is said, not fatal."""
    try:
        s = scrape(url)
    except EagleMigrateError as e:
        return None, e.message
    if s.spec is None:
        return None, "no vllm:spec_decode_* counters in /metrics (restarted without speculation?)"
    return s, None




@dataclass
class _Window:
    """The window being read: its slices per replica, which replicas answered, restarts and notes."""

    index: int
    t_start: float
    slices: dict[str, list[Slice]]
    reached: dict[str, bool]
    restarts: dict[str, str | None]
    notes: dict[str, str | None]
    base: list[Slice] = field(default_factory=list)
    readings: int = 0


class Watcher:
    """One watch: the first readings, then window after window (:meth:`run`), the alert counts and the totals."""

    def __init__(self, opts: WatchOptions, scrape: Callable[[str], Scrape], say: Callable[[str], None],
                 clock: Callable[[], float], sleep: Callable[[float], None], wall: Callable[[], float],
                 names: dict[str, str]):
        self.o, self.scrape, self.say = opts, scrape, say
        self.clock, self.sleep, self.wall = clock, sleep, wall
        self.names = {u: redact(n) for u, n in names.items()}
        self.tracker = AlertTracker(opts.alert_windows)
        self.windows = 0
        self.alerts: list[Alert] = []
        self.restarts: list[dict[str, object]] = []
        self.all_slices: dict[str, list[Slice]] = {u: [] for u in opts.servers}
        self.ever: dict[str, bool] = {u: False for u in opts.servers}
        self.down: set[str] = set()
        self.itl: deque[tuple[float, ...]] = deque(maxlen=BREAK_EVEN_WINDOWS)  # spec sum, count; base sum, count
        self.current: _Window | None = None
        self.ref: Reference | None = None
        self.tail: ResponsesTail | None = None

    def begin(self) -> None:
        self.prev, self.k, self.ref, self.base_prev = first_readings(self.o, self.scrape, self.names)
        self.tail = ResponsesTail(self.o.responses) if self.o.responses is not None else None
        self.ever = {u: True for u in self.o.servers}
        self.t0 = self.clock()
        self.read_at = self.wall()  # when the counters every next difference starts from were read
        self.break_even = break_even_of(self.k, self.o.draft_cost, None, None,
                                        "until the baseline server has served" if self.o.baseline_server else None)

    def start_info(self) -> WatchStart:
        return WatchStart(servers=[self.names[u] for u in self.o.servers], k=self.k, window=self.o.window,
                          slice_seconds=self.o.slice_seconds, reference=self.ref, break_even=self.break_even)

    def run(self, on_window: Callable[[WindowResult], None]) -> WatchResult:
        ended = "duration"
        try:
            while True:
                res = self._window(self.windows)
                self.windows += 1
                on_window(res)
                if self.o.exit_on_alert and any(a.fired for a in res.alerts):
                    ended = "alert"
                    break
                if self.o.duration is not None and self.clock() - self.t0 >= self.o.duration - 1e-6:
                    break
        except KeyboardInterrupt:
            ended = "interrupt"
            cur, self.current = self.current, None
            if cur is not None and cur.readings > 0:
                self.windows += 1
                try:
                    on_window(self._finish(cur, partial=True))
                except KeyboardInterrupt:
                    pass
        return self._summary(ended)

    # ----- reading ---------------------------------------------------------------------------------------------------
    def _window(self, index: int) -> WindowResult:
        start = self.t0 + index * self.o.window
        end = start + self.o.window
        if self.o.duration is not None:
            end = min(end, self.t0 + self.o.duration)
        us = self.o.servers
        # the window covers the counters from the last reading before it to its own last reading: a window reads on
        # schedule, but on a loaded host a reading can end late, and the times say what the counts cover
        cur = _Window(index, self.read_at, {u: [] for u in us}, {u: False for u in us},
                      {u: None for u in us}, {u: None for u in us})
        self.current = cur
        t = start
        while t < end - 1e-9:  # windows keep to the schedule: a slow reading skips the points it overran
            t = min(max(t + self.o.slice_seconds, self.clock()), end)
            delay = t - self.clock()
            if delay > 0:
                self.sleep(delay)
            self._read_all(cur)
            if self.clock() >= end:
                break
        self.current = None
        return self._finish(cur)

    def _read_all(self, cur: _Window) -> None:
        for u in self.o.servers:
            name = self.names[u]
            s, why = read_or_none(self.scrape, u)
            if s is None:
                cur.notes[u] = cur.notes[u] or why
                if u not in self.down:
                    self.down.add(u)
                    self.say(f"{name}: unreachable ({why})")
                continue
            if u in self.down:
                self.down.discard(u)
                self.say(f"{name}: answering again")
            cur.reached[u] = True
            sl, restart = difference(self.prev[u], s)
            if restart:
                cur.restarts[u] = restart
                self.restarts.append({"scope": name, "window": cur.index, "reason": restart})
                self.say(f"{name}: restarted ({restart}); counting from its new start, what it served between the "
                         "last reading and the restart is lost")
            cur.slices[u].append(sl)
            self.all_slices[u].append(sl)
            self.prev[u] = s
        self.read_at = self.wall()
        if self.o.baseline_server and self.base_prev is not None:
            try:
                b = self.scrape(self.o.baseline_server)
                cur.base.append(difference(self.base_prev, b)[0])
                self.base_prev = b
            except EagleMigrateError:
                pass
        cur.readings += 1

    # ----- a window's result ----------------------------------------------------------------------------------------
    def _finish(self, cur: _Window, partial: bool = False) -> WindowResult:
        reps = []
        for u in self.o.servers:
            w = scope_window(self.names[u], cur.slices[u], self.k, cur.reached[u], self.ref, cur.restarts[u])
            w.note = cur.notes[u]
            reps.append(w)
        pooled = scope_window(POOLED, [x for u in self.o.servers for x in cur.slices[u]], self.k,
                              any(cur.reached.values()), self.ref)
        self.break_even = self._break_even(cur)
        alerts = [] if partial else self._alerts([*reps, pooled])
        t_end = self.read_at if cur.readings else self.wall()
        per = None
        if self.tail is not None:
            per = per_request_window(*self.tail.read(), self.k, self.o.min_al)
            self.say(f"window {cur.index + 1}: {window_line(per)}")
        return WindowResult(index=cur.index, t_start=cur.t_start, t_end=t_end, seconds=round(t_end - cur.t_start, 3),
                            partial=partial, replicas=reps, pooled=pooled, break_even=self.break_even, alerts=alerts,
                            per_request=per)

    def _break_even(self, cur: _Window) -> BreakEven:
        """The formula, or measured over the last BREAK_EVEN_WINDOWS windows' ITL sums (one window is noisy)."""
        if not self.o.baseline_server:
            return self.break_even
        self.itl.append((sum(x.itl_sum for u in self.o.servers for x in cur.slices[u]),
                         sum(x.itl_count for u in self.o.servers for x in cur.slices[u]),
                         sum(x.itl_sum for x in cur.base), sum(x.itl_count for x in cur.base)))
        tot = tuple(sum(w[i] for w in self.itl) for i in range(4))
        m = break_even_measured(*tot)
        if m is None:
            return break_even_of(self.k, self.o.draft_cost, None, None,
                                 "the formula: the speculative and baseline servers have not both served yet")
        return break_even_of(self.k, self.o.draft_cost, m, tot, f"ITL over the last {len(self.itl)} window(s)")

    def _alerts(self, scopes: list[ScopeWindow]) -> list[Alert]:
        out: list[Alert] = []
        be = self.break_even
        for sw in scopes:
            rules: list[tuple[str, float, float | None]] = []  # (rule, threshold, the SE it is judged with)
            if self.ref is not None:
                rules.append(("below_reference", self.ref.al, sw.vs_reference.se if sw.vs_reference else None))
            if self.o.min_al is not None:
                rules.append(("below_min_al", self.o.min_al, sw.al_se))
            rules.append(("below_break_even", be.al, sw.al_se))
            for rule, thr, se in rules:
                held = None
                if sw.al is not None and se is not None:
                    drop = thr - sw.al
                    held = drop > self.o.sigma * se and (rule != "below_reference" or drop > self.o.tolerance * thr)
                count, fired = self.tracker.update(sw.scope, rule, held)
                if held and count >= self.tracker.windows:
                    what = RULES[rule] + (f" ({be.formula})" if rule == "below_break_even" else "")
                    a = Alert(scope=sw.scope, rule=rule, windows=count, fired=fired, al=sw.al, se=se, threshold=thr,
                              message=f"{sw.scope}: AL {sw.al:.3f} ± {se:.3f} {what} {thr:.3f} by {thr - sw.al:.3f} "
                                      f"({(thr - sw.al) / se:.1f} SE) for {count} windows")
                    out.append(a)
                    if fired:
                        self.alerts.append(a)
                        self.say("alert: " + a.message)
        return out

    def _summary(self, ended: str) -> WatchResult:
        reps = [scope_window(self.names[u], self.all_slices[u], self.k, self.ever[u], self.ref)
                for u in self.o.servers]
        pooled = scope_window(POOLED, [x for u in self.o.servers for x in self.all_slices[u]], self.k, True, self.ref)
        return WatchResult(servers=[self.names[u] for u in self.o.servers], k=self.k, windows=self.windows,
                           seconds=round(self.clock() - self.t0, 3), ended_by=ended, replicas=reps, pooled=pooled,
                           reference=self.ref, break_even=self.break_even, restarts=self.restarts, alerts=self.alerts,
                           options=self.o.model_dump(mode="json"))
