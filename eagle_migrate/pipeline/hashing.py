"""Hashing for the stage runner: inputs by content (paths by sha256, cached in the manifest by size + mtime), the
files a finished stage left (what a skip is trusted on), and the digest that chains each stage to the earlier ones.
Imports: pydantic, ``pipeline.manifest``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from .manifest import FileHash

_HASH_CHUNK = 1 << 22


class Hasher:
    def __init__(self, cache: dict[str, FileHash]):
        self.cache = cache
        self.used: set[str] = set()

    def file(self, p: Path) -> str:
        st = p.stat()
        key = str(p.resolve())
        self.used.add(key)
        hit = self.cache.get(key)
        if hit and hit.size == st.st_size and hit.mtime_ns == st.st_mtime_ns:
            return hit.sha256
        h = hashlib.sha256()
        with open(p, "rb") as f:
            while b := f.read(_HASH_CHUNK):
                h.update(b)
        self.cache[key] = FileHash(size=st.st_size, mtime_ns=st.st_mtime_ns, sha256=h.hexdigest())
        return h.hexdigest()

    def path(self, p: Path) -> dict[str, Any]:
        if p.is_file():
            return {"file": self.file(p)}
        if p.is_dir():
            h = hashlib.sha256()
            for f in sorted(x for x in p.rglob("*") if x.is_file()):
                h.update(f.relative_to(p).as_posix().encode() + b"\0" + self.file(f).encode() + b"\n")
            return {"dir": h.hexdigest()}
        return {"missing": True}

    def canonical(self, v: Any, where: str) -> Any:
        """JSON value standing for ``v`` in the hash (paths by content)."""
        if isinstance(v, Path):
            return {"__path__": self.path(v)}
        if isinstance(v, BaseModel):
            return self.canonical(v.model_dump(mode="json"), where)
        if isinstance(v, Enum):
            return self.canonical(v.value, where)
        if isinstance(v, Mapping):
            return {str(k): self.canonical(x, f"{where}.{k}") for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}
        if isinstance(v, (list, tuple)):
            return [self.canonical(x, f"{where}[{i}]") for i, x in enumerate(v)]
        if v is None or isinstance(v, (str, int, float, bool)):
            return v
        raise TypeError(f"stage input {where} is a {type(v).__name__}; use JSON values or pathlib.Path")


def folder_sha256(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` (full read, no cache: this is what a skip is trusted on)."""
    out: dict[str, str] = {}
    for f in sorted(x for x in Path(folder).rglob("*") if x.is_file()):
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            while b := fh.read(_HASH_CHUNK):
                h.update(b)
        out[f.relative_to(folder).as_posix()] = h.hexdigest()
    return out


def files_changed(recorded: dict[str, str] | None, folder: Path) -> str | None:
    """Why the finished stage folder cannot be trusted any more (None: every file is as the stage wrote it)."""
    if recorded is None:
        return "its manifest record has no file hashes (written by an older eagle-migrate)"
    now = folder_sha256(folder)
    missing = sorted(set(recorded) - set(now))
    if missing:
        return f"{missing[0]} is missing"
    changed = sorted(k for k in recorded if now[k] != recorded[k])
    if changed:
        return f"{changed[0]} changed since the stage finished (sha256 differs)"
    extra = sorted(set(now) - set(recorded))
    if extra:
        return f"{extra[0]} was added since the stage finished"
    return None


def files_digest(files: dict[str, str] | None) -> str:
    return hashlib.sha256(json.dumps(files or {}, sort_keys=True).encode()).hexdigest()


def inputs_digest(hasher: Hasher, inputs: Mapping[str, Any], stage: str, chain: list[Any]) -> str:
    """The inputs hash of a stage: its own inputs (paths by content) and ``chain``, the (name, inputs hash, files
    digest) of every earlier stage."""
    return hashlib.sha256(
        json.dumps({"inputs": hasher.canonical(inputs, stage), "upstream": chain}, sort_keys=True).encode()
    ).hexdigest()
