"""The numerics of one tensor, through compressed-tensors (it quantizes, packs and unpacks; nothing here re-derives
its math): FP8 / NVFP4 weights and scales, static input scales, decompression, and the error of a round trip.

What is stored (shared/reference quant-formats.md §2-§4): FP8 ``weight`` (float8_e4m3fn) + ``weight_scale`` (+
``input_scale`` for static FP8); NVFP4 ``weight_packed`` (uint8, two E2M1 codes per byte, low nibble first) +
``weight_scale`` (float8 [out, in/16]) + ``weight_global_scale`` (fp32 [1], a divisor) (+ ``input_global_scale``
for W4A4). No zero points.

Imports: torch, ``errors``, ``quant.registry``, ``quant.schemes`` (compressed-tensors lazily).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable

import torch

from ..errors import UnsupportedError
from .registry import SchemeConfig, get_scheme
from .schemes import NVFP4_GROUP


def scale_dtype(source_dtype: torch.dtype) -> torch.dtype:
    """FP8 scales are stored in the weight dtype for bf16 checkpoints (what llm-compressor writes), fp32 otherwise."""
    return torch.bfloat16 if source_dtype == torch.bfloat16 else torch.float32


@contextlib.contextmanager
def eager():
    """compressed-tensors 0.17 wraps its FP4 rounding in torch.compile (needs a C compiler, ~20 s): run it eagerly."""
    try:
        ctx = torch.compiler.set_stance("force_eager")
    except (AttributeError, TypeError):  # older torch
        ctx = contextlib.nullcontext()
    with ctx:
        yield


def _amax_scale(amax: torch.Tensor, args) -> torch.Tensor:
    from compressed_tensors.quantization.utils import calculate_qparams  # lazy: compressed-tensors imports transformers (seconds)

    scale, _ = calculate_qparams(-amax, amax, args)
    return scale


def _compressor(s):
    from compressed_tensors.compressors.base import BaseCompressor  # lazy: compressed-tensors imports transformers (seconds)

    return BaseCompressor.get_value_from_registry(s.format)


def fp8_weight(w: torch.Tensor, scheme: str | SchemeConfig, source_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """FP8 ``weight`` + ``weight_scale`` of one Linear (per channel or per tensor, as the scheme's weight strategy)."""
    s = get_scheme(scheme).ct_scheme()
    w32 = w.detach().float()
    amax = w32.abs().amax(dim=1, keepdim=True) if s.weights.strategy == "channel" else w32.abs().amax()
    scale = _amax_scale(amax, s.weights).to(scale_dtype(source_dtype))
    out = _compressor(s).compress({"weight": w32, "weight_scale": scale}, s)
    return {"weight": out["weight"], "weight_scale": out["weight_scale"]}


def nvfp4_global_scale(ws: Iterable[torch.Tensor]) -> torch.Tensor:
    """One global scale (2688 / amax, fp32 [1]) over all given weights (a fused group)."""
    from compressed_tensors.quantization.utils import generate_gparam  # lazy: compressed-tensors imports transformers (seconds)

    amax = torch.stack([w.detach().float().abs().amax() for w in ws]).amax()
    return generate_gparam(-amax, amax)


def nvfp4_weight(w: torch.Tensor, global_scale: torch.Tensor) -> dict[str, torch.Tensor]:
    """NVFP4 ``weight_packed`` / ``weight_scale`` / ``weight_global_scale`` of one Linear."""
    from compressed_tensors.quantization.utils import calculate_qparams  # lazy: compressed-tensors imports transformers (seconds)

    out_f, in_f = w.shape
    if in_f % NVFP4_GROUP:
        raise UnsupportedError(f"NVFP4 needs in_features divisible by {NVFP4_GROUP}; a weight has shape {list(w.shape)}",
                               "use --scheme fp8-dynamic for this drafter")
    s = get_scheme("nvfp4a16").ct_scheme()
    w32 = w.detach().float()
    g = w32.view(out_f, in_f // NVFP4_GROUP, NVFP4_GROUP)
    scale, _ = calculate_qparams(g.amin(-1), g.amax(-1), s.weights, global_scale=global_scale)
    with eager():
        out = _compressor(s).compress({"weight": w32, "weight_scale": scale, "weight_global_scale": global_scale}, s)
    return {
        "weight_packed": out["weight_packed"],
        "weight_scale": out["weight_scale"],
        "weight_global_scale": out["weight_global_scale"].to(torch.float32).reshape(1).clone(),
    }


def fp8_input_scale(amax: float, args, source_dtype: torch.dtype) -> torch.Tensor:
    """Static FP8 ``input_scale`` = amax / 448 for the input-activation ``args`` (scale dtype of the checkpoint, [1])."""
    a = torch.tensor(float(amax), dtype=torch.float32)
    return _amax_scale(a, args).reshape(1).to(scale_dtype(source_dtype))


def nvfp4_input_global_scale(amax: float) -> torch.Tensor:
    """NVFP4 ``input_global_scale`` = 2688 / amax (a divisor, fp32 [1])."""
    from compressed_tensors.quantization.utils import generate_gparam  # lazy: compressed-tensors imports transformers (seconds)

    a = torch.tensor(float(amax), dtype=torch.float32)
    return generate_gparam(-a, a).to(torch.float32).reshape(1)


def decompress_layer(local: dict[str, torch.Tensor], scheme: str | SchemeConfig) -> torch.Tensor:
    """The dequantized weight of one Linear, through compressed-tensors' own decompression (fp32)."""
    s = get_scheme(scheme).ct_scheme()
    sd = dict(local)
    if s.format == "float-quantized":
        sd["weight_scale"] = sd["weight_scale"].float()
    out = _compressor(s).decompress(sd, s)
    return out["weight"].float()


def err_stats(w: torch.Tensor, dq: torch.Tensor) -> tuple[float | None, float, float]:
    """(SQNR in dB or None when exact, max |error|, relative Frobenius error) of ``dq`` against ``w``."""
    w = w.detach().float()
    e = (w - dq).double()
    num = float((w.double() ** 2).sum())
    den = float((e**2).sum())
    sqnr = None if den == 0 else (10 * math.log10(num / den) if num > 0 else -math.inf)
    rel = math.sqrt(den / num) if num > 0 else (0.0 if den == 0 else math.inf)
    return (None if sqnr is None else round(sqnr, 3)), float(e.abs().max()) if e.numel() else 0.0, rel


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
