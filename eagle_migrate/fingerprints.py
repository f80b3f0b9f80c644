"""Content fingerprints of a target (a local folder, a file or a Hub id) for stage hashes and caches: what the
target *is*, not where it lies (docs/reliability.md). Stdlib + formats.io only; no torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def is_hub_id(spec: str) -> bool:
    """ORG/NAME that is not a local path (publish's base_model must be a Hub id; local targets come from provenance)."""
    return spec.count("/") == 1 and not spec.startswith((".", "/", "~")) and not Path(spec).exists()


def target_fingerprint(target: str, verify: bool = False) -> dict[str, Any]:
    """What identifies the target's content in the stage hashes (not its path): a local folder by its config and
    a weights fingerprint (safetensors headers + file sizes + mtimes; ``verify``: the sha256 of every weight
    file), a Hub id by its resolved revision (the cached snapshot's commit offline) and that snapshot's files."""
    import hashlib
    import struct

    from .formats.io import WEIGHT_SUFFIXES

    def folder_print(d: Path) -> dict[str, Any]:
        files: dict[str, Any] = {}
        for f in sorted(x for x in d.rglob("*") if x.is_file() and not any(part.startswith(".") for part in x.relative_to(d).parts)):
            rel = f.relative_to(d).as_posix()
            st = f.stat()
            if f.suffix in WEIGHT_SUFFIXES or f.name.endswith(".gguf"):
                h = hashlib.sha256()
                with open(f, "rb") as fh:
                    if verify:
                        while b := fh.read(1 << 22):
                            h.update(b)
                    elif f.suffix == ".safetensors":
                        head = fh.read(8)
                        h.update(head)
                        if len(head) == 8:
                            h.update(fh.read(min(struct.unpack("<Q", head)[0], 1 << 26)))
                files[rel] = {"size": st.st_size, "sha256" if verify else "header": h.hexdigest(),
                              **({} if verify else {"mtime_ns": st.st_mtime_ns})}
            elif st.st_size <= 1 << 24:  # config, tokenizer, index: small, hashed in full
                files[rel] = {"sha256": hashlib.sha256(f.read_bytes()).hexdigest()}
            else:
                files[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
        return {"files": files, "verified": verify}

    p = Path(target).expanduser()
    if p.is_dir():
        return {"local": folder_print(p.resolve())}
    if p.is_file():
        st = p.stat()
        return {"file": {"size": st.st_size, "mtime_ns": st.st_mtime_ns}}
    if is_hub_id(target):
        try:
            from huggingface_hub import snapshot_download

            snap = Path(snapshot_download(target, local_files_only=True))
            return {"hub": target, "revision": snap.name, "snapshot": folder_print(snap)}
        except Exception:  # not in the cache: ask the Hub for the revision (online only)
            import os

            if os.environ.get("HF_HUB_OFFLINE", "0") in ("", "0"):
                try:
                    from huggingface_hub import HfApi

                    return {"hub": target, "revision": HfApi().model_info(target).sha}
                except Exception:
                    pass
    return {"name": target}
