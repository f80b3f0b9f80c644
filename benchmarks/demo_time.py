"""How long ``eagle-migrate demo`` takes, end to end, as a new user runs it (a fresh folder, the CLI in a subprocess).

Issue 28 asked for the demo to stay under 60 s on an idle 2-core box with vLLM (41 s before the drift pair). The
machine is rarely idle where this runs, so every run records what it ran beside: the 1-minute load average before and
after, and the CPU time the demo and its children used (user + sys: about what it needs on an idle box, where its
few threads are not waiting for a core). Per run it prints one JSON line (wall and CPU seconds, stage seconds, engine,
load) and finally a markdown row per engine for docs/benchmarks.md.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/demo_time.py [--engine auto reference] [--repeat 1] [--out DIR]

``--engine auto`` is the demo as typed (vLLM when it is importable); ``reference`` is the demo without vLLM.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed_cli(args: list[str], what: str) -> tuple[subprocess.CompletedProcess, dict]:
    """``python -m eagle_migrate ARGS`` in a subprocess (this checkout first on PYTHONPATH), as a user runs it: the
    finished process and its wall seconds, CPU seconds (user + sys of it and its children) and the 1-minute load
    average before and after. A non-zero exit ends the benchmark with the command's last stderr (``what`` names it)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    load0, cpu0, t0 = os.getloadavg()[0], _children_cpu(), time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "eagle_migrate", *args], env=env, capture_output=True, text=True)
    wall, cpu, load1 = time.perf_counter() - t0, _children_cpu() - cpu0, os.getloadavg()[0]
    if p.returncode != 0:
        raise SystemExit(f"{what} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return p, {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "load_before": round(load0, 2),
               "load_after": round(load1, 2)}


def run_once(engine: str, out: Path) -> dict:
    """One demo in a fresh folder under ``out``; its wall time, CPU time, stages and table."""
    work = out / f"demo-{engine}"
    if work.exists():
        shutil.rmtree(work)
    p, t = timed_cli(["demo", "--out", str(work), "--json"] + ([] if engine == "auto" else ["--engine", engine]), "demo")
    res = json.loads(p.stdout)
    return {"engine_asked": engine, "engine": res["engine"], "engine_version": res.get("engine_version"),
            "wall_s": t["wall_s"], "cpu_s": t["cpu_s"], "load1_before": t["load_before"], "load1_after": t["load_after"],
            "cores": os.cpu_count(), "stages_s": {s["name"]: s["seconds"] for s in res["pipeline"]["stages"]},
            "rows": [(r["suite"], r["source_al"], r["new_al"]) for r in res["rows"]], "verdict": res.get("verdict")}


def each_run(run_once: Callable[[str, Path], dict], engines: list[str], repeat: int, out: Path | None,
             prefix: str) -> list[dict]:
    """``run_once(engine, work folder)`` for every engine, ``repeat`` times, in ``out`` (default: a temporary folder,
    removed afterwards); each result printed as one JSON line as it comes, all returned."""
    tmp = tempfile.TemporaryDirectory(prefix=prefix) if out is None else None
    work = Path(tmp.name) if tmp is not None else out
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for _ in range(repeat):
            for eng in engines:
                r = run_once(eng, work)
                print(json.dumps(r), flush=True)
                rows.append(r)
    finally:
        if tmp is not None:
            tmp.cleanup()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", nargs="+", default=["auto", "reference"], choices=["auto", "vllm", "reference"])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="work folder (default: a temporary one, removed)")
    a = ap.parse_args()
    runs = each_run(run_once, a.engine, a.repeat, a.out, "demo-time-")
    print("\n| engine | wall s | CPU s (user+sys) | 1-min load before / after | cores |\n|---|---|---|---|---|")
    for r in runs:
        print(f"| {r['engine']} {r['engine_version'] or ''} | {r['wall_s']} | {r['cpu_s']} | "
              f"{r['load1_before']} / {r['load1_after']} | {r['cores']} |")


if __name__ == "__main__":
    main()
