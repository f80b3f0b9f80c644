"""EAGLE-1/2 drafters as SafeAILab runs them (``cnets1.py``), for one purpose: measuring how closely the converted
EAGLE-3.1 drafter drafts like its EAGLE-2 source (convert's agreement). vLLM does not run EAGLE-2 drafters; every
other stage uses :class:`eagle_migrate.drafter.model.EagleDrafter`. The layers are that module's (the family's
attention, MLP, norms, rope); only the EAGLE-2 wiring differs. Imports: torch, :mod:`eagle_migrate.drafter.model`,
families, errors."""

from __future__ import annotations

import torch
from torch import nn

from .. import families
from ..errors import InputError
from ..families.layers import RMSNorm
from .config import DrafterConfig
from .model import MLP, KVCache
from .rope import rope_cos_sin, rope_inv_freq


class Eagle2Reference(nn.Module):
    """EAGLE-1/2: ``z = fc(cat(embed(tok), f)) (+ bias)``; layer 0 has no input_layernorm; no final norm; logits =
    target ``lm_head(h)``; ``h`` is fed back as the next ``f``."""

    def __init__(self, cfg: DrafterConfig, tensors: dict[str, torch.Tensor], lm_head: torch.Tensor, device: str, dtype: torch.dtype):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.fc = nn.Linear(2 * h, h, bias="fc.bias" in tensors)
        self.layers = nn.ModuleList()
        for i in range(cfg.num_layers):
            layer = nn.Module()
            layer.self_attn = families.get(cfg.architecture).attention(cfg, h)
            layer.mlp = MLP(cfg)
            layer.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
            if i > 0:
                layer.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
            self.layers.append(layer)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        sd = {n: t for n, t in tensors.items() if n.startswith(("fc.", "layers.", "embed_tokens."))}
        missing, unexpected = self.load_state_dict(sd, strict=False)
        if unexpected or [m for m in missing if not m.endswith("bias")]:
            raise InputError(f"EAGLE-2 weights do not fit: missing {missing[:4]}, unexpected {unexpected[:4]}")
        self.register_buffer("lm_head", lm_head.to(dtype), persistent=False)
        inv, scale = rope_inv_freq(cfg)
        self.register_buffer("_inv_freq", inv, persistent=False)
        self._rope_scale = scale
        self.to(device=device, dtype=dtype)
        self._inv_freq = inv.to(device)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(self._inv_freq, self._rope_scale, positions, dtype)

    def forward_step(self, input_ids: torch.Tensor, f: torch.Tensor, positions: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        e = self.embed_tokens(input_ids).to(f.dtype)
        x = self.fc(torch.cat([e, f], dim=-1))
        cos, sin = self.rope(positions, x.dtype)
        t = input_ids.shape[1]
        mask = None
        if t > 1:
            past = cache.length if cache is not None else 0
            q_idx = torch.arange(t, device=x.device).unsqueeze(1) + past
            mask = (torch.arange(past + t, device=x.device).unsqueeze(0) <= q_idx)[None, None]
        residual = None
        out = x
        for i, layer in enumerate(self.layers):
            if i == 0:
                residual = x
                inp = x
            else:
                residual = out + residual
                inp = layer.input_layernorm(residual)
            a, _, _ = layer.self_attn(inp, cos, sin, mask, cache, i)
            residual = a + residual
            out = layer.mlp(layer.post_attention_layernorm(residual))
        return out + residual

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.lm_head.T
