"""Which tensors are quantized: the Linears vLLM builds with the drafter's quant_config, per family
(``Family.layer_linears``: every norm, a family's own included, is an RMSNorm vLLM keeps in 16 bits), and the groups
vLLM fuses (``Family.fused_linears``: they share one NVFP4 global scale). Names are checkpoint prefixes in the vLLM
layout (``layers.0.self_attn.q_proj``).

Imports: ``errors``, ``families``, ``drafter.config``, ``quant.schemes``.
"""

from __future__ import annotations

from collections.abc import Iterable

from .. import families
from ..drafter.config import DrafterConfig
from ..errors import CheckpointError, UnsupportedError
from .schemes import LM_HEAD


def linear_prefixes(cfg: DrafterConfig, names: Iterable[str], *, quantize_fc: bool = False,
                    quantize_lm_head: bool = False) -> list[str]:
    """Checkpoint prefixes of the Linears to quantize, in checkpoint order."""
    present = set(names)
    fam = families.find(cfg.architecture)
    if fam is None:
        raise UnsupportedError(f"{cfg.architecture} drafters are not supported by quantize")
    out = []
    for i in range(cfg.num_layers):
        out += [f"layers.{i}.{n}" for n in fam.layer_linears]
    if quantize_fc:
        out.insert(0, "fc")
    if quantize_lm_head:
        out.append(LM_HEAD)
    missing = [p for p in out if p + ".weight" not in present]
    if missing:
        raise CheckpointError(f"the drafter lacks {', '.join(m + '.weight' for m in missing[:4])}")
    return out


def fused_groups(cfg: DrafterConfig, prefixes: list[str]) -> list[list[str]]:
    """Layers vLLM fuses for this family (e.g. q/k/v -> qkv_proj, gate/up -> gate_up_proj): they share one NVFP4
    global scale."""
    fused = families.get(cfg.architecture).fused_linears
    groups: list[list[str]] = []
    seen: set[str] = set()
    for p in prefixes:
        if p in seen:
            continue
        g = [p]
        for first, members in fused.items():
            if p.endswith(first):
                base = p[: -len(members[0])]
                g = [base + x for x in members]
                break
        g = [x for x in g if x in prefixes]
        seen.update(g)
        groups.append(g)
    return groups
