"""How long ``eagle-migrate convert`` with its defaults takes on the tiny toy pair (``eagle_migrate.toy``: a 6-layer
successor target of hidden size 64 and a random 1-layer EAGLE-3 drafter; issue 38: <= 30 s on 2 cores), with
and without vLLM generating the held-out continuations (``--engine auto`` / ``reference``: transformers' generate, as
in an interpreter without vLLM), the CLI in a subprocess as a user runs it.

Every run records what ran beside it (the 1-minute load average before and after) and the CPU time convert and its
children used. It prints one JSON line per run (wall and CPU seconds, the slowest stages from the progress lines, the
calibration status) and a markdown row per engine for docs/benchmarks.md.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/convert_time.py [--engine auto reference] [--repeat 1] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from demo_time import each_run, timed_cli  # noqa: E402  (the demo's benchmark: the same timed runs)

from eagle_migrate import toy  # noqa: E402

LINE = re.compile(r"^convert: (?P<stage>.+?) \S+ \((?P<t>\d+) s")


def stages(stderr: str) -> dict[str, int]:
    """{stage: seconds since the start when it was last reported} from convert's plain progress lines."""
    last: dict[str, int] = {}
    for ln in stderr.splitlines():
        m = LINE.match(ln)
        if m:
            last[m["stage"]] = int(m["t"])
    return last


def run_once(engine: str, work: Path) -> dict:
    pair = work / "toy"
    if not (pair / "target" / "config.json").is_file():
        toy.write_target(pair / "target")
        toy.write_drafter(pair / "drafter", "random")
    out = work / f"out-{engine}-{time.time_ns()}"  # a new folder each run: nothing in the work folder is replaced
    p, t = timed_cli(["convert", str(pair / "drafter"), "--target", str(pair / "target"), "-o", str(out),
                      "--engine", engine, "--json"], "convert")
    doc = json.loads(p.stdout)
    return {"engine": engine, **t, "calibration": doc["calibration"]["status"],
            "source_kind": (doc.get("source_kind") or {}).get("kind"), "last_progress_s": stages(p.stderr)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", nargs="+", default=["auto", "reference"])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="work folder (default: a temporary one, removed)")
    a = ap.parse_args()
    rows = each_run(run_once, a.engine, a.repeat, a.out, "convert-time-")
    print("\n| engine | wall s | CPU s | load before / after | calibration |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['engine']} | {r['wall_s']} | {r['cpu_s']} | {r['load_before']} / {r['load_after']} "
              f"| {r['calibration']} ({r['source_kind']}) |")


if __name__ == "__main__":
    main()
