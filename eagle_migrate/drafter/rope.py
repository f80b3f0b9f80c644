"""The drafter's rope math, as vLLM's ``get_rope`` computes it (vllm/model_executor/layers/rotary_embedding): the
rope parameters vLLM reads from the config, inverse frequencies and the cos/sin scale per rope type (default,
linear, dynamic, yarn, llama3, longrope) over the width the family rotates, and the cos/sin tables. A family whose
vLLM attention runs its own rope type says which of these it is (``Family.rope``, ``Family.rope_dim``); the
rotations themselves (rotate-half / neox, interleaved) are the family's attention's (``families/layers.py``).
Imports: torch, ``families``, ``drafter.config``.
"""

from __future__ import annotations

import math

import torch

from .. import families
from ..families import rope_parameters_of
from .config import DrafterConfig


#: the rope types the drafter computes, each as vLLM's ``get_rope`` does (vllm/model_executor/layers/rotary_embedding)
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")


def rope_parameters(cfg: DrafterConfig) -> dict:
    """The drafter's rope parameters as vLLM sees them (:func:`eagle_migrate.drafter.config.rope_parameters_of`)."""
    return rope_parameters_of(cfg.rope_scaling, cfg.rope_theta, cfg.max_position_embeddings)


def rope_inv_freq(cfg: DrafterConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies ``[head_dim/2]`` (float32, on the CPU whatever the ambient device: the drafter is often
    built under ``torch.device("meta")``) and the cos/sin scale (YaRN's and LongRoPE's attention factor), the
    numbers vLLM's rotary embedding for the same config uses (``get_rope``; compared in tests/unit/test_rope.py).

    * ``linear``: vLLM divides the positions by ``factor``; here the frequencies are (same up to float rounding).
    * ``dynamic``: vLLM's static NTK base ``theta * (factor * max_pos / max_trained_positions - (factor - 1)) **
      (d / (d - 2))`` (= theta when ``max_trained_positions`` is absent), or ``theta * alpha ** (d / (d - 2))``.
    * ``longrope``: vLLM uses the long factors when its ``max_model_len`` exceeds
      ``original_max_position_embeddings``; its default ``max_model_len`` is the model's ``max_position_embeddings``,
      which is what decides here (a server started with a smaller ``--max-model-len`` uses the short factors).
    * a family whose vLLM attention runs its own rope (``Family.rope``) gives the parameters of the type above it
      amounts to, over its rotated width (``Family.rope_dim``); its module says which vLLM class that is.
    """
    fam = families.get(cfg.architecture)
    rp = fam.rope(cfg, rope_parameters(cfg))
    rope_type = rp["rope_type"]
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope type {rope_type!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
    d = fam.rope_dim(cfg)  # the rotated width
    base = float(rp["rope_theta"])
    max_pos = cfg.max_position_embeddings
    with torch.device("cpu"):
        exps = torch.arange(0, d, 2, dtype=torch.float32, device="cpu") / d

        def plain(b: float) -> torch.Tensor:
            return 1.0 / (b ** exps)

        scale = 1.0
        if rope_type == "default":
            inv = plain(base)
        elif rope_type == "linear":
            inv = plain(base) / float(rp["factor"])
        elif rope_type == "dynamic":
            if "alpha" in rp:
                inv = plain(base * float(rp["alpha"]) ** (d / (d - 2)))
            else:
                factor = float(rp["factor"])
                trained = rp.get("max_trained_positions", max_pos)
                inv = plain(base * (factor * max_pos / trained - (factor - 1)) ** (d / (d - 2)))
        elif rope_type == "llama3":
            factor, lo, hi = float(rp["factor"]), float(rp["low_freq_factor"]), float(rp["high_freq_factor"])
            orig = rp["original_max_position_embeddings"]
            inv0 = plain(base)
            wave = 2 * math.pi / inv0
            smooth = (orig / wave - lo) / (hi - lo) if lo != hi else 0
            mid = (1 - smooth) * inv0 / factor + smooth * inv0
            inv = torch.where(wave < orig / hi, inv0, torch.where(wave > orig / lo, inv0 / factor, mid))
        elif rope_type == "yarn":  # YaRNScalingRotaryEmbedding
            factor = float(rp["factor"])
            orig = rp["original_max_position_embeddings"]
            beta_fast, beta_slow = rp.get("beta_fast", 32), rp.get("beta_slow", 1)
            pos = base ** exps

            def corr(rot: float) -> float:
                return (d * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

            low, high = corr(beta_fast), corr(beta_slow)
            if rp.get("truncate", True):
                low, high = math.floor(low), math.ceil(high)
            low, high = max(low, 0), min(high, d - 1)
            if low == high:
                high += 0.001
            ramp = torch.clamp((torch.arange(d // 2, dtype=torch.float32, device="cpu") - low) / (high - low), 0, 1)
            keep = 1 - ramp  # 1 = extrapolate (high frequencies kept), 0 = interpolate (divided by factor)
            inv = (1.0 / (factor * pos)) * (1 - keep) + (1.0 / pos) * keep

            def mscale(s: float, m: float = 1.0) -> float:
                return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

            if rp.get("attention_factor") is not None:
                scale = float(rp["attention_factor"])
            elif rp.get("mscale") and rp.get("mscale_all_dim"):
                scale = float(mscale(factor, rp["mscale"]) / mscale(factor, rp["mscale_all_dim"]))
            else:
                scale = float(mscale(factor))
        else:  # longrope
            orig = rp["original_max_position_embeddings"]
            long = max_pos > orig
            factors = torch.tensor(rp["long_factor" if long else "short_factor"], dtype=torch.float32, device="cpu")
            inv = 1.0 / (factors * (base ** exps))
            ratio = max_pos / orig
            default = 1.0 if ratio <= 1.0 else math.sqrt(1 + math.log(ratio) / math.log(orig))
            chosen = rp.get("long_mscale" if long else "short_mscale")
            scale = float(chosen) if chosen is not None else default
    return inv.float(), float(scale)


def rope_cos_sin(inv_freq: torch.Tensor, scale: float, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin ``[B, T, head_dim]`` (rotate-half layout) for ``positions`` from :func:`rope_inv_freq`'s numbers."""
    freqs = positions.float().unsqueeze(-1) * inv_freq  # [B,T,hd/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)
