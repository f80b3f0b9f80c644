"""Shared by the GPU drivers in benchmarks/gpu/ (see README.md there): the asset cache on the device machine, and
writing a drafter so that it comes back through $OUT (files of at most 16 MiB each, at most 8 files a call)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

OUT_FILE_LIMIT = 15 * 2**20  # the device tool returns files of at most 16 MiB


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def reshard(folder: Path, max_bytes: int = OUT_FILE_LIMIT) -> list[str]:
    """Split ``folder/model.safetensors`` into ``model-0000i-of-0000n.safetensors`` shards of at most ``max_bytes``
    plus ``model.safetensors.index.json`` (the layout HF, vLLM and eagle-migrate's reader load), when it is larger.
    Returns the weight files now in the folder."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    f = folder / "model.safetensors"
    if f.stat().st_size <= max_bytes:
        return [f.name]
    with safe_open(str(f), "pt") as src:
        meta = src.metadata() or {}
        names = list(src.keys())
        tensors = {n: src.get_tensor(n) for n in names}
    shards: list[list[str]] = [[]]
    size = 0
    for n in sorted(names, key=lambda n: -tensors[n].numel() * tensors[n].element_size()):
        b = tensors[n].numel() * tensors[n].element_size()
        if b > max_bytes - 4096:
            raise ValueError(f"{n} alone is {b / 2**20:.1f} MiB: larger than one returned file may be")
        if shards[-1] and size + b > max_bytes - 65536:
            shards.append([])
            size = 0
        shards[-1].append(n)
        size += b
    weight_map, files = {}, []
    for i, group in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in group}, str(folder / name), metadata=meta)
        weight_map.update({n: name for n in group})
        files.append(name)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    f.unlink()
    return files


def cache_env() -> Path:
    """The asset cache the drivers use: $EAGLE_MIGRATE_CACHE (device_setup.sh sets /tmp/em/cache)."""
    root = Path(os.environ.get("EAGLE_MIGRATE_CACHE") or Path.home() / ".cache" / "eagle-migrate")
    return root
