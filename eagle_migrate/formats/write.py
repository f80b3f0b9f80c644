"""``write_checkpoint``: a Checkpoint (any layout we read) or a DrafterConfig + canonical tensors, written as the
vLLM layout (default) or the speculators layout, atomically (temporary sibling folder renamed into place).

vLLM emit checklist (docs/formats.md): the family's ``vllm_arch`` + ``model_type`` (eagle_migrate/families/); real
``num_hidden_layers``; 3.1 flags top level + every ``fc_norm.{i}.weight``; no ``model.`` prefix; ``d2t`` iff
Vd != V; never ``t2d``; own ``lm_head``; ``embed_tokens`` when H != Ht; aux ids at the top level and in
``eagle_config`` (+ ``num_aux_hidden_states`` when K != 3); ``norm_before_residual`` as trained.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import torch

from .. import __version__, families
from ..drafter.config import DrafterConfig
from ..errors import InputError, UnsupportedError
from .base import Checkpoint
from .common import QUANT_SUFFIXES, carried_mark
from .output import atomic_output_dir, save_safetensors, write_json
from .speculators import speculators_config_dict
from .vllm import vllm_config_dict, vllm_tensor_names

OutLayout = Literal["vllm", "speculators"]


def _is_quant_aux(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in QUANT_SUFFIXES and not name.endswith(".weight")


def prepare_tensors(
    cfg: DrafterConfig,
    tensors: dict[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
    *,
    dtype: torch.dtype | None,
    keep_t2d: bool,
    quantized: bool,
) -> dict[str, torch.Tensor]:
    """Canonical tensors -> what goes on disk: d2t int64 iff Vd != V, t2d bool (speculators, Vd != V) or dropped,
    floating tensors cast to ``dtype`` (quantized checkpoints keep every dtype), nothing missing."""
    items = tensors.items() if isinstance(tensors, dict) else tensors
    sd: dict[str, torch.Tensor] = {}
    for name, t in items:
        if name.startswith("model."):
            raise InputError(f"tensor '{name}' is not a canonical name (strip the 'model.' prefix first)")
        if name == "t2d":
            if keep_t2d and cfg.uses_d2t:
                sd[name] = t.to(torch.bool)
            continue
        if name == "d2t":
            if cfg.uses_d2t:
                sd[name] = t.to(torch.int64)
            continue
        if quantized and (_is_quant_aux(name) or not t.is_floating_point() or t.dtype.itemsize < 2):
            sd[name] = t
            continue
        if dtype is not None and t.is_floating_point() and t.dtype.itemsize >= 2:
            t = t.to(dtype)
        sd[name] = t
    if keep_t2d and cfg.uses_d2t and "t2d" not in sd and "d2t" in sd:
        d2t = sd["d2t"]
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[torch.arange(d2t.numel()) + d2t] = True
        sd["t2d"] = t2d
    if cfg.attention_bias and families.get(cfg.architecture).o_proj_has_bias(cfg):  # none on disk means zeros
        for i in range(cfg.num_layers):
            ob, ow = f"layers.{i}.self_attn.o_proj.bias", f"layers.{i}.self_attn.o_proj.weight"
            if ob not in sd and ow in sd and sd[ow].is_floating_point():
                sd[ob] = torch.zeros(sd[ow].shape[0], dtype=sd[ow].dtype)
    need = vllm_tensor_names(cfg)
    missing = []
    for n in need:
        if n in sd:
            continue
        if n == "embed_tokens.weight" and cfg.hidden_size == cfg.target_hidden_size:
            continue
        if n == "lm_head.weight" and not cfg.has_lm_head and cfg.draft_vocab_size == cfg.vocab_size:
            continue
        if n.endswith(".weight") and n[: -len(".weight")] + ".weight_packed" in sd:
            continue
        missing.append(n)
    if missing:
        raise InputError(f"cannot write the drafter without {', '.join(missing)}", "the source checkpoint is incomplete")
    return sd


def write_vllm(
    cfg: DrafterConfig,
    tensors: dict[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
    out: Path,
    *,
    dtype: torch.dtype | None = torch.bfloat16,
    metadata: dict[str, str] | None = None,
    extra_config: dict[str, Any] | None = None,
) -> list[str]:
    """Write config.json + model.safetensors into ``out`` (an existing, empty folder). Returns tensor names.

    Floating tensors are cast to ``dtype`` (None keeps them); ``d2t`` is int64; ``t2d`` is dropped.
    """
    try:
        sd = prepare_tensors(cfg, tensors, dtype=dtype, keep_t2d=False, quantized=False)
    except Exception as e:  # InputError from an incomplete tensor set
        raise ValueError(str(e)) from None
    meta = {"format": "pt", "producer": f"eagle-migrate {__version__}"}
    meta.update(metadata or {})
    save_safetensors(sd, out / "model.safetensors", meta)
    d = vllm_config_dict(cfg, extra_config)
    if dtype is not None:
        d["torch_dtype"] = str(dtype).removeprefix("torch.")
    write_json(out / "config.json", d)
    return list(sd)


def ensure_convertible(ck: Checkpoint | DrafterConfig) -> None:
    """Raise UnsupportedError for what conversion paths cannot handle (an unknown family, or what the family's
    vLLM drafter cannot load: ``Family.check_convertible``). EAGLE-1/2 passes: converting it is exactly what
    ``convert`` does."""
    cfg = ck.config if isinstance(ck, Checkpoint) else ck
    where = f"{ck.path}: " if isinstance(ck, Checkpoint) else ""
    fam = families.find(cfg.architecture)
    if fam is None:
        raise UnsupportedError(f"{where}{cfg.architecture.upper()} drafter: no drafter family of that name "
                               f"(families: {', '.join(families.names())}), so eagle-migrate cannot convert it")
    fam.check_convertible(cfg, where)


def write_checkpoint(
    src: Checkpoint | DrafterConfig,
    out: Path | str,
    layout: OutLayout = "vllm",
    tensors: dict[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]] | None = None,
    *,
    dtype: torch.dtype | None | Literal["keep"] = "keep",
    force: bool = False,
    verifier: str | None = None,
    verifier_architectures: list[str] | None = None,
    num_speculative_tokens: int = 3,
    extra_config: dict[str, Any] | None = None,
    metadata: dict[str, str] | None = None,
) -> Path:
    """Write ``src`` into the new folder ``out`` (atomically; an existing ``out`` only with ``force``).

    ``src`` is a Checkpoint from ``read_checkpoint`` (its tensors are read lazily, one file at a time) or a
    DrafterConfig with ``tensors`` under canonical names. ``dtype``: ``"keep"`` keeps the stored dtypes (default),
    None likewise, or a torch dtype for the floating tensors. Quantized checkpoints are copied as they are, their
    ``quantization_config`` included. Raises UnsupportedError for what the family's vLLM drafter cannot load (or
    a layout the family has none of) and EAGLE-1/2 weights (convert those first).
    """
    if dtype == "keep":
        dtype = None
    inputs: list[Path] = []
    quant_cfg = None
    if isinstance(src, Checkpoint):
        cfg = src.config
        if tensors is None:
            tensors = ((n, src.tensor(n)) for n in src.name_map)
        inputs = [src.path]
        if src.quantization and isinstance((src.raw_config or {}).get("quantization_config"), dict):
            quant_cfg = src.raw_config["quantization_config"]
        if verifier is None and isinstance(src.meta.get("verifier"), dict):
            verifier = src.meta["verifier"].get("name_or_path")
            verifier_architectures = verifier_architectures or src.meta["verifier"].get("architectures")
        if src.quantization and quant_cfg is None:
            raise UnsupportedError(f"{src.path}: quantized with {src.quantization.get('scheme')}, which eagle-migrate cannot re-emit",
                                   "start from the unquantized drafter")
    else:
        cfg = src
        if tensors is None:
            raise InputError("write_checkpoint(DrafterConfig, ...) needs tensors")
    ensure_convertible(src)
    if cfg.generation != "eagle3":
        raise UnsupportedError("EAGLE-1/2 weights have no EAGLE-3 layout; convert them with `eagle-migrate convert` first")
    aux = src.aux if isinstance(src, Checkpoint) else None
    mark = carried_mark(aux)
    if mark and sorted(cfg.aux_layer_ids or []) != sorted(aux.stored):
        # an undecided reading is carried verbatim (and marked so), never laundered into ids of another convention
        raise InputError(f"{src.path}: aux layer ids {aux.stored} can be read two ways (vLLM ids or output-of-layer) and are "
                         f"undecided; writing {cfg.aux_layer_ids} would pick one",
                         "decide first: eagle_migrate.formats.aux_ids.resolve + apply (or convert with --target / --aux-ids-convention)")
    if layout not in ("vllm", "speculators"):
        raise InputError(f"unknown output layout '{layout}' (vllm or speculators)")
    refusal = families.get(cfg.architecture).speculators_refusal
    if layout == "speculators" and refusal:
        raise UnsupportedError(*refusal)
    sd = prepare_tensors(cfg, tensors, dtype=dtype, keep_t2d=(layout == "speculators"), quantized=quant_cfg is not None)
    extra = dict(extra_config or {})
    if mark:  # our fingerprint without the claim that the ids are vLLM's (formats.common.our_fingerprint)
        extra["eagle_migrate"] = {"version": __version__, **(extra.get("eagle_migrate") or {}), **mark}
    if quant_cfg is not None:
        extra.setdefault("quantization_config", quant_cfg)
    with atomic_output_dir(Path(out), force=force, inputs=inputs) as tmp:
        if layout == "vllm":
            meta = {"format": "pt", "producer": f"eagle-migrate {__version__}"}
            meta.update(metadata or {})
            save_safetensors(sd, tmp / "model.safetensors", meta)
            d = vllm_config_dict(cfg, extra)
            d["torch_dtype"] = _dtype_label(sd, dtype)
            write_json(tmp / "config.json", d)
        else:
            write_speculators_files(cfg, sd, tmp, verifier=verifier, verifier_architectures=verifier_architectures,
                                    num_speculative_tokens=num_speculative_tokens, dtype=_torch_dtype(sd, dtype),
                                    metadata=metadata, extra_config=extra)
    return Path(out)


def _torch_dtype(sd: dict[str, torch.Tensor], dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return dtype
    for n in ("fc.weight", "norm.weight", "layers.0.post_attention_layernorm.weight"):
        if n in sd and sd[n].is_floating_point() and sd[n].dtype.itemsize >= 2:
            return sd[n].dtype
    return torch.float32


def _dtype_label(sd: dict[str, torch.Tensor], dtype: torch.dtype | None) -> str:
    return str(_torch_dtype(sd, dtype)).removeprefix("torch.")


def write_speculators_files(
    cfg: DrafterConfig,
    sd: dict[str, torch.Tensor],
    out: Path,
    *,
    verifier: str | None = None,
    verifier_architectures: list[str] | None = None,
    num_speculative_tokens: int = 3,
    dtype: torch.dtype | None,
    metadata: dict[str, str] | None = None,
    extra_config: dict[str, Any] | None = None,
) -> list[str]:
    """config.json + model.safetensors into the (existing, empty) folder ``out``; ``sd`` already checked/cast."""
    meta = {"format": "pt", "producer": f"eagle-migrate {__version__}"}
    meta.update(metadata or {})
    save_safetensors(sd, out / "model.safetensors", meta)
    write_json(out / "config.json", speculators_config_dict(
        cfg, verifier=verifier, verifier_architectures=verifier_architectures,
        num_speculative_tokens=num_speculative_tokens, dtype=dtype, extra=extra_config))
    return list(sd)
