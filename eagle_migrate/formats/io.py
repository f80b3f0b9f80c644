"""Safe, cheap reading of checkpoint files (writing outputs is :mod:`.output`'s).

* safetensors: memory-mapped through the safetensors library (it validates header length, JSON and offsets);
  listing names/shapes/dtypes reads only the headers.
* ``.bin``: only ``torch.load(weights_only=True)`` (memory-mapped when the file is a zip archive). A pickle that
  would run code is refused before anything runs.
* Sharded checkpoints through ``*.index.json`` (every shard must exist inside the folder).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import safe_open

from ..errors import CheckpointError, UnsafeInputError, a_an

if TYPE_CHECKING:  # torch is imported where tensors are made: reading headers (inspect) never imports it
    import numpy as np
    import torch

# safetensors dtype -> torch dtype name (``TensorInfo.dtype``; ``getattr(torch, name)`` is the dtype)
ST_DTYPE_NAMES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
    "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
}


def torch_dtype(st_dtype: str) -> torch.dtype:
    """The torch dtype of a safetensors dtype code (KeyError for one we do not read)."""
    import torch  # lazy: torch stays out of inspect (headers are read without it)

    return getattr(torch, ST_DTYPE_NAMES[st_dtype])


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
MAX_JSON_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without "torch.", e.g. "bfloat16"
    file: str  # file name relative to the checkpoint folder

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def resolve_inside(folder: Path, name: str) -> Path:
    """A file named by a checkpoint (index shard) must stay inside the checkpoint folder."""
    p = (folder / name)
    try:
        rp = p.resolve(strict=True)
    except FileNotFoundError:
        raise CheckpointError(f"{folder}: the index names '{name}', which does not exist", "the checkpoint is incomplete: copy the missing shard") from None
    except (RuntimeError, OSError) as e:  # symlink loops
        raise CheckpointError(f"{p}: cannot be resolved ({e.__class__.__name__}: {e})") from None
    if folder.resolve() not in rp.parents and rp != folder.resolve():
        raise CheckpointError(f"{folder}: the index names '{name}', which lies outside the checkpoint folder")
    return rp


def read_json(path: Path, what: str = "JSON file") -> Any:
    try:
        size = path.stat().st_size
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read {what} ({e.strerror or e})") from None
    if size > MAX_JSON_BYTES:
        raise CheckpointError(f"{path}: {what} is {size} bytes, larger than any real config")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except UnicodeDecodeError:
        raise CheckpointError(f"{path}: {what} is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: {what} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read {what} ({e.strerror or e})") from None


class TensorStore:
    """Lazy access to the tensors of one checkpoint folder (or single file)."""

    def __init__(self, root: Path, files: list[Path]):
        self.root = root
        self.files = files
        self.infos: dict[str, TensorInfo] = {}
        self._bin_cache: dict[Path, dict[str, torch.Tensor]] = {}
        self._where: dict[str, Path] = {}
        self._mmaps: dict[Path, Any] = {}
        for f in files:
            for info in self._scan(f):
                if info.name in self.infos:
                    raise CheckpointError(f"{f}: tensor '{info.name}' also appears in {self.infos[info.name].file}")
                self.infos[info.name] = info
                self._where[info.name] = f

    # -- scanning ---------------------------------------------------------------------------------------------
    def _scan(self, f: Path) -> list[TensorInfo]:
        rel = f.name
        if f.suffix == ".safetensors":
            try:
                out = []
                with safe_open(str(f), framework="numpy") as sf:  # headers only ("pt" would import torch)
                    for k in sf.keys():
                        sl = sf.get_slice(k)
                        st = sl.get_dtype()
                        out.append(TensorInfo(k, tuple(sl.get_shape()), ST_DTYPE_NAMES.get(st, st.lower()), rel))
                return out
            except CheckpointError:
                raise
            except Exception as e:  # SafetensorError and friends carry a precise reason
                raise CheckpointError(f"{f}: not a valid safetensors file ({_short(e)})") from None
        sd = self._load_bin(f)
        return [TensorInfo(k, tuple(v.shape), _dtype_name(v.dtype), rel) for k, v in sd.items()]

    def _load_bin(self, f: Path) -> dict[str, torch.Tensor]:
        if f in self._bin_cache:
            return self._bin_cache[f]
        sd = load_bin_safely(f)
        self._bin_cache[f] = sd
        return sd

    # -- access -----------------------------------------------------------------------------------------------
    def names(self) -> list[str]:
        return list(self.infos)

    def __contains__(self, name: str) -> bool:
        return name in self.infos

    def get(self, name: str) -> torch.Tensor:
        f = self._where.get(name)
        if f is None:
            raise CheckpointError(f"{self.root}: no tensor named '{name}'")
        if f.suffix == ".safetensors":
            try:
                with safe_open(str(f), framework="pt") as sf:
                    return sf.get_tensor(name)
            except Exception as e:
                raise CheckpointError(f"{f}: cannot read tensor '{name}' ({_short(e)})") from None
        return self._load_bin(f)[name]

    def mapped(self, name: str) -> torch.Tensor:
        """The tensor as a read-only view of the memory-mapped safetensors file (no copy: only the pages that are
        touched are read, e.g. the embedding rows of the tokens actually looked up). ``.bin`` files: :meth:`get`.
        Never write to the result."""
        f = self._where.get(name)
        if f is None:
            raise CheckpointError(f"{self.root}: no tensor named '{name}'")
        if f.suffix != ".safetensors":
            return self.get(name)
        import warnings

        import torch  # lazy: torch stays out of inspect (headers are read without it)

        mm, n, meta = self._raw(f, name)
        try:
            begin, end = meta["data_offsets"]
            dtype = torch_dtype(meta["dtype"])
            shape = tuple(meta["shape"])
            count = (end - begin) // torch.empty((), dtype=dtype).element_size()
            with warnings.catch_warnings():  # "the given buffer is not writable": it is read-only by design
                warnings.simplefilter("ignore", UserWarning)
                return torch.frombuffer(mm, dtype=dtype, count=count, offset=8 + n + begin).view(shape)
        except Exception as e:
            raise CheckpointError(f"{f}: cannot map tensor '{name}' ({_short(e)})") from None

    def _raw(self, f: Path, name: str) -> tuple[Any, int, dict[str, Any]]:
        """The memory map of safetensors file ``f``, its header length and the header entry of ``name``."""
        import mmap
        import struct

        mm = self._mmaps.get(f)
        if mm is None:
            with open(f, "rb") as fh:
                mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            self._mmaps[f] = mm
        try:
            (n,) = struct.unpack("<Q", mm[:8])
            return mm, n, json.loads(bytes(mm[8 : 8 + n]))[name]
        except Exception as e:
            raise CheckpointError(f"{f}: cannot map tensor '{name}' ({_short(e)})") from None

    def array(self, name: str) -> np.ndarray:
        """The tensor's values as a numpy array (a copy), without importing torch for safetensors: 16- and 8-bit
        floats are widened exactly to float32 (for value checks: NaN/Inf, ranges, equality). ``.bin``: via torch."""
        import numpy as np  # lazy: numpy only to read tensor values (hashing and header reads need none)

        f = self._where.get(name)
        if f is None:
            raise CheckpointError(f"{self.root}: no tensor named '{name}'")
        if f.suffix != ".safetensors":
            t = self.get(name)
            return (t.float() if t.is_floating_point() and t.dtype.itemsize <= 2 else t).numpy().copy()
        mm, n, meta = self._raw(f, name)
        try:
            begin, end = meta["data_offsets"]
            st, shape = meta["dtype"], tuple(meta["shape"])
            raw = np.frombuffer(mm, dtype=np.uint8, count=end - begin, offset=8 + n + begin)
            if st == "BF16":
                return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
            if st in ("F8_E4M3", "F8_E5M2"):
                return _float8_table(st)[raw].reshape(shape)
            if st == "F16":
                return raw.view("<f2").astype(np.float32).reshape(shape)
            return raw.view(_NUMPY_DTYPES[st]).reshape(shape).copy()
        except CheckpointError:
            raise
        except Exception as e:
            raise CheckpointError(f"{f}: cannot read tensor '{name}' ({_short(e)})") from None

    def iter_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """One tensor at a time (safetensors memory-mapped), for streaming conversions."""
        for name in self.infos:
            yield name, self.get(name)

    @property
    def total_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.files)


_NUMPY_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
                 "U8": "u1", "U16": "<u2", "U32": "<u4", "U64": "<u8", "BOOL": "?"}


def _float8_table(st: str) -> np.ndarray:
    """float32 value of each of the 256 float8 bit patterns: E4M3 (fn: no Inf, NaN = S.1111.111) or E5M2 (IEEE)."""
    import numpy as np  # lazy: numpy only to read tensor values (hashing and header reads need none)

    ebits, mbits, bias = (4, 3, 7) if st == "F8_E4M3" else (5, 2, 15)
    out = np.empty(256, dtype=np.float32)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b >> mbits) & ((1 << ebits) - 1), b & ((1 << mbits) - 1)
        if st == "F8_E4M3" and e == 15 and m == 7:
            v = float("nan")
        elif st == "F8_E5M2" and e == 31:
            v = float("inf") if m == 0 else float("nan")
        elif e == 0:
            v = m / (1 << mbits) * 2.0 ** (1 - bias)
        else:
            v = (1 + m / (1 << mbits)) * 2.0 ** (e - bias)
        out[b] = sign * v
    return out


def _short(e: Exception) -> str:
    s = str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__
    return s[:200]


def _unpickler_detail(full: str) -> str:
    """The one informative line of torch's long weights_only error."""
    lines = [ln.strip() for ln in full.splitlines() if ln.strip()]
    for ln in lines:
        if "GLOBAL" in ln:
            return ln
    if "WeightsUnpickler error:" in full:
        rest = [ln.strip() for ln in full.split("WeightsUnpickler error:", 1)[1].splitlines() if ln.strip()]
        if rest:
            return rest[0]
    for ln in lines:
        if not ln.startswith(("Weights only load failed", "Check the documentation", "Please file an issue")):
            return ln
    return ""


