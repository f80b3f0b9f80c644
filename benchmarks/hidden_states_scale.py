"""Issue 29: peak memory of ``convert`` with and without ``--hidden-states`` on a real pair, and convert's time per
GB of hidden states.

Each run is one fresh ``python -m eagle_migrate convert`` process; its peak RSS is the kernel's high-water mark of
that child (``RUSAGE_CHILDREN`` of a wrapper that runs only it). Prints one JSON line per run and a summary:

* ``target``: the conversion capturing the target's states itself (transformers loads the whole target);
* ``hidden-states``: the same conversion reading ``--hidden-states DS`` (the target never loaded: embedding, final
  norm and lm_head read lazily); ``seconds_per_gb`` = wall time / GB of ``hs_*.safetensors`` read (the statistics
  pass reads at most --num-sequences files).

Usage: python benchmarks/hidden_states_scale.py SRC TARGET DS --out WORK [--num-sequences 32] [--calibrate]
Results: docs/benchmarks.md, section "issue 29".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

WRAP = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.returncode)")


def run(name: str, cmd: list[str], hs_bytes: int | None) -> dict:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", WRAP, *cmd], capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1")))
    dt = time.perf_counter() - t0
    if p.returncode != 0 or not p.stdout.strip():
        raise SystemExit(f"{name}: failed\n{p.stderr[-2000:]}")
    kb, rc = (int(x) for x in p.stdout.split())
    if rc != 0:
        raise SystemExit(f"{name}: convert exited {rc}\n{p.stderr[-2000:]}")
    row = {"run": name, "peak_rss_mib": round(kb / 1024, 1), "seconds": round(dt, 1)}
    if hs_bytes:
        row["hidden_states_gb"] = round(hs_bytes / 1e9, 4)
        row["seconds_per_gb"] = round(dt / (hs_bytes / 1e9), 1)
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("target")
    ap.add_argument("ds", help="speculators prepare-data folder with hidden_states/")
    ap.add_argument("--out", required=True)
    ap.add_argument("--num-sequences", type=int, default=32)
    ap.add_argument("--calibrate", action="store_true", help="default calibration (else --no-calibrate)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    files = sorted((Path(a.ds) / "hidden_states").glob("hs_*.safetensors"), key=lambda f: int(f.stem[3:]))[: a.num_sequences]
    hs_bytes = sum(f.stat().st_size for f in files)
    base = [sys.executable, "-m", "eagle_migrate", "convert", a.src, "--target", a.target, "--num-sequences",
            str(a.num_sequences), "--json", "--force"] + ([] if a.calibrate else ["--no-calibrate"])
    tag = "cal" if a.calibrate else "nocal"
    rows = [run("target", [*base, "-o", str(out / f"target-{tag}")], None),
            run("hidden-states", [*base, "-o", str(out / f"hs-{tag}"), "--hidden-states", a.ds], hs_bytes)]
    tsize = sum(f.stat().st_size for f in Path(a.target).glob("*.safetensors"))
    print(json.dumps({"summary": {"target_weights_mib": round(tsize / 2**20, 1), "calibrate": a.calibrate,
                                  "num_sequences": len(files), **{r["run"]: r for r in rows}}}))


if __name__ == "__main__":
    main()
