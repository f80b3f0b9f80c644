"""Which tensors are quantized: the Linears vLLM builds with the drafter's quant_config, per family, and the groups
vLLM fuses (they share one NVFP4 global scale). Names are checkpoint prefixes in the vLLM layout
(``layers.0.self_attn.q_proj``).

Imports: ``errors``, ``drafter.config``, ``quant.schemes``.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..drafter.config import DrafterConfig
from ..errors import CheckpointError, UnsupportedError
from .schemes import LM_HEAD

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

# vLLM's fused Linears: the first member's suffix -> every member's suffix
_FUSED = {
    "self_attn.q_proj": ("q_proj", "k_proj", "v_proj"),  # qkv_proj
    "self_attn.q_a_proj": ("q_a_proj", "kv_a_proj_with_mqa"),  # MLA: fused_qkv_a_proj
    "mlp.gate_proj": ("gate_proj", "up_proj"),  # gate_up_proj
}


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
        g = [p]
        for first, members in _FUSED.items():
            if p.endswith(first):
                base = p[: -len(members[0])]
                g = [base + x for x in members]
                break
        g = [x for x in g if x in prefixes]
        seen.update(g)
        groups.append(g)
    return groups
