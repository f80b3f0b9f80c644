"""Seconds a sequence of the fit measurement's continuations (``own_text``: a 48-token prompt continued greedily by
40 tokens with transformers' ``generate``) at 16, 32 and 64 prompts a call, on a target folder (default: the
changed SmolLM2 target B of issue 50). What ``target_fit.FOLLOW_GENERATE_BATCH`` was chosen from. With ``--vllm``:
the same continuations made in one vLLM call (``own_text``'s route: engine start included, ``CONTINUATION_MAX_NUM_SEQS_CPU`` at
once) for 64, 128 and 256 prompts, against transformers at 32 a call (docs/benchmarks.md "The fixed part of convert").

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/retarget/generate_batch.py [TARGET] [--vllm]
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
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    target = LazyTarget(args[0] if args else str(TARGET), "cpu", torch.float32)
    g = torch.Generator().manual_seed(0)
    if "--vllm" in sys.argv:
        return in_vllm(target, [torch.randint(100, 20000, (48,), generator=g).tolist() for _ in range(256)])
    prompts = [torch.randint(100, 20000, (48,), generator=g).tolist() for _ in range(64)]
    for b in (16, 32, 64):
        t0 = time.perf_counter()
        for i in range(0, 64, b):
            greedy_continuations(target.loaded, prompts[i:i + b], 40, batch=b, ignore_eos=True)
        dt = time.perf_counter() - t0
        print(json.dumps({"batch": b, "sequences": 64, "seconds": round(dt, 1), "per_sequence_s": round(dt / 64, 3)}),
              flush=True)


def in_vllm(target: LazyTarget, prompts: list[list[int]]) -> None:
    from eagle_migrate import own_text

    print(json.dumps({"target_params_approx": own_text.approx_params(target.info)}), flush=True)
    for n in (64, 128, 256):
        t0 = time.perf_counter()
        made = own_text._vllm_continuations(target, prompts[:n], 40)
        assert made is not None and len(made) == n
        dt = time.perf_counter() - t0
        print(json.dumps({"engine": "vllm", "sequences": n, "seconds": round(dt, 1)}), flush=True)
    t0 = time.perf_counter()
    greedy_continuations(target.loaded, prompts[:64], 40, batch=32, ignore_eos=True)
    dt = time.perf_counter() - t0
    print(json.dumps({"engine": "transformers", "batch": 32, "sequences": 64, "seconds": round(dt, 1),
                      "per_sequence_s": round(dt / 64, 3)}), flush=True)


if __name__ == "__main__":
    main()
