"""Wall time of `eagle-migrate inspect --json` and `eagle-migrate --help`, each in a fresh process (what a user waits).

`inspect` is a header read: it and `--help` import neither torch nor transformers (tests/unit/test_layers.py), so
their time is the interpreter, typer/pydantic and the header read. Each case runs ``--runs`` times in a cold process
(``python -m eagle_migrate ...``); the median and the spread are printed. With ``--compare DIR`` the same cases run
against another checkout (e.g. the main branch before the lazy imports), interleaved run by run so that a busy
machine slows both alike.

    .venv/bin/python benchmarks/inspect_speed.py [--runs 9] [--drafter DIR] [--compare /path/to/other/checkout]

Default drafter: the toy EAGLE-3 drafter (eagle_migrate/toy.py, 0.2 MB of safetensors) written to a temp folder.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_once(repo: Path, args: list[str]) -> float:
    env = dict(os.environ, PYTHONPATH=str(repo))
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "eagle_migrate", *args], env=env, cwd=repo, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode not in (0, 1):  # 1: the drafter has an error finding (still a full inspect)
        raise SystemExit(f"{repo}: eagle-migrate {' '.join(args)} exited {r.returncode}: {r.stderr[-500:]}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--drafter", type=Path, help="drafter folder to inspect (default: the toy drafter)")
    ap.add_argument("--compare", type=Path, help="another checkout of eagle-migrate to time the same way")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        drafter = a.drafter
        if drafter is None:
            sys.path.insert(0, str(ROOT))
            from eagle_migrate import toy

            drafter = toy.write_drafter(Path(tmp) / "toy-drafter", "random")
        size = sum(f.stat().st_size for f in Path(drafter).iterdir() if f.is_file())
        cases = {"inspect --json": ["inspect", str(drafter), "--json"], "--help": ["--help"]}
        repos = {"this": ROOT} | ({"compare": a.compare.resolve()} if a.compare else {})
        times: dict[tuple[str, str], list[float]] = {(r, c): [] for r in repos for c in cases}
        for repo, c in times:  # one warm-up each (file-system cache, .pyc files), not counted
            run_once(repos[repo], cases[c])
        for _ in range(a.runs):
            for (repo, c), ts in times.items():
                ts.append(run_once(repos[repo], cases[c]))
    load = os.getloadavg()[0]
    rows = []
    for (repo, c), ts in times.items():
        row = {"checkout": str(repos[repo]), "case": c, "runs": len(ts), "median_s": round(statistics.median(ts), 3),
               "min_s": round(min(ts), 3), "max_s": round(max(ts), 3)}
        rows.append(row)
        print(json.dumps(row))
    print(f"\ndrafter: {drafter} ({size / 1e6:.2f} MB); {os.cpu_count()} CPUs, load average {load:.1f}\n")
    print("| checkout | case | median s | min s | max s |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['checkout']} | `{r['case']}` | {r['median_s']:.2f} | {r['min_s']:.2f} | {r['max_s']:.2f} |")


if __name__ == "__main__":
    main()
