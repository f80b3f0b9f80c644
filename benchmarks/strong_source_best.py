"""The best CPU-trained EAGLE-3 source of issue 25, committed without the target's embeddings (issue 25, item 2).

    python benchmarks/strong_source_best.py pack SRC [--state benchmarks/strong_source/best]
    python benchmarks/strong_source_best.py unpack OUT [--state benchmarks/strong_source/best] [--force]

``pack`` takes a speculators checkpoint folder (``model.safetensors`` + ``config.json`` [+ ``config.py``,
``train_command.txt``, ``val_metrics.json``]) whose ``embed_tokens.weight`` is the target's own embedding matrix in
the checkpoint's dtype (speculators freezes it: ``embed_requires_grad: false``), checks that it is, and writes the
checkpoint without it (about 20 MB instead of 76) into the committed folder, replaced in place, with
``provenance.json`` (sha256 of the source file and of every kept tensor, the target, the dropped tensor's shape,
dtype and sha256). The folder replaced (``--state``, ``OUT``) may not be, hold or lie inside an input (the source,
the committed folder, the target), ``--force`` included.

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
    """The target's path and its embedding matrix in ``dtype`` (eagle_migrate.target's weight reader)."""
    from eagle_migrate import assets
    from eagle_migrate.target import TargetWeights

    tpath = str(assets.smollm2_target())
    return tpath, TargetWeights(tpath).embed_weight.to(dtype)


def _refuse_overlap(out: Path, inputs: list) -> None:
    """The project's rule (formats.output.check_no_overlap): a folder this script replaces is, holds or lies inside
    no input; a one-line exit instead of its exception."""
    from eagle_migrate.errors import EagleMigrateError
    from eagle_migrate.formats.output import check_no_overlap

    try:
        check_no_overlap(out, inputs)
    except EagleMigrateError as e:
        raise SystemExit(str(e)) from None


def _replace_folder(dest: Path, weights: dict, side_from: Path, extra: dict[str, str] | None = None) -> None:
    """``weights`` as model.safetensors, the side files of ``side_from`` and ``extra`` (name -> text) written into a
    temporary sibling folder, which then replaces ``dest``."""
    from safetensors.torch import save_file

    tmp = dest.with_name(dest.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for name in SIDE_FILES:
        if (side_from / name).exists():
            shutil.copy2(side_from / name, tmp / name)
    for name, text in (extra or {}).items():
        (tmp / name).write_text(text)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)


def pack(src: Path, state: Path) -> dict:
    from safetensors.torch import load_file

    w = load_file(str(src / "model.safetensors"))
    emb = w.pop(EMBED)
    tpath, temb = _target_embedding(emb.dtype)
    _refuse_overlap(state, [src, tpath])
    if not (temb.shape == emb.shape and bool((temb == emb).all())):
        raise SystemExit(f"{src}: {EMBED} is not the target's embedding; packing it without would lose it")
    prov = {"source": str(src), "source_sha256": hashlib.sha256((src / "model.safetensors").read_bytes()).hexdigest(),
            "dropped": {EMBED: {"shape": list(emb.shape), "dtype": str(emb.dtype), "sha256": _sha(emb),
                                "restored_from": "the target's model.embed_tokens.weight cast to this dtype"}},
            "target": Path(tpath).name, "tensors": {k: _sha(v) for k, v in sorted(w.items())}}
    _replace_folder(state, w, src, {"provenance.json": json.dumps(prov, indent=1) + "\n"})
    return prov


def unpack(out: Path, state: Path, force: bool) -> Path:
    import torch
    from safetensors.torch import load_file

    if out.exists() and not force:
        raise SystemExit(f"{out} exists; pass --force to replace it")
    prov = json.loads((state / "provenance.json").read_text())
    w = load_file(str(state / "model.safetensors"))
    bad = [k for k, v in w.items() if prov["tensors"].get(k) != _sha(v)] + sorted(set(prov["tensors"]) - set(w))
    if bad:
        raise SystemExit(f"{state}: tensors differ from provenance.json: {bad[:5]}")
    d = prov["dropped"][EMBED]
    tpath, emb = _target_embedding(getattr(torch, d["dtype"].removeprefix("torch.")))
    _refuse_overlap(out, [state, tpath])
    if _sha(emb) != d["sha256"]:
        raise SystemExit("the target's embedding does not match the one packed away (another target?)")
    w[EMBED] = emb
    _replace_folder(out, w, state)
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
