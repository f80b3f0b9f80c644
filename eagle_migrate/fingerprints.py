"""Content fingerprints of a target (a local folder, a file or a Hub id) for stage hashes and caches: what the
target *is*, not where it lies (docs/reliability.md), and its name as it may leave the machine (:func:`target_name`).
Stdlib + formats.io only; no torch."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .formats.io import WEIGHT_SUFFIXES


def is_hub_id(spec: str) -> bool:
    """ORG/NAME that is not a local path (publish's base_model must be a Hub id; local targets come from provenance)."""
    return spec.count("/") == 1 and not spec.startswith((".", "/", "~")) and not Path(spec).exists()


_HF_SNAPSHOT = re.compile(r"models--(?P<org>[^/\\]+?)--(?P<name>[^/\\]+)[/\\]snapshots[/\\]")


@dataclass(frozen=True)
class TargetName:
    """How a target may be named where it leaves the machine (model card, provenance): never its local path.

    ``hub_id``: its Hub id when known (a Hub id given as such, a local folder whose config.json ``_name_or_path``
    is one, or a Hugging Face cache snapshot); ``name``: what to call it (the Hub id, else the local folder's own
    name); ``local``: the target was a local folder whose Hub id is not known."""

    name: str
    hub_id: str | None
    local: bool


def _hub_shaped(v: Any) -> bool:
    return (isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}", v) is not None
            and not Path(v).exists())


def target_name(target: str | None) -> TargetName | None:
    """The name of ``target`` (a Hub id or a local folder / GGUF file) without its machine path; None when there is
    nothing to name. A local folder: the Hub id its config.json records in ``_name_or_path`` (transformers writes
    the name the model was loaded from), or the Hub id of an HF cache snapshot, else the folder's own name."""
    if not isinstance(target, str) or not target.strip():
        return None
    if is_hub_id(target):
        return TargetName(target, target, False)
    p = Path(target).expanduser()
    m = _HF_SNAPSHOT.search(str(p.resolve()) if p.exists() else target)
    if m:
        hub = f"{m.group('org')}/{m.group('name')}"
        return TargetName(hub, hub, False)
    folder = p if p.is_dir() else p.parent if p.is_file() else None
    if folder is not None and (folder / "config.json").is_file():
        try:
            cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            cfg = {}
        got = cfg.get("_name_or_path") if isinstance(cfg, dict) else None
        if _hub_shaped(got):
            return TargetName(got, got, False)
    name = (p.resolve() if p.exists() else p).name if not p.is_file() else p.stem
    return TargetName(name, None, True) if name and name not in (".", "..") else None


def target_fingerprint(target: str, verify: bool = False) -> dict[str, Any]:
    """What identifies the target's content in the stage hashes (not its path): a local folder by its config and
    a weights fingerprint (safetensors headers + file sizes + mtimes; ``verify``: the sha256 of every weight
    file), a Hub id by its resolved revision (the cached snapshot's commit offline) and that snapshot's files."""
    import hashlib
    import struct

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
            from huggingface_hub import snapshot_download  # lazy: huggingface_hub stays out of inspect --target (a Hub id only)

            snap = Path(snapshot_download(target, local_files_only=True))
            return {"hub": target, "revision": snap.name, "snapshot": folder_print(snap)}
        except Exception:  # not in the cache: ask the Hub for the revision (online only)
            import os

            if os.environ.get("HF_HUB_OFFLINE", "0") in ("", "0"):
                try:
                    from huggingface_hub import HfApi  # lazy: as snapshot_download

                    return {"hub": target, "revision": HfApi().model_info(target).sha}
                except Exception:
                    pass
    return {"name": target}
