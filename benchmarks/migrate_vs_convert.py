"""Issue 48: ``migrate`` runs the calibration ``convert`` runs with the same options. On one pair and one machine, in
one run: ``convert SRC --target T`` with its defaults, then ``migrate SRC --target T --quantize fp8-dynamic --publish
ORG/NAME --dry-run`` with its defaults; the wall time of each, the migrate convert stage's own seconds (from its
manifest), and the decision each reports (``decision``, ``defaults``), which must be the same.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/migrate_vs_convert.py SRC TARGET [--out DIR] [--json FILE]

SRC / TARGET: on the SmolLM2 pair, ``benchmarks/strong_source_best.py unpack DIR`` and
``python -c "from eagle_migrate.assets import smollm2_target; print(smollm2_target())"``. Each command's wall time
includes loading the target; the 1-minute load average before and after each says what ran beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from demo_time import timed_cli  # noqa: E402  (a CLI run in a subprocess, timed, with the load around it)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source")
    ap.add_argument("target")
    ap.add_argument("--out", type=Path, default=None, help="work folder (default: a temporary one, removed)")
    ap.add_argument("--json", type=Path, default=None, help="also write the result here")
    a = ap.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="migrate-vs-convert-") if a.out is None else None
    work = Path(tmp.name) if tmp is not None else a.out
    work.mkdir(parents=True, exist_ok=True)
    try:
        p, tc = timed_cli(["convert", a.source, "--target", a.target, "-o", str(work / "convert"), "--json"], "convert")
        conv = json.loads(p.stdout)
        p, tm = timed_cli(["migrate", a.source, "--target", a.target, "-o", str(work / "migrate"), "--quantize",
                           "fp8-dynamic", "--publish", "org/name", "--dry-run", "--json"], "migrate")
        man = json.loads((work / "migrate" / "migrate-manifest.json").read_text())
        stage_s = {n: r["seconds"] for n, r in man["stages"].items()}
        mconv = man["stages"]["convert"]["outputs"]
        res = {
            "convert": {**tc, "decision": conv.get("decision"), "defaults": conv.get("defaults"),
                        "calibration": conv["calibration"]["status"]},
            "migrate": {**tm, "stages_s": stage_s, "decision": mconv.get("decision"), "defaults": mconv.get("defaults"),
                        "calibration": mconv.get("calibration")},
            "same_decision": conv.get("decision") == mconv.get("decision") and conv.get("defaults") == mconv.get("defaults"),
            "convert_stage_over_convert": round(stage_s["convert"] / tc["wall_s"], 3),
        }
        print(json.dumps(res, indent=2))
        if a.json is not None:
            a.json.write_text(json.dumps(res, indent=2) + "\n")
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    main()
