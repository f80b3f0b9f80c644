"""Writing outputs without losing data: output folders, the one atomic file writer and the one safetensors writer.

* Outputs go to a temporary sibling folder and are renamed into place at the end (the rename refuses an existing
  path, so of two concurrent writers the second fails); an existing output is replaced only with ``force`` and only
  when eagle-migrate wrote it (:func:`is_our_output`); an output that is, contains or lies inside an input is
  refused, ``force`` or not (:func:`check_no_overlap`). See docs/reliability.md.
* A single file that must never be seen half-written (manifests, caches, reports, training state) goes through
  :func:`atomic_file` (temporary sibling, fsync, ``os.replace``).
* Safetensors are written with a deterministic header (:func:`save_safetensors`): same tensors, same bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..errors import InputError, OutputExistsError, redact
from .io import MAX_JSON_BYTES, ST_DTYPE_NAMES, torch_dtype

if TYPE_CHECKING:  # torch is imported where tensors are written
    import torch  # lazy: torch only to write tensors (folders and JSON files need none)

# ----- one file, atomically ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """The one atomic file writer: yields a temporary path beside ``path``; when the block ends without an error the
    file written there is fsynced and renamed over ``path`` (a reader sees the old file or the whole new one, never
    half of it), otherwise it is removed."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}"
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all (:func:`atomic_file`)."""
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


# ----- outputs ---------------------------------------------------------------------------------------------------
def _safetensors_producer(f: Path) -> str | None:
    """The ``producer`` of a safetensors file's header metadata (reads only the header)."""
    import struct

    try:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > MAX_JSON_BYTES:
                return None
            meta = json.loads(fh.read(n)).get("__metadata__") or {}
    except (OSError, ValueError, struct.error, AttributeError):
        return None
    return meta.get("producer") if isinstance(meta, dict) else None


def is_our_output(folder: Path) -> bool:
    """True when ``folder`` was written by eagle-migrate: it is a migrate run folder (our manifest) or one of its
    stage folders, or it carries our provenance.json, or its weights name eagle-migrate as their producer."""
    folder = Path(folder)
    if (folder / "migrate-manifest.json").is_file() or (folder.parent / "migrate-manifest.json").is_file():
        return True
    try:
        prov = json.loads((folder / "provenance.json").read_text(encoding="utf-8"))
        if isinstance(prov, dict) and (prov.get("tool") == "eagle-migrate" or isinstance(prov.get("publish"), dict)):
            return True
    except (OSError, ValueError):
        pass
    try:
        weights = sorted(folder.glob("*.safetensors"))
    except OSError:
        return False
    return bool(weights) and all(str(_safetensors_producer(f) or "").startswith("eagle-migrate") for f in weights)


def _resolved(p: Path) -> Path:
    try:
        return Path(p).expanduser().resolve()
    except (RuntimeError, OSError):
        return Path(os.path.abspath(Path(p).expanduser()))


def check_no_overlap(out: Path, inputs: list[Any] = (), what: str = "output") -> None:
    """Refuse an output that equals, contains or lies inside any input (symlinks resolved), whatever ``--force``.
    ``inputs`` may hold hub ids, data specs or None: only values naming an existing local path count."""
    ro = _resolved(out)
    for i in inputs:
        if not isinstance(i, (str, os.PathLike)) or str(i) == "":
            continue
        ri = _resolved(Path(i))
        if not (ri.exists() or Path(i).is_symlink()):
            continue  # a hub id or a path that does not exist: nothing of the user's to destroy
        if ro == ri or ri in ro.parents or ro in ri.parents:
            rel = "is" if ro == ri else ("lies inside" if ri in ro.parents else "contains")
            raise InputError(
                f"{what} {out} overlaps the input {i} (it {rel} it): refusing (an input is never replaced, even with --force)",
                "choose an output folder outside every input (drafter, target, data, hidden states)",
            )


def check_output_dir(out: Path, force: bool, inputs: list[Any] = ()) -> None:
    """Before any work: ``out`` overlaps no input; it does not exist, or (with ``force``) it is a folder this tool
    wrote (or an empty one); its parent can be created and written."""
    out = Path(out)
    check_no_overlap(out, list(inputs))
    if out.is_symlink() or out.exists():
        if not force:
            raise OutputExistsError(f"{out} already exists")
        if not out.is_dir() or out.is_symlink():
            raise InputError(f"{out} exists and is not a folder", "choose another -o")
        if any(out.iterdir()) and not is_our_output(out):
            raise OutputExistsError(
                f"{out} is a non-empty folder that eagle-migrate did not write: --force replaces only its own outputs",
                "choose another -o (or empty that folder yourself)",
            )
    check_writable_parent(out)


def check_writable_parent(out: Path) -> None:
    """The nearest existing ancestor of ``out`` must be a writable folder (exit 2 before any work, not after)."""
    out = Path(out)
    anc = _resolved(out).parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir() or not os.access(anc, os.W_OK | os.X_OK):
        raise InputError(f"cannot write the output {out}: {anc} is not a writable folder", "choose an -o in a folder you can write")
    # /proc, /sys and other pseudo file systems pass os.access for root: try it for real
    try:
        probe = anc / f".eagle-migrate-probe-{os.getpid()}-{threading.get_ident()}"
        probe.mkdir()
        probe.rmdir()
    except OSError as e:
        raise InputError(f"cannot write the output {out}: {anc} refuses new folders ({e.strerror or e})",
                         "choose an -o in a folder you can write") from None


