"""Seconds a sequence of the fit measurement's continuations (``own_text``: a 48-token prompt continued greedily by
40 tokens with transformers' ``generate``) at 16, 32 and 64 prompts a call, on a target folder (default: the
changed SmolLM2 target B of issue 50). What ``target_fit.FOLLOW_GENERATE_BATCH`` was chosen from.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/retarget/generate_batch.py [TARGET]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from eagle_migrate.judge import greedy_continuations  # noqa: E402
from eagle_migrate.target import LazyTarget  # noqa: E402

TARGET = ROOT / "runs" / "retarget" / "targets" / "format-lr0.0002-s40"


def main() -> None:
    target = LazyTarget(sys.argv[1] if len(sys.argv) > 1 else str(TARGET), "cpu", torch.float32)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 20000, (48,), generator=g).tolist() for _ in range(64)]
    for b in (16, 32, 64):
        t0 = time.perf_counter()
        for i in range(0, 64, b):
            greedy_continuations(target.loaded, prompts[i:i + b], 40, batch=b, ignore_eos=True)
        dt = time.perf_counter() - t0
        print(json.dumps({"batch": b, "sequences": 64, "seconds": round(dt, 1), "per_sequence_s": round(dt / 64, 3)}),
              flush=True)


if __name__ == "__main__":
    main()
