"""The torch pieces every family's attention is built from, as vLLM computes them: RMSNorm (``forward_native``), the
two rope rotations (rotate-half / neox and interleaved / DeepSeek), the KV append, and the Llama layer's grouped-query
attention (``llama_eagle3.py``), which other families extend or replace.

Imports torch: the family modules and ``drafter/model.py`` import it only where a module is built (never on
``inspect``'s path). Parameter names are the canonical (vLLM-layout) checkpoint names.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """RMSNorm as vLLM's ``forward_native``: normalise in fp32, cast back, then scale by the weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.to(dtype) * self.weight.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """vLLM's rope with ``is_neox_style=False`` (DeepSeek): pairs (x[2i], x[2i+1]) rotate by frequency i.
    ``cos`` / ``sin`` are the neox-layout tables [.., d] (two copies of the d/2 frequencies)."""
    half = x.shape[-1] // 2
    c, s = cos[..., :half], sin[..., :half]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)


def with_past(k: torch.Tensor, v: torch.Tensor, layer: int, cache: Any,
              extra_kv: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """This step's keys/values [B, heads, T, d] appended to the cache (``drafter.model.KVCache``, when given), then
    preceded by ``extra_kv``."""
    if cache is not None:
        k, v = cache.update(layer, k, v)
    if extra_kv is not None:
        k = torch.cat([extra_kv[0], k], dim=2)
        v = torch.cat([extra_kv[1], v], dim=2)
    return k, v


class Attention(nn.Module):
    """The Llama layer's attention (vLLM's LlamaAttention): q/k/v/o projections, grouped-query heads, neox rope.
    Families that add to it override :meth:`norm_qk` (what happens to queries and keys before rope)."""

    def __init__(self, cfg: Any, in_features: int, o_bias: bool):
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(in_features, self.nh * self.hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(in_features, self.nkv * self.hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(in_features, self.nkv * self.hd, bias=cfg.attention_bias)
        # vLLM's LlamaAttention gives o_proj a bias whenever attention_bias is set; checkpoints that carry only
        # q/k/v biases (Qwen2-style) mean a zero o_proj bias, so it starts at zero here and is written as zeros.
        # (``o_bias``: the family's rule, Family.o_proj_has_bias.)
        self.o_proj = nn.Linear(self.nh * self.hd, cfg.hidden_size, bias=o_bias)
        if o_bias:
            nn.init.zeros_(self.o_proj.bias)
            self.register_load_state_dict_pre_hook(self._zero_o_proj_bias)

    def _zero_o_proj_bias(self, module, state_dict, prefix, *args) -> None:
        """A state dict without ``o_proj.bias`` (q/k/v biases only) means a zero o_proj bias, as written on disk."""
        w = state_dict.get(prefix + "o_proj.weight")
        if prefix + "o_proj.bias" not in state_dict and w is not None:
            state_dict[prefix + "o_proj.bias"] = torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)

    def norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries and keys [B, heads, T, hd] before rope: unchanged in the Llama layer."""
        return q, k

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        cache: Any,
        layer: int,
        want_probs: bool = False,
        extra_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, torch.Tensor]]:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        q, k = self.norm_qk(q, k)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [B,1,T,hd]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        new_kv = (k, v)
        k, v = with_past(k, v, layer, cache, extra_kv)
        rep = self.nh // self.nkv
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        probs = None
        if want_probs:
            scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(self.hd)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            probs = scores.softmax(-1)
            out = (probs @ v.float()).to(q.dtype)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / math.sqrt(self.hd))
        out = out.transpose(1, 2).reshape(b, t, self.nh * self.hd)
        return self.o_proj(out), probs, new_kv
