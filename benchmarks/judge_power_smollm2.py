"""How many held-out drafts the calibration judge needs, measured on the SmolLM2-135M pair (docs/calibration.md).

Scores the source EAGLE-3 drafter and its structural EAGLE-3.1 conversion (``convert --no-calibrate``) on the same
held-out chat sequences (the target's own greedy continuations, from vLLM in fp32) and reports, per drafter, the AL
with its standard error and the variance of the per-draft accepted count, then the paired difference with its
blocked standard error, the correlation of the two drafters' chain lengths over the positions, and from these how
many drafts (and scored positions) a 2 % change of AL needs to equal 2 standard errors, for one AL and for the
paired difference.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/judge_power_smollm2.py [--source DIR] [--prompts 40]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle_migrate import assets  # noqa: E402
from eagle_migrate import corpora as dm  # noqa: E402
from eagle_migrate.calibration_data import engine_continuations  # noqa: E402
from eagle_migrate.loader import load_drafter  # noqa: E402
from eagle_migrate.judge import judge_block, paired_difference, simulated_acceptance, walk_chains  # noqa: E402
from eagle_migrate.target import load_target  # noqa: E402
from eagle_migrate.features import FeatureStore  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def per_draft(sim) -> list[int]:
    return [a for c in sim.chains for a in walk_chains(c)]


def var(xs) -> float:
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", default=None, help="EAGLE-3 drafter (default: <cache>/smollm2-eagle3)")
    ap.add_argument("--converted", default=None, help="its EAGLE-3.1 conversion (default: convert --no-calibrate here)")
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--rel", type=float, default=0.02, help="the change to resolve, relative to AL")
    a = ap.parse_args()
    t0 = time.perf_counter()
    tpath = assets.smollm2_target()
    src_dir = Path(a.source) if a.source else assets.cache_root() / "smollm2-eagle3"
    target = load_target(str(tpath), device="cpu", dtype=torch.float32)
    conv_dir = Path(a.converted) if a.converted else Path(tempfile.mkdtemp()) / "eagle31"
    if not a.converted:
        from eagle_migrate.convert import convert

        convert(src_dir, str(tpath), conv_dir, calibrate=False, device="cpu", seed=0, command="judge_power_smollm2")
    src = load_drafter(src_dir, target)
    conv = load_drafter(conv_dir, target)
    su = dm.suite("chat", target.tokenizer, target.info, num_prompts=a.prompts, seed=1000, max_model_len=2048)
    prompts = list({tuple(p): p for p in su.prompts}.values())
    t1 = time.perf_counter()
    held = engine_continuations("vllm", tpath, {"chat": prompts}, a.new_tokens, max_model_len=2048)["chat"]
    gen_s = time.perf_counter() - t1
    store = FeatureStore(target, [h.ids for h in held], conv.cfg.aux_layer_ids, batch=4,
                         seq_len=max(len(h.ids) for h in held), keep_in_memory=True)
    pl = [h.prompt_len for h in held]
    t2 = time.perf_counter()
    s_src = simulated_acceptance(src.float().eval(), store, pl, a.k)
    eval_s = time.perf_counter() - t2
    s_conv = simulated_acceptance(conv.float().eval(), store, pl, a.k)
    block = judge_block(a.k)
    d = paired_difference(s_conv, s_src, block)
    xs = [x for c in s_src.chains for x in c]
    ys = [y for c in s_conv.chains for y in c]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    cov = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / (len(xs) - 1)
    rho = cov / math.sqrt(var(xs) * var(ys)) if var(xs) > 0 and var(ys) > 0 else float("nan")
    out: dict = {"source": str(src_dir), "converted": str(conv_dir), "sequences": len(held), "k": a.k,
                 "positions": s_src.num_positions, "block": block, "rho_positions": round(rho, 4)}
    for name, s in (("source", s_src), ("converted", s_conv)):
        v = var(per_draft(s))
        half = a.rel * s.acceptance_length / 2  # 2 % = 2 standard errors
        out[name] = {"al": round(s.acceptance_length, 4), "se": round(s.acceptance_length_se, 4), "drafts": s.num_drafts,
                     "var_per_draft": round(v, 4), "drafts_for_2pct": math.ceil(v / half**2)}
    half = a.rel * s_src.acceptance_length / 2
    out["paired"] = {"diff": round(d.diff, 4), "se": round(d.se, 4), "relative": round(d.relative, 4),
                     "unpaired_se": round(math.hypot(s_src.acceptance_length_se, s_conv.acceptance_length_se), 4),
                     "positions_for_2pct": math.ceil(d.num_positions * (d.se / half) ** 2) if d.se > 0 else 0}
    out["seconds"] = {"continuations": round(gen_s, 1), "one_evaluation": round(eval_s, 1),
                      "total": round(time.perf_counter() - t0, 1)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
