"""One eagle-migrate command as the benchmarks run it: ``python -m eagle_migrate ARGS --json`` in this checkout (its
own code: a benchmark run from a worktree measures that worktree), its stderr to a log file, its stdout the one JSON
document. benchmarks/retarget/arms.py and benchmarks/triage_smollm2.py call it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EM = [sys.executable, "-m", "eagle_migrate"]


def run_json(args: list[str], log: Path) -> tuple[dict, float, int]:
    """(the command's JSON document, its wall seconds, its exit code); no JSON on stdout stops the benchmark, naming
    the log."""
    t0 = time.time()
    with open(log, "w") as err:
        r = subprocess.run([*EM, *args], stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT)
    wall = time.time() - t0
    try:
        doc = json.loads(r.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"{args[0]} printed no JSON (rc {r.returncode}); see {log}") from None
    return doc, wall, r.returncode
