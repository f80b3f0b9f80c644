"""The best CPU-trained EAGLE-3 source of issue 25, committed without the target's embeddings (issue 25, item 2).

    python benchmarks/strong_source_best.py pack SRC [--state benchmarks/strong_source/best]
    python benchmarks/strong_source_best.py unpack OUT [--state benchmarks/strong_source/best] [--force]

``pack`` takes a speculators checkpoint folder (``model.safetensors`` + ``config.json`` [+ ``config.py``,
``train_command.txt``, ``val_metrics.json``]) whose ``embed_tokens.weight`` is the target's own embedding matrix in
the checkpoint's dtype (speculators freezes it: ``embed_requires_grad: false``), checks that it is, and writes the
checkpoint without it (about 20 MB instead of 76) into the committed folder, replaced in place, with
``provenance.json`` (sha256 of the source file and of every kept tensor, the target, the dropped tensor's shape,
dtype and sha256). ``--state`` must not be or hold the source (the folder is replaced).

``unpack`` writes the whole checkpoint back (the embedding re-read from the target of ``eagle_migrate.assets`` and
cast to the stored dtype): the sha256 of every stored tensor is checked against provenance.json, and the restored
embedding must equal the one ``pack`` dropped (its sha256 is in provenance.json), so the output is the source
tensor for tensor. Nothing is overwritten without ``--force``; the output is written to a temporary folder and
renamed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STATE = ROOT / "benchmarks" / "strong_source" / "best"
EMBED = "embed_tokens.weight"
SIDE_FILES = ("config.json", "config.py", "train_command.txt", "val_metrics.json")


def _sha(t) -> str:
    import torch

    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def _target_embedding(dtype):
    from safetensors import safe_open

    from eagle_migrate import assets

    tpath = assets.smollm2_target()
    for f in sorted(Path(tpath).glob("*.safetensors")):
        with safe_open(str(f), "pt") as g:
            for k in g.keys():
                if k.endswith("embed_tokens.weight"):
                    return str(tpath), g.get_tensor(k).to(dtype)
    raise SystemExit(f"{tpath}: no embed_tokens.weight in the target")


def pack(src: Path, state: Path) -> dict:
    from safetensors.torch import load_file, save_file

    if src.resolve() == state.resolve() or state.resolve() in src.resolve().parents:
        raise SystemExit(f"{state}: the folder to replace is or holds the source {src}; choose another --state")
    w = load_file(str(src / "model.safetensors"))
    emb = w.pop(EMBED)
    tpath, temb = _target_embedding(emb.dtype)
    if not (temb.shape == emb.shape and bool((temb == emb).all())):
        raise SystemExit(f"{src}: {EMBED} is not the target's embedding; packing it without would lose it")
    tmp = state.with_name(state.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(w, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for name in SIDE_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, tmp / name)
    prov = {"source": str(src), "source_sha256": hashlib.sha256((src / "model.safetensors").read_bytes()).hexdigest(),
            "dropped": {EMBED: {"shape": list(emb.shape), "dtype": str(emb.dtype), "sha256": _sha(emb),
                                "restored_from": "the target's model.embed_tokens.weight cast to this dtype"}},
            "target": Path(tpath).name, "tensors": {k: _sha(v) for k, v in sorted(w.items())}}
    (tmp / "provenance.json").write_text(json.dumps(prov, indent=1) + "\n")
    if state.exists():
        shutil.rmtree(state)
    os.replace(tmp, state)
    return prov


def unpack(out: Path, state: Path, force: bool) -> Path:
    import torch
    from safetensors.torch import load_file, save_file

    if out.exists() and not force:
        raise SystemExit(f"{out} exists; pass --force to replace it")
    if out.resolve() == state.resolve() or state.resolve() in out.resolve().parents:
        raise SystemExit(f"{out}: inside the committed folder {state}; choose another output")
    prov = json.loads((state / "provenance.json").read_text())
    w = load_file(str(state / "model.safetensors"))
    bad = [k for k, v in w.items() if prov["tensors"].get(k) != _sha(v)] + sorted(set(prov["tensors"]) - set(w))
    if bad:
        raise SystemExit(f"{state}: tensors differ from provenance.json: {bad[:5]}")
    d = prov["dropped"][EMBED]
    _, emb = _target_embedding(getattr(torch, d["dtype"].removeprefix("torch.")))
    if _sha(emb) != d["sha256"]:
        raise SystemExit("the target's embedding does not match the one packed away (another target?)")
    w[EMBED] = emb
    tmp = out.with_name(out.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(w, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for name in SIDE_FILES:
        if (state / name).exists():
            shutil.copy2(state / name, tmp / name)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("src", type=Path)
    p.add_argument("--state", type=Path, default=STATE)
    u = sub.add_parser("unpack")
    u.add_argument("out", type=Path)
    u.add_argument("--state", type=Path, default=STATE)
    u.add_argument("--force", action="store_true")
    a = ap.parse_args(argv)
    if a.cmd == "pack":
        prov = pack(a.src, a.state)
        print(json.dumps({"state": str(a.state), "tensors": len(prov["tensors"]), "source_sha256": prov["source_sha256"]}))
    else:
        print(json.dumps({"out": str(unpack(a.out, a.state, a.force))}))


if __name__ == "__main__":
    main()
