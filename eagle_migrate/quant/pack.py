"""A drafter's state dict, quantized and back: every targeted Linear packed by its scheme's handler (other tensors
pass through) with the error and bytes of each layer, and the dense weights of a quantized state dict.

Imports: torch, pydantic, ``errors``, ``drafter.config``, ``quant.registry`` / ``schemes`` / ``numerics`` / ``linears``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from pydantic import BaseModel, Field

from ..drafter.config import DrafterConfig
from ..errors import InputError, UnsupportedError
from .linears import fused_groups, linear_prefixes
from .numerics import decompress_layer, err_stats, nbytes
from .registry import SchemeConfig, get_scheme, handler_for
from .schemes import SchemeName, scheme_from_config

# what a quantized Linear stores besides its bias
STORED_SUFFIXES = ("weight", "weight_packed", "weight_scale", "weight_global_scale", "input_scale", "input_global_scale")


class LayerReport(BaseModel):
    """One quantized Linear: error of the dequantized weight against the original, and its bytes."""

    name: str = Field(..., description="checkpoint prefix, e.g. layers.0.self_attn.q_proj")
    shape: list[int] = Field(..., description="[out, in] of the weight")
    sqnr_db: float | None = Field(..., description="10 log10(|W|^2 / |W - deq(Q(W))|^2); null when the weight is represented exactly")
    max_abs_error: float = Field(..., description="max |W - deq(Q(W))|")
    rel_error: float = Field(..., description="|W - deq(Q(W))| / |W| (Frobenius)")
    bytes_before: int = Field(..., description="bytes of the layer's tensors in the source")
    bytes_after: int = Field(..., description="bytes of the layer's tensors in the output (weights and scales)")
    weight_global_scale: float | None = Field(None, description="NVFP4 global scale (shared within q/k/v and gate/up)")
    activation_amax: float | None = Field(None, description="calibrated max |input| (static schemes)")
    input_scale: float | None = Field(None, description="FP8 static input_scale, or NVFP4 input_global_scale")


def quantize_state_dict(
    sd: dict[str, torch.Tensor],
    cfg: DrafterConfig,
    scheme: SchemeName | SchemeConfig,
    *,
    activation_amax: dict[str, float] | None = None,
    quantize_fc: bool = False,
    quantize_lm_head: bool = False,
    progress: Callable[[str], None] | None = None,
) -> tuple[dict[str, torch.Tensor], list[LayerReport]]:
    """Quantize every targeted Linear of a canonical (vLLM-layout) state dict; other tensors pass through."""
    spec = get_scheme(scheme)
    handler = handler_for(spec)
    prefixes = linear_prefixes(cfg, sd, quantize_fc=quantize_fc, quantize_lm_head=quantize_lm_head)
    if spec.calibrated:
        missing = [p for p in prefixes if not activation_amax or p not in activation_amax]
        if missing:
            raise InputError(f"scheme {spec.name} needs activation statistics for {', '.join(missing[:3])}",
                             "pass --target (and --data) so activations can be calibrated")
    quantized_names = {p + ".weight" for p in prefixes}
    out = {name: t for name, t in sd.items() if name not in quantized_names}
    reports: dict[str, LayerReport] = {}
    for group in fused_groups(cfg, prefixes):
        if progress:
            for p in group:
                progress(f"quantizing {p}")
        packed, gs = handler.pack_group(spec, {p: sd[p + ".weight"] for p in group})
        for p in group:
            w, local = sd[p + ".weight"], packed[p]
            amax = in_scale = None
            if spec.calibrated:
                amax = float(activation_amax[p])
                got = handler.input_scale(spec, amax, w.dtype)
                if got is not None:
                    local[got[0]] = got[1]
                    in_scale = float(got[1].float())
            sqnr, maxerr, rel = err_stats(w, decompress_layer(local, spec))
            bias = nbytes(sd[p + ".bias"]) if p + ".bias" in sd else 0
            for k, v in local.items():
                out[f"{p}.{k}"] = v.contiguous()
            reports[p] = LayerReport(
                name=p, shape=list(w.shape), sqnr_db=sqnr, max_abs_error=maxerr, rel_error=rel,
                bytes_before=nbytes(w) + bias, bytes_after=sum(nbytes(v) for v in local.values()) + bias,
                weight_global_scale=None if gs is None else float(gs), activation_amax=amax, input_scale=in_scale,
            )
    return out, [reports[p] for p in prefixes]


def dequantize_state_dict(sd: dict[str, torch.Tensor], qc: dict[str, Any], dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Dense weights of a quantized drafter state dict, through compressed-tensors' decompression."""
    scheme = scheme_from_config(qc)
    if scheme is None:
        raise UnsupportedError("this quantization_config is not one eagle-migrate writes (fp8-dynamic, fp8, nvfp4a16, nvfp4)")
    prefixes = sorted({n.rsplit(".", 1)[0] for n in sd if n.endswith(".weight_scale")})
    pset = set(prefixes)
    out = {}
    for n, t in sd.items():
        p, _, suffix = n.rpartition(".")
        if p in pset and suffix in STORED_SUFFIXES:
            continue
        out[n] = t
    for p in prefixes:
        local = {k: sd[f"{p}.{k}"] for k in ("weight", "weight_packed", "weight_scale", "weight_global_scale") if f"{p}.{k}" in sd}
        out[p + ".weight"] = decompress_layer(local, scheme).to(dtype)
    return out
