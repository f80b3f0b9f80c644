"""Shared by the GPU drivers in benchmarks/gpu/ (see README.md there): the asset cache on the device machine, and
writing a drafter so that it comes back through $OUT (files of at most 16 MiB each, at most 8 files a call)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

OUT_FILE_LIMIT = 15 * 2**20  # the device tool returns files of at most 16 MiB

# The Python distributions of the device image ('cuda'), as /work/.library/device/KINDS.md lists them (read off a
# machine on 2026-11-17), and those prepare.py carries because the image lacks them. No vllm among them.
DEVICE_IMAGE_PACKAGES = frozenset({
    "absl-py", "accelerate", "aiofiles", "aiohappyeyeballs", "aiohttp", "aiosignal", "annotated-doc", "anyio",
    "attrs", "botorch", "build", "certifi", "charset-normalizer", "chex", "click", "cloudpickle", "cmake",
    "colorama", "contourpy", "coverage", "cuda-bindings", "cuda-core", "cuda-pathfinder", "cuda-toolkit",
    "cupy-cuda13x", "cycler", "cython", "diffrax", "e3nn", "einops", "equinox", "etils", "execnet", "filelock",
    "flatbuffers", "flax", "fonttools", "formulaic", "frozenlist", "fsspec", "gpytorch", "grpcio", "h11", "h5py",
    "hf-xet", "httpcore", "httpx", "huggingface-hub", "humanize", "hypothesis", "idna", "imageio", "iniconfig",
    "interface-meta", "jax", "jax-cuda13-pjrt", "jax-cuda13-plugin", "jaxlib", "jaxtyping", "jinja2", "joblib",
    "kiwisolver", "lazy-loader", "lightning", "lightning-utilities", "linear-operator", "lineax", "llvmlite", "lxml",
    "markdown", "markdown-it-py", "markupsafe", "matplotlib", "mdurl", "meson", "ml-dtypes", "mpi4py", "mpmath",
    "msgpack", "multidict", "multipledispatch", "mypy-extensions", "nanobind", "narwhals", "networkx", "ninja",
    "numba", "numba-cuda", "numpy", "numpyro", "nvidia-cublas", "nvidia-cuda-cupti", "nvidia-cuda-nvrtc",
    "nvidia-cuda-runtime", "nvidia-cudnn-cu13", "nvidia-cufft", "nvidia-cufile", "nvidia-curand", "nvidia-cusolver",
    "nvidia-cusparse", "nvidia-cusparselt-cu13", "nvidia-ml-py", "nvidia-nccl-cu13", "nvidia-nvjitlink",
    "nvidia-nvshmem-cu13", "nvidia-nvtx", "onnx", "onnx-ir", "onnxruntime", "onnxscript", "opencv-python-headless",
    "optax", "opt-einsum", "opt-einsum-fx", "optimistix", "orbax-checkpoint", "packaging", "pandas", "pathspec",
    "patsy", "peft", "pillow", "pip", "pluggy", "portalocker", "prometheus-client", "propcache", "protobuf",
    "psutil", "pyarrow", "pybind11", "py-cpuinfo", "pygments", "pyparsing", "pyproject-hooks", "pyre-extensions",
    "pytest", "pytest-benchmark", "pytest-cov", "pytest-mock", "pytest-timeout", "pytest-xdist", "python-dateutil",
    "pytorch-lightning", "pyyaml", "regex", "requests", "rich", "sacrebleu", "safetensors", "scikit-build-core",
    "scikit-image", "scikit-learn", "scipy", "seaborn", "sentencepiece", "sentence-transformers", "setuptools",
    "shellingham", "simplejson", "six", "sortedcontainers", "statsmodels", "sympy", "tabulate", "tensorboard",
    "tensorboard-data-server", "tensorstore", "threadpoolctl", "tifffile", "tiktoken", "timm", "tokenizers", "toolz",
    "torch", "torchaudio", "torchdiffeq", "torch-geometric", "torchmetrics", "torchvision", "tqdm", "transformers",
    "treescope", "triton", "typer", "typing-extensions", "typing-inspect", "urllib3", "uvloop", "wadler-lindig",
    "werkzeug", "wheel", "wrapt", "xarray", "xxhash", "yarl", "zipp",
})
CARRIED_PACKAGES = frozenset({"pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions",
                              "gguf"})


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


def tensor_sha256(t) -> str:
    """sha256 of a tensor's bytes (its dtype's own encoding, row-major)."""
    return hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def imported_by_us() -> dict[str, list[str]]:
    """Third-party top-level modules that eagle_migrate's and benchmarks/' own code imports (found in their sources)
    and that this process has imported, each with the installed distributions that provide it. Transitive imports
    of those packages are left out: the device image's own versions bring their own."""
    import ast
    from importlib.metadata import packages_distributions

    names: set[str] = set()
    for f in [*(ROOT / "eagle_migrate").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]:
        try:
            tree = ast.parse(f.read_text())
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name.partition(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.partition(".")[0])
    owners = packages_distributions()
    return {n: sorted(_norm(d) for d in owners.get(n, ())) for n in sorted(names)
            if n in sys.modules and n not in sys.stdlib_module_names and n in owners and n != "eagle_migrate"}


def missing_on_device() -> list[str]:
    """Modules imported by our code in this process that no distribution of the device image provides and
    prepare.py does not carry (must be empty: importing one fails there)."""
    have = {_norm(n) for n in DEVICE_IMAGE_PACKAGES | CARRIED_PACKAGES}
    return [m for m, dists in imported_by_us().items() if not have.intersection(dists)]


def cache_env() -> Path:
    """The asset cache the drivers use: $EAGLE_MIGRATE_CACHE (device_setup.sh sets /tmp/em/cache)."""
    root = Path(os.environ.get("EAGLE_MIGRATE_CACHE") or Path.home() / ".cache" / "eagle-migrate")
    return root
