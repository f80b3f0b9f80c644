"""Wall time of convert's fit measurement (``target_fit.assess`` with the reference target: step-0 agreement on B's
and A's own text, then the follows measurement) with B's continuations made in vLLM (all the follows measurement
wants, 256, in one call, its start included: ``own_text``'s route for a target of ``VLLM_MIN_PARAMS`` or more, forced
here) and, as the control, in transformers' generate (32 a call: the route for a small target). Same drafter,
targets, data and prompts (convert's statistics sequences first, as convert passes them): the verdict and the
sequences read should match; the seconds say which route pays for this target. Each mode runs in its own process
(cold: no sequences kept between them).

    OMP_NUM_THREADS=2 VLLM_ENABLE_V1_MULTIPROCESSING=0 .venv/bin/python benchmarks/retarget/fit_time.py \
        runs/retarget/src-best runs/retarget/targets/format-lr0.0002-s40 [A]

Prints one JSON line per mode: seconds (the whole assess, A and B loaded lazily inside it), the verdict, the follows
measurement's sequences, share and SE, and the agreements.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def one(src: str, b: str, a: str, mode: str) -> dict:
    import torch

    from eagle_migrate import own_text
    from eagle_migrate.corpora import calibration_sequences
    from eagle_migrate.formats import read_checkpoint
    from eagle_migrate.target import LazyTarget
    from eagle_migrate.target_fit import assess

    own_text.VLLM_MIN_PARAMS = 0 if mode == "vllm" else float("inf")
    ck = read_checkpoint(Path(src))
    lt = LazyTarget(b, "cpu", torch.float32)
    first = calibration_sequences("sharegpt", lt.tokenizer, lt.info.vocab_size, 32, 512, 0)  # convert's statistics pass
    t0 = time.perf_counter()
    fit = assess(ck, lt, ck.config.aux_layer_ids, trained_for_path=a, data="sharegpt", sequences=first)
    dt = time.perf_counter() - t0
    fo = fit.follows
    return {"mode": mode, "seconds": round(dt, 1), "verdict": fit.verdict,
            "follows_sequences": fo.sequences if fo else None, "share": round(fo.share, 4) if fo else None,
            "se": round(fo.standard_error, 4) if fo else None, "positions": fo.positions if fo else None,
            "on_target": round(fit.on_target.agreement, 4) if fit.on_target else None,
            "on_trained_for": round(fit.on_trained_for.agreement, 4) if fit.on_trained_for else None}


def main() -> None:
    if sys.argv[1] == "--one":
        print(json.dumps(one(*sys.argv[2:6])), flush=True)
        return
    src, b = sys.argv[1], sys.argv[2]
    if len(sys.argv) > 3:
        a = sys.argv[3]
    else:
        from eagle_migrate.assets import smollm2_target

        a = str(smollm2_target())
    for mode in ("vllm", "transformers"):
        r = subprocess.run([sys.executable, __file__, "--one", src, b, a, mode], capture_output=True, text=True)
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith("{")), None)
        print(line or json.dumps({"mode": mode, "error": r.stderr[-800:]}), flush=True)


if __name__ == "__main__":
    main()
