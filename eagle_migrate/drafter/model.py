"""The EAGLE-3 / EAGLE-3.1 drafter as vLLM runs it (``vllm/model_executor/models/llama_eagle3.py`` and, for
``cfg.architecture == "qwen3"``, ``qwen3_eagle3.py``: the same layer with per-head ``q_norm`` / ``k_norm``
[head_dim] RMSNorms on queries and keys before rope and no o_proj bias; for ``cfg.architecture == "mla"``,
``deepseek_eagle3.py``: the same decoder layer around DeepseekV2MLAAttention, see ``MLAAttention``), in plain torch.

Parameter names are the canonical (vLLM-layout) checkpoint names, so ``load_state_dict`` takes a vLLM-layout
state dict as is: ``fc.weight``, ``fc_norm.{k}.weight``, ``input_norm.weight``, ``layers.{i}.self_attn.q_proj.weight``,
``layers.{i}.hidden_norm.weight``, ``layers.{i}.self_attn.q_norm.weight`` (Qwen3), ``norm.weight``, ``lm_head.weight``, ``embed_tokens.weight`` and the ``d2t`` buffer.

Math (docs/architecture.md):
  g = fc(fc_norm(input_norm(cat(a_1..a_K))))                     # step 0 only
  layer 0: attn_in = cat(input_layernorm(embed(tok)), hidden_norm(g)); residual = g | hidden_norm(g)
           r = attn(attn_in) + residual; out = mlp(post_attention_layernorm(r)); (out, r)
  layer i>0: r = out + r; x = input_layernorm(r); r = attn(x) + r; out = mlp(post_attention_layernorm(r))
  h_pre = out + r; h_post = norm(h_pre); logits = lm_head(h_post)
  fed back to step j+1: h_post if norm_output else h_pre (it replaces g; fc is skipped)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .config import DrafterConfig
from .rope import mla_softmax_scale, rope_cos_sin, rope_interleaved, rope_inv_freq, rotate_half


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


def o_proj_has_bias(cfg: DrafterConfig) -> bool:
    """vLLM's Llama attention has an o_proj bias iff ``attention_bias``; its Qwen3 attention never has one."""
    return cfg.attention_bias and not cfg.qk_norm


class Attention(nn.Module):
    def __init__(self, cfg: DrafterConfig, in_features: int):
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(in_features, self.nh * self.hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(in_features, self.nkv * self.hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(in_features, self.nkv * self.hd, bias=cfg.attention_bias)
        # vLLM's LlamaAttention gives o_proj a bias whenever attention_bias is set; checkpoints that carry only
        # q/k/v biases (Qwen2-style) mean a zero o_proj bias, so it starts at zero here and is written as zeros.
        # vLLM's Qwen3Attention never has an o_proj bias.
        o_bias = o_proj_has_bias(cfg)
        self.o_proj = nn.Linear(self.nh * self.hd, cfg.hidden_size, bias=o_bias)
        if o_bias:
            nn.init.zeros_(self.o_proj.bias)
            self.register_load_state_dict_pre_hook(self._zero_o_proj_bias)
        # Qwen3: per-head RMSNorm [head_dim] on queries and keys, before rope (vLLM's Qwen3Attention.forward)
        self.qk_norm = cfg.qk_norm
        if self.qk_norm:
            self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps)

    def _zero_o_proj_bias(self, module, state_dict, prefix, *args) -> None:
        """A state dict without ``o_proj.bias`` (q/k/v biases only) means a zero o_proj bias, as written on disk."""
        w = state_dict.get(prefix + "o_proj.weight")
        if prefix + "o_proj.bias" not in state_dict and w is not None:
            state_dict[prefix + "o_proj.bias"] = torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        cache: KVCache | None,
        layer: int,
        want_probs: bool = False,
        extra_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, torch.Tensor]]:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [B,1,T,hd]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        new_kv = (k, v)
        k, v = _with_past(k, v, layer, cache, extra_kv)
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


def _with_past(k: torch.Tensor, v: torch.Tensor, layer: int, cache: KVCache | None,
               extra_kv: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """This step's keys/values [B, heads, T, d] appended to the cache (when given), then preceded by ``extra_kv``."""
    if cache is not None:
        k, v = cache.update(layer, k, v)
    if extra_kv is not None:
        k = torch.cat([extra_kv[0], k], dim=2)
        v = torch.cat([extra_kv[1], v], dim=2)
    return k, v


class MLAAttention(nn.Module):
    """Multi-head latent attention as vLLM's DeepseekV2MLAAttention computes it (``layers/mla.py``), unabsorbed:

      q = q_b_proj(q_a_layernorm(q_a_proj(x)))  (or q_proj(x) without q_lora)  -> per head [nope | rope]
      [c | k_pe] = kv_a_proj_with_mqa(x);  [k_nope | v] per head = kv_b_proj(kv_a_layernorm(c))
      rope (interleaved) on q's rope part and on k_pe (one per token, shared by all heads)
      out = o_proj(softmax(q . [k_nope | k_pe] * (nope + rope)^-0.5) v)

    The absorbed form vLLM's decode kernels use is the same product reassociated. The cache holds the per-head
    keys [B, nh, T, nope + rope] and values [B, nh, T, v_head_dim]."""

    def __init__(self, cfg: DrafterConfig, in_features: int):
        super().__init__()
        self.nh = cfg.num_attention_heads
        self.nope, self.rope, self.vd = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.kv_lora = cfg.kv_lora_rank
        self.scale = mla_softmax_scale(cfg)
        self.q_lora = cfg.q_lora_rank
        if self.q_lora is not None:
            self.q_a_proj = nn.Linear(in_features, self.q_lora, bias=False)
            self.q_a_layernorm = RMSNorm(self.q_lora, cfg.rms_norm_eps)
            self.q_b_proj = nn.Linear(self.q_lora, self.nh * (self.nope + self.rope), bias=False)
        else:
            self.q_proj = nn.Linear(in_features, self.nh * (self.nope + self.rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(in_features, self.kv_lora + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv_lora, cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(self.kv_lora, self.nh * (self.nope + self.vd), bias=False)
        self.o_proj = nn.Linear(self.nh * self.vd, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask, cache, layer, want_probs=False, extra_kv=None):
        b, t, _ = x.shape
        qx = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.q_lora is not None else self.q_proj(x)
        q = qx.view(b, t, self.nh, self.nope + self.rope).transpose(1, 2)  # [B,nh,T,nope+rope]
        c, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_lora, self.rope], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(c)).view(b, t, self.nh, self.nope + self.vd).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.vd], dim=-1)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [B,1,T,rope]
        q = torch.cat([q[..., : self.nope], rope_interleaved(q[..., self.nope:], cos, sin)], dim=-1)
        k_pe = rope_interleaved(k_pe.unsqueeze(1), cos, sin).expand(b, self.nh, t, self.rope)
        k = torch.cat([k_nope, k_pe], dim=-1)
        new_kv = (k, v)
        k, v = _with_past(k, v, layer, cache, extra_kv)
        probs = None
        if want_probs:
            scores = (q.float() @ k.float().transpose(-1, -2)) * self.scale
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            probs = scores.softmax(-1)
            out = (probs @ v.float()).to(q.dtype)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        out = out.transpose(1, 2).reshape(b, t, self.nh * self.vd)
        return self.o_proj(out), probs, new_kv


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
        self.self_attn = (MLAAttention if cfg.mla else Attention)(cfg, 2 * h if index == 0 else h)
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
