"""The EAGLE-3 / EAGLE-3.1 drafter as vLLM runs it (vLLM's EAGLE-3 drafter models, one per family), in plain torch:
the generic EAGLE-3 decoder layer around the family's attention
(``families.get(cfg.architecture).attention``: eagle_migrate/families/).

Parameter names are the canonical (vLLM-layout) checkpoint names, so ``load_state_dict`` takes a vLLM-layout
state dict as is: ``fc.weight``, ``fc_norm.{k}.weight``, ``input_norm.weight``, ``layers.{i}.self_attn.q_proj.weight``,
``layers.{i}.hidden_norm.weight``, the family's own attention tensors, ``norm.weight``, ``lm_head.weight``, ``embed_tokens.weight`` and the ``d2t`` buffer.

Math (docs/architecture.md):
  g = fc(fc_norm(input_norm(cat(a_1..a_K))))                     # step 0 only
  layer 0: attn_in = cat(input_layernorm(embed(tok)), hidden_norm(g)); residual = g | hidden_norm(g)
           r = attn(attn_in) + residual; out = mlp(post_attention_layernorm(r)); (out, r)
  layer i>0: r = out + r; x = input_layernorm(r); r = attn(x) + r; out = mlp(post_attention_layernorm(r))
  h_pre = out + r; h_post = norm(h_pre); logits = lm_head(h_post)
  fed back to step j+1: h_post if norm_output else h_pre (it replaces g; fc is skipped)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .. import families
from ..families.layers import RMSNorm
from .config import DrafterConfig
from .rope import rope_cos_sin, rope_inv_freq


@dataclass
class KVCache:
    """Per-layer keys/values, [B, n_kv, T, hd], appended step by step during drafting."""

    keys: list[torch.Tensor | None] = field(default_factory=list)
    values: list[torch.Tensor | None] = field(default_factory=list)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        while len(self.keys) <= layer:
            self.keys.append(None)
            self.values.append(None)
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v

    @property
    def length(self) -> int:
        return 0 if not self.keys or self.keys[0] is None else self.keys[0].shape[2]


class MLP(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig, index: int):
        super().__init__()
        self.index = index
        h = cfg.hidden_size
        self.self_attn = families.get(cfg.architecture).attention(cfg, 2 * h if index == 0 else h)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        if index == 0:
            self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.norm_before_residual = cfg.norm_before_residual


@dataclass
class StepOutput:
    """One drafter forward over T positions."""

    h_post: torch.Tensor  # [B,T,H] what lm_head sees
    h_feed: torch.Tensor  # [B,T,H] what the next draft step receives in place of g
    attn_probs: list[torch.Tensor] | None = None  # per layer [B,nh,T,S] when asked for
    new_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # per layer, this call's rotated keys/values


class EagleDrafter(nn.Module):
    """EAGLE-3 / EAGLE-3.1 drafter; ``cfg.generation`` must be ``eagle3``."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        if cfg.generation != "eagle3":
            raise ValueError("EagleDrafter runs EAGLE-3 style drafters; convert EAGLE-2 weights first")
        self.cfg = cfg
        kht = cfg.num_aux * cfg.target_hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        if cfg.norm_before_fc:
            self.input_norm = RMSNorm(kht, cfg.rms_norm_eps)
        if cfg.fc_norm:
            self.fc_norm = nn.ModuleList([RMSNorm(cfg.target_hidden_size, cfg.rms_norm_eps) for _ in range(cfg.num_aux)])
        self.fc = nn.Linear(kht, cfg.hidden_size, bias=cfg.fc_bias)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i) for i in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        if cfg.uses_d2t:
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        inv, scale = rope_inv_freq(cfg)
        self.register_buffer("_inv_freq", inv, persistent=False)
        self._rope_scale = scale

    # ----- pieces -------------------------------------------------------------------------------------------
    def combine(self, aux: torch.Tensor) -> torch.Tensor:
        """[.., K*Ht] target aux states -> [.., H] (input_norm, then fc_norm per chunk, then fc)."""
        x = aux
        if self.cfg.norm_before_fc:
            x = self.input_norm(x)
        if self.cfg.fc_norm:
            chunks = x.chunk(self.cfg.num_aux, dim=-1)
            x = torch.cat([n(c) for n, c in zip(self.fc_norm, chunks)], dim=-1)
        return self.fc(x.to(self.fc.weight.dtype) if self.fc.weight.dtype.is_floating_point else x)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(self._inv_freq, self._rope_scale, positions, dtype)

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids] if self.cfg.uses_d2t else draft_ids

    def logits(self, h_post: torch.Tensor) -> torch.Tensor:
        return self.lm_head(h_post)

    # ----- one forward ---------------------------------------------------------------------------------------
    def _masks(self, t: int, past: int, extra: int, always: bool, device: torch.device) -> list[torch.Tensor | None]:
        """Per layer, the [1, 1, T, S] attend-mask of T new queries over S = extra + past + T keys (None: attend to
        every key, the one-query step). Causal; on a sliding-window layer (``cfg.layer_window``) a query at key index
        q sees keys q-W+1..q, as vLLM's attention backends run ``sliding_window`` W (window (W-1, 0)); key indices are
        positions less the first one, the cache holding one entry per position from there."""
        s = extra + past + t
        q_idx = torch.arange(t, device=device).unsqueeze(1) + past + extra
        k_idx = torch.arange(s, device=device).unsqueeze(0)
        causal = (k_idx <= q_idx)[None, None] if t > 1 or always else None
        out: list[torch.Tensor | None] = []
        windowed: dict[int, torch.Tensor] = {}
        for i in range(len(self.layers)):
            w = self.cfg.layer_window(i)
            if w is None or s <= w:  # the last query (index s-1) sees all s keys: the window hides nothing
                out.append(causal)
                continue
            if w not in windowed:
                windowed[w] = ((k_idx <= q_idx) & (k_idx > q_idx - w))[None, None]
            out.append(windowed[w])
        return out

    def forward_step(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache | None = None,
        mask: torch.Tensor | None = None,
        want_probs: bool = False,
        extra_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> StepOutput:
        """Run the decoder over T positions.

        ``hidden`` is g (= ``combine(aux)``) at step 0 or the fed-back state at later steps. With ``cache`` the
        keys/values are appended and every query sees the whole cache (causal inside the new block), or on a
        sliding-window layer only its last W keys (:meth:`_masks`); ``mask`` ([B or 1, 1, T, S] bool, True = attend)
        overrides that for every layer (no window is added to it). ``extra_kv`` are keys/values placed before the
        cache/new ones (used by the unrolled training forward).
        """
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)
        cos, sin = self.rope(positions, hidden.dtype)
        masks = [mask] * len(self.layers)
        if mask is None:
            masks = self._masks(input_ids.shape[1], cache.length if cache is not None else 0,
                                extra_kv[0][0].shape[2] if extra_kv else 0, extra_kv is not None, hidden.device)
        probs_all: list[torch.Tensor] = []
        new_kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        out = hidden
        residual: torch.Tensor | None = None
        for i, layer in enumerate(self.layers):
            if i == 0:
                e = layer.input_layernorm(embeds)
                hn = layer.hidden_norm(hidden)
                residual = hn if layer.norm_before_residual else hidden
                x = torch.cat([e, hn], dim=-1)
            else:
                residual = out + residual
                x = layer.input_layernorm(residual)
            a, p, kv = layer.self_attn(
                x, cos, sin, masks[i], cache, i, want_probs, extra_kv[i] if extra_kv is not None else None
            )
            new_kv.append(kv)
            if p is not None:
                probs_all.append(p)
            residual = a + residual
            out = layer.mlp(layer.post_attention_layernorm(residual))
        h_pre = out + residual
        h_post = self.norm(h_pre)
        return StepOutput(
            h_post=h_post,
            h_feed=h_post if self.cfg.norm_output else h_pre,
            attn_probs=probs_all if want_probs else None,
            new_kv=new_kv,
        )

    # ----- chain drafting, as vLLM's EAGLE proposer does it --------------------------------------------------
    @torch.no_grad()
    def draft(
        self,
        input_ids: torch.Tensor,
        aux_hidden: torch.Tensor,
        num_tokens: int,
        start_position: int = 0,
    ) -> torch.Tensor:
        """Greedy chain of ``num_tokens`` draft tokens (target ids), [B, num_tokens].

        ``input_ids`` [B, n+1]: the context x_0..x_n where x_n is the token the target just produced;
        ``aux_hidden`` [B, n, K*Ht]: target aux states at positions 0..n-1. Step 0 pairs token x_{i+1} with
        the target state at position i; step j >= 1 feeds the drafted token at position n-1+j with the previous
        step's fed-back state.
        """
        cache = KVCache()
        drafts, _ = self.draft_with_cache(input_ids, aux_hidden, num_tokens, cache, start_position)
        return drafts

    @torch.no_grad()
    def draft_with_cache(
        self,
        input_ids: torch.Tensor,
        aux_hidden: torch.Tensor,
        num_tokens: int,
        cache: KVCache,
        start_position: int = 0,
        want_probs: bool = False,
    ) -> tuple[torch.Tensor, list[StepOutput]]:
        b, n1 = input_ids.shape
        n = n1 - 1
        if aux_hidden.shape[1] != n:
            raise ValueError(f"aux_hidden covers {aux_hidden.shape[1]} positions, expected {n}")
        g = self.combine(aux_hidden)
        pos = torch.arange(start_position, start_position + n, device=g.device).expand(b, n)
        outs = [self.forward_step(input_ids[:, 1:], g, pos, cache=cache, want_probs=want_probs)]
        feed = outs[-1].h_feed[:, -1:]
        last = outs[-1].h_post[:, -1:]
        drafts = []
        for j in range(num_tokens):
            d = self.to_target_ids(self.logits(last).argmax(-1))  # [B,1]
            drafts.append(d)
            if j == num_tokens - 1:
                break
            p = torch.full((b, 1), start_position + n + j, device=g.device, dtype=torch.long)
            o = self.forward_step(d, feed, p, cache=cache, want_probs=want_probs)
            outs.append(o)
            feed, last = o.h_feed, o.h_post
        return torch.cat(drafts, dim=1), outs