def _rename_noreplace(src: Path, dst: Path) -> None:
    """``rename(src, dst)`` that fails with FileExistsError when ``dst`` exists, checked by the kernel at rename
    time (``renameat2(RENAME_NOREPLACE)`` on Linux; elsewhere a check just before a rename that cannot replace a
    non-empty folder)."""
    import ctypes
    import errno
    import sys

    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fn = libc.renameat2
        except (OSError, AttributeError):
            fn = None
        if fn is not None:
            at_fdcwd, rename_noreplace = -100, 1
            rc = fn(at_fdcwd, os.fsencode(str(src)), at_fdcwd, os.fsencode(str(dst)), rename_noreplace)
            if rc == 0:
                return
            err = ctypes.get_errno()
            if err == errno.EEXIST:
                raise FileExistsError(err, os.strerror(err), str(dst))
            if err not in (errno.ENOSYS, errno.EINVAL):
                raise OSError(err, os.strerror(err), str(dst))
    if dst.exists() or dst.is_symlink():
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
    os.rename(src, dst)


@contextlib.contextmanager
def atomic_output_dir(out: Path, force: bool = False, inputs: list[Any] = ()) -> Iterator[Path]:
    """Yield a temporary sibling folder; rename it to ``out`` when the block succeeds, delete it otherwise.

    The checks of :func:`check_output_dir` run before and again at rename time: when another process created
    ``out`` meanwhile, this one fails (exit 2) without touching it, unless ``force`` and ``out`` is ours."""
    import uuid

    out = Path(out)
    check_output_dir(out, force, list(inputs))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
        _commit(tmp, out, force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _commit(tmp: Path, out: Path, force: bool) -> None:
    import uuid

    lost = OutputExistsError(
        f"{out} was created by another process while this one ran: nothing of this run was written there",
        "run again with another -o (or --force to replace that output)",
    )
    try:
        _rename_noreplace(tmp, out)
        return
    except FileExistsError:
        if not force:
            raise lost from None
    # force: ``out`` exists now; replace it only when it is a folder this tool wrote (checked again now)
    if out.is_symlink() or not out.is_dir() or (any(out.iterdir()) and not is_our_output(out)):
        raise OutputExistsError(f"{out} is not a folder eagle-migrate wrote: --force replaces only its own outputs",
                                "choose another -o") from None
    old = out.parent / f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.replace(out, old)
    try:
        _rename_noreplace(tmp, out)
    except FileExistsError:
        shutil.rmtree(old, ignore_errors=True)  # ours, replaced on request; the other process's output stays
        raise lost from None
    shutil.rmtree(old, ignore_errors=True)


def _no_url_credentials(v: Any) -> Any:
    if isinstance(v, str):
        return redact(v, tokens=False)
    if isinstance(v, dict):
        return {k: _no_url_credentials(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_no_url_credentials(x) for x in v]
    return v


def write_json(path: Path, data: Any) -> None:
    """JSON file; ``user:password@`` in any URL it holds is written as ``***@``."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(_no_url_credentials(data), f, indent=2, sort_keys=False)
        f.write("\n")




@dataclass
class PlannedTensor:
    """One tensor of a safetensors file written by :func:`write_safetensors_streaming`: ``make`` produces it when
    its turn comes (it is cast to ``dtype`` and must have ``shape``)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    make: Callable[[], torch.Tensor]


def write_safetensors_streaming(path: Path, plan: list[PlannedTensor], metadata: dict[str, str] | None) -> None:
    """The one safetensors writer: header first (keys and ``__metadata__`` in a fixed order), then each tensor made,
    cast and written one at a time (peak memory: the largest tensor and its cast), in ``plan``'s order."""
    import math
    import struct

    import torch  # lazy: torch only to write tensors (folders and JSON files need none)

    _ST_NAMES = {torch_dtype(k): k for k in ST_DTYPE_NAMES}
    header: dict[str, Any] = {"__metadata__": {str(k): str(v) for k, v in sorted(metadata.items())}} if metadata else {}
    off = 0
    for p in plan:
        if p.dtype not in _ST_NAMES:
            raise ValueError(f"cannot write {p.name}: dtype {p.dtype} has no safetensors name")
        n = math.prod(p.shape) * torch.empty((), dtype=p.dtype).element_size()
        header[p.name] = {"dtype": _ST_NAMES[p.dtype], "shape": list(p.shape), "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for p in plan:
            t = p.make()
            if tuple(t.shape) != tuple(p.shape):
                raise RuntimeError(f"internal: {p.name} has shape {tuple(t.shape)}, planned {p.shape}")
            t = t.detach().to("cpu", p.dtype).contiguous()
            if t.numel():
                f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
            del t


def save_safetensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """A safetensors file whose bytes depend only on the tensors and metadata: header keys sorted (the
    safetensors library writes ``__metadata__`` in hash-map order, different in every process), tensors laid out
    by alignment then name (as the library does), so identical inputs give identical sha256 (resume checks and
    Hub deduplication rely on it)."""
    if metadata is None:  # ours unless the caller says otherwise (``is_our_output`` reads it)

        metadata = {"format": "pt", "producer": f"eagle-migrate {__version__}"}
    items = sorted(((n, t.detach().to("cpu").contiguous()) for n, t in tensors.items()),
                   key=lambda kv: (-kv[1].element_size(), kv[0]))
    write_safetensors_streaming(path, [PlannedTensor(n, tuple(t.shape), t.dtype, (lambda t=t: t)) for n, t in items],
                                metadata)
