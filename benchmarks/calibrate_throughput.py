"""Calibration training throughput (tokens/s) for a drafter shape with random weights, per --train mode.

The loop is the product's: ``eagle_migrate.train.fit`` with the unrolled k-step loss, fp32 master weights, bf16
autocast and fused AdamW on CUDA, bf16 batches copied from host memory every step (as the feature cache serves a
bf16 target's states; streamed features stay on the GPU and skip that copy).
Only the target is replaced: its aux states, final state and head are random tensors of the target's shape, so
the numbers cover the drafter side (what calibration adds on top of the target's forward or a feature cache).

    # Llama-3.1-8B-shaped drafter (H = Ht = 4096, I = 14336, 32/8 heads, V = 128256, Vd = 32000, K = 3)
    python benchmarks/calibrate_throughput.py --shape llama8b --device cuda
    # the same loop on a small shape, e.g. on a CPU
    python benchmarks/calibrate_throughput.py --shape small --device cpu --seq-len 128 --steps 4

``--end-to-end`` runs the product's ``calibrate()`` instead, with its device defaults, against a random-weight
Llama target of the same shape family (llama8b: the 32-layer Llama-3.1-8B config, bf16) on random token
sequences and held-out prompts of the default suite sizes, and reports where the wall time goes (target features,
held-out continuations, training, held-out evaluations). Acceptance numbers of random models mean nothing; only
the times do.

    python benchmarks/calibrate_throughput.py --shape llama8b --end-to-end

Tokens/s counts trained positions (step-0 loss positions; each also trains steps 1..k-1) over the wall time of
the timed steps (every step syncs: the loop reads the loss), after ``--warmup-steps`` untimed ones.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle_migrate.calibrate import trainable_names  # noqa: E402
from eagle_migrate.drafter import DrafterConfig, EagleDrafter  # noqa: E402
from eagle_migrate.train import FitConfig, fit  # noqa: E402
from eagle_migrate.features import FeatureBatch, TargetHead  # noqa: E402

SHAPES = {
    "llama8b": dict(hidden_size=4096, target_hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                    num_key_value_heads=8, head_dim=128, vocab_size=128256, draft_vocab_size=32000,
                    aux_layer_ids=[2, 16, 29], rope_theta=500000.0, max_position_embeddings=8192),
    "small": dict(hidden_size=256, target_hidden_size=256, intermediate_size=512, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, vocab_size=4096, draft_vocab_size=1024,
                  aux_layer_ids=[1, 3, 5], max_position_embeddings=4096),
}
AUX_RMS = (1.0, 6.0, 30.0)  # the size spread of real aux layers (early, middle, late), so the norms see real scales


def build(shape: str, device: torch.device) -> tuple[EagleDrafter, TargetHead]:
    cfg = DrafterConfig(**SHAPES[shape], fc_norm=True, norm_output=True, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    with torch.device(device):
        m = EagleDrafter(cfg)
        with torch.no_grad():
            for k, n in enumerate(m.fc_norm):
                n.weight.fill_(AUX_RMS[k])
            if hasattr(m, "d2t"):
                m.d2t.copy_(torch.randperm(cfg.vocab_size, device=device)[: cfg.draft_vocab_size].sort().values
                            - torch.arange(cfg.draft_vocab_size, device=device))
        head = TargetHead(torch.randn(cfg.draft_vocab_size, cfg.target_hidden_size) / cfg.target_hidden_size**0.5)
    return m.float(), head


class RandomFeatures:
    """``n`` host-memory batches of target features with the target's shapes (aux chunks at AUX_RMS scales), in
    ordinary (pageable) memory as the feature cache serves them."""

    def __init__(self, cfg: DrafterConfig, n: int, batch: int, seq_len: int, dtype: torch.dtype):
        g = torch.Generator().manual_seed(1)
        ht, k = cfg.target_hidden_size, cfg.num_aux
        scale = torch.tensor(AUX_RMS[:k]).repeat_interleave(ht)
        self.batches = []
        for _ in range(n):
            aux = (torch.randn(batch, seq_len, k * ht, generator=g) * scale).to(dtype)
            fin = torch.randn(batch, seq_len, ht, generator=g).to(dtype)
            ids = torch.randint(0, cfg.vocab_size, (batch, seq_len), generator=g)
            mask = torch.ones(batch, seq_len, dtype=torch.bool)
            self.batches.append(FeatureBatch(ids, aux, mask, final=fin))

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> FeatureBatch:
        return self.batches[i]


def run_one(shape: str, mode: str, device: torch.device, batch: int, seq_len: int, k: int, steps: int,
            warmup_steps: int, profile: Path | None = None) -> dict:
    model, head = build(shape, device)
    feats = RandomFeatures(model.cfg, 4, batch, seq_len, torch.bfloat16 if device.type == "cuda" else torch.float32)
    names = trainable_names(model, mode)
    n_params = sum(p.numel() for n, p in model.named_parameters() if n in names)
    stamps: list[tuple[float, int]] = []

    def progress(rec: dict) -> None:
        if rec.get("phase") == "train":
            stamps.append((time.perf_counter(), rec["tokens"]))

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    cfg = FitConfig(steps=warmup_steps + steps, lr=1e-4, warmup=0, k=k, eval_every=10**9, patience=None)
    if profile is None:
        fit(model, names, feats, head, cfg, device=device, progress=progress)
    else:  # the kernels of the whole run, by device time
        from torch.profiler import ProfilerActivity, profile as prof

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with prof(activities=acts) as p:
            fit(model, names, feats, head, cfg, device=device, progress=progress)
        key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
        profile.write_text(p.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=70))
    (t0, n0), (t1, n1) = stamps[warmup_steps - 1], stamps[-1]
    out = {
        "shape": shape, "mode": mode, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "batch": batch, "seq_len": seq_len, "k": k, "timed_steps": steps, "trainable_params": n_params,
        "tokens_per_s": (n1 - n0) / (t1 - t0), "ms_per_step": 1e3 * (t1 - t0) / steps,
        "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }
    del model, head, feats
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


TARGETS = {
    "llama8b": dict(num_hidden_layers=32, rope_theta=500000.0, max_position_embeddings=131072),
    "small": dict(num_hidden_layers=6, max_position_embeddings=8192),
}


def end_to_end(shape: str, device: torch.device, steps: int | None, num_sequences: int, heldout: int | None = None) -> dict:
    """``calibrate()`` with the device's defaults on a random-weight target; wall time per phase. ``heldout``: at
    most this many sequences per held-out suite (the unit test's small run; default: the judge's full size)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from eagle_migrate.calibrate import defaults_for
    from eagle_migrate.calibrate import calibrate as run_calibration
    from eagle_migrate.target import Target, TargetInfo

    sh = SHAPES[shape]
    tcfg = LlamaConfig(hidden_size=sh["target_hidden_size"], intermediate_size=sh["intermediate_size"],
                       num_attention_heads=sh["num_attention_heads"], num_key_value_heads=sh["num_key_value_heads"],
                       head_dim=sh["head_dim"], vocab_size=sh["vocab_size"], rms_norm_eps=1e-5, **TARGETS[shape])
    t0 = time.perf_counter()
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dt)
    try:
        with torch.device(device):
            tm = LlamaForCausalLM(tcfg).eval()
    finally:
        torch.set_default_dtype(prev)
    info = TargetInfo(path=f"random-{shape}", hidden_size=tcfg.hidden_size, num_layers=tcfg.num_hidden_layers,
                      vocab_size=tcfg.vocab_size, max_position_embeddings=tcfg.max_position_embeddings,
                      rope_theta=tcfg.rope_theta if hasattr(tcfg, "rope_theta") else 10000.0, rope_scaling=None,
                      rms_norm_eps=1e-5, model_type="llama", raw=tcfg.to_dict())
    target = Target(model=tm, tokenizer=None, info=info, device=device)
    model, _ = build(shape, device)
    build_s = time.perf_counter() - t0
    d = defaults_for(device)
    g = torch.Generator().manual_seed(0)

    def toks(n: int) -> list[int]:
        return torch.randint(100, tcfg.vocab_size, (n,), generator=g).tolist()

    train = [toks(d["seq_len"]) for _ in range(num_sequences)]
    cap = heldout if heldout is not None else 10**9
    held = {"chat": [toks(200) for _ in range(min(cap, d["heldout_per_suite"]))],
            "long": [toks(n - d["heldout_new_tokens"]) for n in d["heldout_long_buckets"]
                     for _ in range(d["heldout_long_per_bucket"])][:cap],
            "template-shift": [toks(300) for _ in range(min(cap, d["heldout_shift_max"]))]}
    marks: list[tuple[float, str]] = []

    def progress(stage: str, done: int, total: int | None, info: str = "") -> None:  # eagle_migrate.progress.StageProgress
        marks.append((time.perf_counter(), stage))

    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t1 = time.perf_counter()
    res = run_calibration(model, target, train, held, train="norms", steps=steps, device=device, progress=progress)
    total = time.perf_counter() - t1
    # wall time per phase: each event closes the interval since the previous one
    phases: dict[str, float] = {}
    last = t1
    for t, ph in marks:
        key = {"calibrate": "train steps", "calibrate: held-out suites": "held-out continuations + features",
               "calibrate: target features": "train features", "calibrate: held-out evaluations": "held-out evaluations"}.get(ph, ph)
        phases[key] = phases.get(key, 0.0) + (t - last)
        last = t
    phases["final evaluation + report"] = phases.get("final evaluation + report", 0.0) + (time.perf_counter() - last)
    return {
        "shape": shape, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "target_layers": tcfg.num_hidden_layers, "steps_run": res.steps_run, "tokens_seen": res.tokens_seen,
        "train_sequences": num_sequences, "seq_len": d["seq_len"], "batch": d["batch"],
        "heldout": {n: len(v) for n, v in held.items()}, "build_s": build_s, "calibrate_s": total,
        "phases_s": phases,
        "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama8b")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--modes", default="norms,norms+fc,all")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", default="512,2048", help="comma-separated")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup-steps", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=1, help="run every configuration this many times (all rows kept)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--profile", type=Path, help="profile the first configuration instead, kernel table to this file")
    ap.add_argument("--end-to-end", action="store_true", help="calibrate() on a random-weight target (see above)")
    ap.add_argument("--e2e-steps", type=int, help="--end-to-end: calibration steps (default: the device's)")
    ap.add_argument("--e2e-sequences", type=int, default=64, help="--end-to-end: training sequences (convert's default)")
    a = ap.parse_args()
    device = torch.device(a.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    if a.end_to_end:
        r = end_to_end(a.shape, device, a.e2e_steps, a.e2e_sequences)
        print(json.dumps(r, indent=1))
        if a.json:
            a.json.write_text(json.dumps(r, indent=1))
        return
    rows = []
    seq_lens, modes = [int(s) for s in a.seq_len.split(",")], a.modes.split(",")
    if a.profile:
        run_one(a.shape, modes[0], device, a.batch, seq_lens[0], a.k, a.steps, a.warmup_steps, a.profile)
        print(a.profile.read_text())
        return
    for _ in range(a.repeats):
        for seq_len in seq_lens:
            for mode in modes:
                r = run_one(a.shape, mode, device, a.batch, seq_len, a.k, a.steps, a.warmup_steps)
                rows.append(r)
                print(json.dumps(r), file=sys.stderr, flush=True)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    print("| shape | device | --train | trainable params | batch x seq | k | tokens/s | ms/step | peak GPU GiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        peak = f"{r['peak_gib']:.1f}" if r["peak_gib"] is not None else "-"
        print(f"| {r['shape']} | {r['device']} | {r['mode']} | {r['trainable_params'] / 1e6:.3g} M | "
              f"{r['batch']} x {r['seq_len']} | {r['k']} | {r['tokens_per_s']:,.0f} | {r['ms_per_step']:.0f} | {peak} |")


if __name__ == "__main__":
    main()
