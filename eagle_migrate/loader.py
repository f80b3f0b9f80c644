"""The one way to get an :class:`EagleDrafter` with weights: from a checkpoint (any layout ``formats`` reads,
every quantized format ``quantize`` writes) or from canonical tensors already in memory.

* :func:`load_drafter` reads a checkpoint folder (or a :class:`~eagle_migrate.formats.Checkpoint`), dequantises
  compressed-tensors weights (fp8-dynamic, fp8, nvfp4a16, nvfp4) through the compressed-tensors library, and
  (``simulate_activations``) fake-quantizes each quantized Linear's input as vLLM's kernel does, so a quantized
  drafter computes in torch what it computes in vLLM;
* :func:`build_drafter` turns a canonical (vLLM-layout) state dict into the module.

Both build the module on the meta device and assign the tensors (``load_state_dict(assign=True)``: no second copy,
the embedding kept in its own dtype), share the target's embedding / head where vLLM does (no ``embed_tokens`` ->
the target's embedding; no ``lm_head`` -> the target's head when the vocabularies are the same), and fail on any
tensor left over or missing.

Layer 2 (above ``drafter``, ``formats`` and ``quant``, which it joins; none of them imports it). Imports: torch,
``errors``, ``drafter`` (config, model), ``formats`` (the reader), ``quant`` (dequantisation, the activation hook).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from .drafter.config import DrafterConfig
from .drafter.model import EagleDrafter
from .errors import CheckpointError, UnsupportedError
from .formats import read_checkpoint
from .quant import activation_hook, dequantize_state_dict, scheme_from_config

#: tensors a checkpoint may carry that the module has no place for, by design
_IGNORED = ("t2d",)


def build_drafter(
    cfg: DrafterConfig,
    tensors: Mapping[str, torch.Tensor],
    target: Any | None = None,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    allow_missing: Iterable[str] = (),
    what: str = "the drafter",
) -> EagleDrafter:
    """An EagleDrafter holding ``tensors`` (canonical names) on ``device``; floating tensors cast to ``dtype``,
    except ``embed_tokens.weight``, which keeps its dtype (rows are cast as they are looked up).

    ``target``: anything with ``embed_weight`` / ``lm_head_weight`` (:class:`eagle_migrate.target.Target`), used
    for the tensors the drafter does not ship. Names in ``allow_missing`` may stay unloaded (on the meta device,
    e.g. ``lm_head.weight`` when no logits are needed). ``what`` names the drafter in error messages.
    """
    with torch.device("meta"):
        m = EagleDrafter(cfg)
    sd: dict[str, torch.Tensor] = {}
    for n, t in tensors.items():
        if n in _IGNORED or (n == "d2t" and not cfg.uses_d2t):
            continue
        if n == "embed_tokens.weight" or not t.is_floating_point():
            sd[n] = t.to(device=device)
        else:
            sd[n] = t.to(device=device, dtype=dtype)
    if "embed_tokens.weight" not in sd and target is not None:
        sd["embed_tokens.weight"] = target.embed_weight.detach().to(device=device)
    if "lm_head.weight" not in sd and target is not None and cfg.draft_vocab_size == cfg.vocab_size:
        sd["lm_head.weight"] = target.lm_head_weight.detach().to(device=device, dtype=dtype)
    missing, unexpected = m.load_state_dict(sd, strict=False, assign=True)
    allowed = set(allow_missing)
    missing = [n for n in missing if n not in allowed]
    if unexpected or missing:
        hint = ""
        if "embed_tokens.weight" in missing or "lm_head.weight" in missing:
            hint = " (the drafter ships no embedding / head: pass the target to share its own)" if target is None else (
                " (the target's head cannot be shared: the draft vocabulary is smaller)")
        raise CheckpointError(f"{what}: weights do not fit the drafter module (missing {missing[:4]}, "
                              f"unexpected {unexpected[:4]}){hint}")
    m._inv_freq = m._inv_freq.to(device)  # computed in float32 on the CPU (drafter/model.py); never cast to dtype
    return m.eval()


def read_tensors(source: str | Path | Any) -> tuple[Any, dict[str, torch.Tensor], dict[str, Any] | None]:
    """``(checkpoint, dense canonical tensors, quantization_config or None)`` of a checkpoint folder or a
    :class:`~eagle_migrate.formats.Checkpoint`: quantized weights dequantised (float32) through the
    compressed-tensors library. Any quantization other than the compressed-tensors schemes ``quantize`` writes
    (fp8-dynamic, fp8, nvfp4a16, nvfp4) raises :class:`~eagle_migrate.errors.UnsupportedError`."""
    ck = source if hasattr(source, "canonical_names") else read_checkpoint(Path(source))
    names = [n for n in ck.canonical_names() if n not in _IGNORED]
    qc = (ck.raw_config or {}).get("quantization_config")
    if not ck.quantization and not qc:
        return ck, {n: ck.tensor(n) for n in names}, None
    if not (isinstance(qc, dict) and "config_groups" in qc and scheme_from_config(qc)):
        scheme = (ck.quantization or {}).get("scheme") if isinstance(ck.quantization, dict) else None
        raise UnsupportedError(f"{ck.path}: quantized ({scheme or 'unknown scheme'}) in a way eagle-migrate cannot read "
                               "back (it reads the compressed-tensors fp8-dynamic, fp8, nvfp4a16 and nvfp4 schemes it writes)",
                               "pass the unquantized drafter")
    raw = {n: ck.store.get(ck.name_map[n]) for n in names}  # as stored: packed weights and their scales
    return ck, dequantize_state_dict(raw, qc, torch.float32), qc


def load_drafter(
    source: str | Path | Any,
    target: Any | None = None,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    simulate_activations: bool = True,
) -> EagleDrafter:
    """The drafter of a checkpoint folder or a :class:`~eagle_migrate.formats.Checkpoint` (:func:`read_tensors`,
    then :func:`build_drafter`). For a quantized checkpoint, ``simulate_activations`` also fake-quantizes each
    quantized Linear's input as the scheme does in vLLM (a forward pre-hook through compressed-tensors), so the
    module computes what the quantized drafter computes there."""
    ck, tensors, qc = read_tensors(source)
    m = build_drafter(ck.config, tensors, target, device=device, dtype=dtype, what=str(ck.path))
    if qc is not None and simulate_activations:
        scheme = scheme_from_config(qc)
        modules = dict(m.named_modules())
        for p in sorted({n.rsplit(".", 1)[0] for n in ck.canonical_names() if n.endswith(".weight_scale")}):
            scales = {k: ck.store.get(ck.name_map[f"{p}.{k}"]) for k in ("input_scale", "input_global_scale") if ck.has(f"{p}.{k}")}
            hook = activation_hook(scheme, scales)
            if hook is not None:
                modules[p].register_forward_pre_hook(hook)
    return m