def torch_load_weights_only(f: Path | Any, **kw: Any) -> Any:
    """``torch.load(weights_only=True, map_location="cpu")`` without torch's "Detected pickle protocol N" warning: a
    legacy or hostile file is reported by our own one-line error, and a readable one needs no remark."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected pickle protocol")
        import torch  # lazy: torch stays out of inspect (headers are read without it)

        return torch.load(f, map_location="cpu", weights_only=True, **kw)


def load_bin_safely(f: Path) -> dict[str, torch.Tensor]:
    """``torch.load(weights_only=True)``; never plain unpickling. Returns a flat name -> tensor dict."""
    import torch  # lazy: torch stays out of inspect (headers are read without it)

    try:
        is_zip = zipfile.is_zipfile(f)
    except OSError as e:
        raise CheckpointError(f"{f}: cannot read ({e.strerror or e})") from None
    try:
        obj = torch_load_weights_only(f, mmap=is_zip)
    except pickle.UnpicklingError as e:
        full = str(e)
        # torch's message is long; the useful part follows "WeightsUnpickler error:"
        detail = _unpickler_detail(full) or _short(e)
        if "Unsupported global" in full or "GLOBAL" in full:
            raise UnsafeInputError(f"{f}: refusing to unpickle: the file would import and call Python code ({detail[:160]})") from None
        raise CheckpointError(f"{f}: not a readable PyTorch weights file ({detail[:160]})") from None
    except Exception as e:  # any other failure of a hostile or corrupt file is still "unreadable input"
        raise CheckpointError(f"{f}: not a readable PyTorch weights file ({e.__class__.__name__}: {_short(e)})") from None
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise CheckpointError(f"{f}: expected a dict of name -> tensor, found {type(obj).__name__}")
    for k, v in obj.items():
        if not isinstance(k, str) or not isinstance(v, torch.Tensor):
            raise CheckpointError(f"{f}: expected a dict of name -> tensor, but {k!r} holds {a_an(type(v).__name__)}")
    return obj


def weight_files(folder: Path) -> list[Path]:
    """The weight files of a checkpoint folder: an index's shards, else model.safetensors / pytorch_model.bin / any."""
    for idx_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        idx = folder / idx_name
        if idx.is_file():
            data = read_json(idx, "weight index")
            wm = data.get("weight_map") if isinstance(data, dict) else None
            if not isinstance(wm, dict) or not wm or not all(isinstance(v, str) for v in wm.values()):
                raise CheckpointError(f"{idx}: no usable 'weight_map' (expected {{tensor name: shard file}})")
            return [resolve_inside(folder, name) for name in sorted(set(wm.values()))]
    for name in ("model.safetensors", "pytorch_model.bin"):
        p = folder / name
        if p.exists():
            return [resolve_inside(folder, name)]
    found = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors",) and p.is_file())
    if not found:
        found = sorted(p for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth") and p.is_file())
    return [resolve_inside(folder, p.name) for p in found]


def open_checkpoint_path(path: Path) -> tuple[Path, list[Path], dict[str, Any] | None]:
    """Validate a checkpoint path and return (folder, weight files, config.json dict or None)."""
    path = Path(path)
    try:
        exists = path.exists()
        if path.is_symlink() and not exists:
            path.resolve(strict=True)
    except (RuntimeError, OSError) as e:
        raise CheckpointError(f"{path}: cannot be resolved ({_short(e)})", "a symbolic link points to itself or nowhere") from None
    if not exists:
        raise CheckpointError(f"{path}: no such file or folder", "check the path")
    if path.is_file():
        folder, files = path.parent, [path]
        if path.suffix not in WEIGHT_SUFFIXES:
            raise CheckpointError(f"{path}: not a weights file (expected .safetensors or .bin)")
    else:
        folder = path
        try:
            files = weight_files(folder)
        except PermissionError as e:
            raise CheckpointError(f"{path}: cannot be read ({e.strerror})") from None
        if not files:
            raise CheckpointError(
                f"{path}: no weight files (model.safetensors, *.safetensors or pytorch_model.bin)",
                "point at the folder that holds the drafter's weights and config.json",
            )
    cfg = None
    cfg_path = folder / "config.json"
    if cfg_path.exists():
        cfg = read_json(cfg_path, "config.json")
        if not isinstance(cfg, dict):
            raise CheckpointError(f"{cfg_path}: expected a JSON object, found {type(cfg).__name__}")
    return folder, files, cfg


def sha256_files(files: list[Path], chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            while b := fh.read(chunk):
                h.update(b)
    return h.hexdigest()
