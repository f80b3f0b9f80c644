"""Reference engine speed vs transformers' plain greedy ``generate`` of the target alone, on the real SmolLM2 pair (CPU).

The reference engine is speculative decoding, so with AL > 2 it must decode faster than the target alone. For each
prompt (the `chat` and `code` suites) the three decoders run back to back (interleaved, so a busy machine slows them
alike), greedy, same output length (EOS ignored):
* ``hf_generate``: ``model.generate(do_sample=False, max_new_tokens=N)`` (the transformers baseline);
* ``reference_plain``: our engine without a drafter (the same cached decode loop, no speculation);
* ``reference_spec``: our engine with the drafter (k = 3).
It checks that the speculative output equals transformers' greedy output token for token, and prints one JSON line
per suite plus a markdown table for docs/benchmarks.md.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/reference_speed.py [--drafter DIR] [--num-prompts 6] [--max-tokens 96]
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/reference_speed.py --suites prompts \
        --prompts benchmarks/prompts/predictable.jsonl -k 5     # counting / listing requests: AL > 2 with the weak drafter

Default drafter: the trained EAGLE-3 SmolLM2 drafter of benchmarks/train_smollm2_eagle3.py (asset cache).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle_migrate import assets, corpora  # noqa: E402
from eagle_migrate.target import load_target  # noqa: E402
from eagle_migrate.engines.metrics import AcceptanceStats  # noqa: E402
from eagle_migrate.loader import load_drafter  # noqa: E402
from eagle_migrate.engines.reference import ReferenceEngine, _add  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None, help="target folder (default: SmolLM2-135M-Instruct from the asset cache)")
    ap.add_argument("--drafter", default=str(assets.cache_root() / "smollm2-eagle3"))
    ap.add_argument("--suites", default="chat,code", help="comma-separated suites of eagle_migrate.corpora; 'prompts' = --prompts")
    ap.add_argument("--prompts", default=None, help="a prompt file for the 'prompts' suite (e.g. benchmarks/prompts/predictable.jsonl)")
    ap.add_argument("--num-prompts", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("-k", type=int, default=3)
    args = ap.parse_args()
    target_dir = args.target or str(assets.smollm2_target())
    if not Path(args.drafter).exists():
        sys.exit(f"no drafter at {args.drafter} (run benchmarks/train_smollm2_eagle3.py first)")
    tg = load_target(target_dir)
    drafter = load_drafter(args.drafter, tg)
    spec = ReferenceEngine(tg, drafter, args.k)
    plain = ReferenceEngine(tg, None, args.k)
    rows = []
    for name in args.suites.split(","):
        s = corpora.suite(name, tg.tokenizer, tg.info, num_prompts=args.num_prompts, max_tokens=args.max_tokens,
                       prompts_file=args.prompts if name == "prompts" else None)
        t = {"hf_generate": 0.0, "reference_plain": 0.0, "reference_spec": 0.0}
        toks = 0
        stats = AcceptanceStats(accepted_per_position=[0] * args.k)
        exact = True
        for p in s.prompts:
            spec.generate(p[:8], 2, ignore_eos=True)  # warm-up of shapes and allocator
            t0 = time.perf_counter()
            with torch.no_grad():
                hf = tg.model.generate(torch.tensor([p]), max_new_tokens=args.max_tokens, min_new_tokens=args.max_tokens,
                                       do_sample=False, pad_token_id=tg.tokenizer.eos_token_id)[0, len(p):].tolist()
            t1 = time.perf_counter()
            r0 = plain.generate(p, args.max_tokens, ignore_eos=True)
            t2 = time.perf_counter()
            r = spec.generate(p, args.max_tokens, ignore_eos=True)
            t3 = time.perf_counter()
            t["hf_generate"] += t1 - t0
            t["reference_plain"] += t2 - t1
            t["reference_spec"] += t3 - t2
            toks += len(r.output)
            stats = _add(stats, r.stats)
            exact &= r.output == hf[: len(r.output)] and r0.output == r.output
        row = {"suite": name, "prompts": len(s.prompts), "output_tokens": toks, "acceptance_length": round(stats.acceptance_length, 3),
               "greedy_output_identical": exact, **{f"{k}_tok_s": round(toks / v, 2) for k, v in t.items()},
               "speedup_vs_hf_generate": round(t["hf_generate"] / t["reference_spec"], 3),
               # cost model: one speculation round (verify k+1 tokens + k drafter steps) in units of one plain token;
               # speculation beats HF generate exactly when AL > break_even_al_vs_hf
               "round_seconds": round(t["reference_spec"] / max(stats.num_drafts, 1), 4),
               "hf_token_seconds": round(t["hf_generate"] / toks, 4),
               "break_even_al_vs_hf": round((t["reference_spec"] / max(stats.num_drafts, 1)) / (t["hf_generate"] / toks), 3),
               "speedup_vs_reference_plain": round(t["reference_plain"] / t["reference_spec"], 3),
               "threads": torch.get_num_threads()}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| suite | prompts x tokens | AL | HF generate tok/s | reference plain tok/s | reference spec tok/s | spec vs HF | "
          "break-even AL vs HF | output identical |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['suite']} | {r['prompts']} x {args.max_tokens} | {r['acceptance_length']:.2f} | {r['hf_generate_tok_s']:.2f} | "
              f"{r['reference_plain_tok_s']:.2f} | {r['reference_spec_tok_s']:.2f} | {r['speedup_vs_hf_generate']:.2f}x | "
              f"{r['break_even_al_vs_hf']:.2f} | "
              f"{'yes' if r['greedy_output_identical'] else 'NO'} |")


if __name__ == "__main__":
    main()
