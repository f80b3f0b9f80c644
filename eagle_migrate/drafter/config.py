"""DrafterConfig: the one in-memory description of an EAGLE drafter, whatever layout it came from."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Generation = Literal["eagle2", "eagle3"]

# Drafter decoder-layer families, as vLLM names them (``architecture`` below). ``llama``: Eagle3LlamaForCausalLM /
# LlamaForCausalLMEagle3; ``qwen3``: Eagle3Qwen3ForCausalLM (the Llama layer plus per-head RMSNorms q_norm/k_norm
# [head_dim] on queries and keys before rope, and no o_proj bias); ``mla``: Eagle3DeepseekV2ForCausalLM (DeepSeek-V3,
# Kimi K2: multi-head latent attention with q_lora/kv_lora projections, split nope/rope heads, interleaved rope).
SUPPORTED_ARCHITECTURES = ("llama", "qwen3", "mla")
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
LAYER_TYPES = ("full_attention", "sliding_attention")


class DrafterConfig(BaseModel):
    """Sizes and flags of an EAGLE-2/EAGLE-3/EAGLE-3.1 drafter (Llama-style decoder layers).

    Symbols as in docs/architecture.md: H = hidden_size, Ht = target_hidden_size, K = num_aux, V = vocab_size,
    Vd = draft_vocab_size, I = intermediate_size.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    generation: Generation = Field("eagle3", description="eagle2: fc over cat(embed, last target hidden); eagle3: fc over K aux states")
    hidden_size: int = Field(..., gt=0, description="H, the drafter's hidden size")
    target_hidden_size: int = Field(..., gt=0, description="Ht, the target's hidden size (fc input is K*Ht)")
    num_aux: int = Field(3, ge=1, description="K, number of target aux hidden states fused by fc (eagle3)")
    vocab_size: int = Field(..., gt=0, description="V, the target vocabulary size")
    draft_vocab_size: int = Field(..., gt=0, description="Vd, rows of the drafter's lm_head")
    intermediate_size: int = Field(..., gt=0, description="I, MLP width")
    num_attention_heads: int = Field(..., gt=0)
    num_key_value_heads: int = Field(..., gt=0)
    head_dim: int = Field(..., gt=0)
    num_layers: int = Field(1, ge=1, description="decoder layers (layer 0 takes 2H inputs, later ones H)")
    rms_norm_eps: float = Field(1e-5, gt=0)
    rope_theta: float = Field(10000.0, gt=0)
    rope_scaling: dict[str, Any] | None = Field(None, description="HF rope_scaling dict (e.g. llama3), copied from the target")
    max_position_embeddings: int = Field(2048, gt=0)
    aux_layer_ids: list[int] | None = Field(
        None, description="target layers feeding fc, vLLM convention (residual stream after i layers), ascending"
    )
    fc_norm: bool = Field(False, description="EAGLE-3.1: one RMSNorm [Ht] per aux chunk before fc")
    norm_output: bool = Field(False, description="EAGLE-3.1: feed the post-final-norm state to the next draft step")
    norm_before_fc: bool = Field(False, description="older option: one RMSNorm [K*Ht] over the concatenation")
    norm_before_residual: bool = Field(False, description="layer-0 residual is hidden_norm(g) (True) or g (False)")
    attention_bias: bool = Field(False, description="q/k/v projections carry a bias")
    fc_bias: bool = Field(False, description="fc carries a bias (EAGLE-1/2 default)")
    has_lm_head: bool = Field(True, description="the drafter has its own lm_head [Vd, H] (EAGLE-2: target's head is used)")
    has_embed_tokens: bool = Field(False, description="the drafter ships its own embed_tokens [V, H]")
    architecture: str = Field("llama", description="the decoder-layer family: llama, qwen3 or mla")
    # MLA (architecture == "mla"; DeepseekV2MLAAttention): q = q_b(q_a_layernorm(q_a(x))) [nh, nope+rope];
    # kv_a_proj_with_mqa(x) = [c (kv_lora) | k_pe (rope, shared by all heads)]; kv_b(kv_a_layernorm(c)) = per head
    # [k_nope (nope) | v (v_head_dim)]. head_dim is nope + rope and num_key_value_heads = num_attention_heads there.
    q_lora_rank: int | None = Field(None, gt=0, description="MLA: rows of q_a_proj (vLLM's Eagle3 DeepSeek drafter needs it set)")
    kv_lora_rank: int | None = Field(None, gt=0, description="MLA: the latent width of kv_a_proj_with_mqa")
    qk_nope_head_dim: int | None = Field(None, gt=0, description="MLA: per-head query/key width without rope")
    qk_rope_head_dim: int | None = Field(None, gt=0, description="MLA: per-head query/key rope width (the shared k_pe)")
    v_head_dim: int | None = Field(None, gt=0, description="MLA: per-head value width")
    # Sliding-window draft layers (speculators >= 0.9's trainer default): vLLM's Llama / Qwen3 attention gives layer i
    # ``per_layer_sliding_window = sliding_window`` when ``layer_types[i] == "sliding_attention"``; a query at
    # position p then sees keys p-W+1..p. Both None = every layer attends to the whole context.
    layer_types: list[str] | None = Field(None, description="per draft layer: full_attention or sliding_attention")
    sliding_window: int | None = Field(None, gt=0, description="W, the window of the sliding_attention layers")

    @model_validator(mode="after")
    def _check(self) -> DrafterConfig:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(f"draft_vocab_size={self.draft_vocab_size} > vocab_size={self.vocab_size}")
        if self.aux_layer_ids is not None and self.generation == "eagle3" and len(self.aux_layer_ids) != self.num_aux:
            raise ValueError(f"aux_layer_ids has {len(self.aux_layer_ids)} entries but num_aux={self.num_aux}")
        if self.architecture == "mla":
            missing = [f for f in MLA_FIELDS[1:] if getattr(self, f) is None]
            if missing:
                raise ValueError(f"an MLA drafter needs {', '.join(missing)}")
            if self.head_dim != self.qk_nope_head_dim + self.qk_rope_head_dim:
                raise ValueError(f"MLA head_dim={self.head_dim} != qk_nope_head_dim + qk_rope_head_dim = "
                                 f"{self.qk_nope_head_dim} + {self.qk_rope_head_dim}")
            if self.qk_rope_head_dim % 2:
                raise ValueError(f"qk_rope_head_dim={self.qk_rope_head_dim} is odd")
            if self.num_key_value_heads != self.num_attention_heads:
                raise ValueError("MLA: num_key_value_heads must equal num_attention_heads (every head has its own keys)")
            if self.norm_before_fc or self.attention_bias:
                raise ValueError("vLLM's DeepSeek EAGLE-3 drafter has no norm_before_fc (input_norm) and no attention biases")
        if (self.layer_types is None) != (self.sliding_window is None):
            raise ValueError("layer_types and sliding_window are set together (both None: no sliding-window layer)")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_layers:
                raise ValueError(f"layer_types has {len(self.layer_types)} entries but num_layers={self.num_layers}")
            bad = sorted({t for t in self.layer_types if t not in LAYER_TYPES})
            if bad:
                raise ValueError(f"layer_types {bad}: only {', '.join(LAYER_TYPES)}")
            if self.mla:
                raise ValueError("vLLM's DeepSeek EAGLE-3 drafter has no sliding-window attention")
        if self.fc_norm and self.norm_before_fc:
            # vLLM accepts both (input_norm first); speculators forbids it. We accept and apply in vLLM's order.
            pass
        return self

    @property
    def supported_architecture(self) -> bool:
        """The family has a layer in drafter/model.py and a vLLM writer (SUPPORTED_ARCHITECTURES)."""
        return self.architecture in SUPPORTED_ARCHITECTURES

    def layer_window(self, i: int) -> int | None:
        """The sliding window of draft layer ``i`` (None: full attention), as vLLM's attention applies it."""
        if self.layer_types is None or self.layer_types[i] != "sliding_attention":
            return None
        return self.sliding_window

    @property
    def qk_norm(self) -> bool:
        """Per-head RMSNorm on queries and keys (``self_attn.q_norm`` / ``k_norm`` [head_dim]): the Qwen3 layer."""
        return self.architecture == "qwen3"

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (DeepseekV2MLAAttention): the DeepSeek-V3 / Kimi K2 layer."""
        return self.architecture == "mla"

    @property
    def rope_dim(self) -> int:
        """Width rope rotates per head: qk_rope_head_dim (MLA, interleaved pairs) or head_dim (neox halves)."""
        return self.qk_rope_head_dim if self.mla else self.head_dim

    @property
    def is_eagle31(self) -> bool:
        return self.generation == "eagle3" and (self.fc_norm or self.norm_output)

    @property
    def format_name(self) -> str:
        """`eagle2`, `eagle3` or `eagle3.1` as reported by inspect."""
        if self.generation == "eagle2":
            return "eagle2"
        return "eagle3.1" if self.is_eagle31 else "eagle3"

    @property
    def fc_in_features(self) -> int:
        return 2 * self.hidden_size if self.generation == "eagle2" else self.num_aux * self.target_hidden_size

    @property
    def uses_d2t(self) -> bool:
        return self.draft_vocab_size != self.vocab_size


def attention_windows_of(flat: dict[str, Any], architecture: str, num_layers: int) -> tuple[list[str] | None, int | None, str | None]:
    """``(layer_types, sliding_window, problem)`` of a drafter's decoder-layer config dict as vLLM 0.32 runs it.

    Llama (``models/llama.py`` LlamaAttention; LlamaConfig keeps the keys as given, ``use_sliding_window`` unread):
    draft layer i is sliding when ``layer_types[i] == "sliding_attention"``, with ``sliding_window``; a list shorter
    than the layers fails vLLM's assert. Qwen3 (``qwen3_eagle3.py``; Qwen3Config sets ``sliding_window = None`` unless
    ``use_sliding_window`` and, without ``layer_types``, makes layers i >= ``max_window_layers`` (28) sliding; entries
    past the list are full). MLA: vLLM's DeepSeek attention has no window. ``sliding_window`` 0 disables it (vLLM).
    Both None when no layer is sliding; ``problem`` says why a window in the config does not act (or cannot be read).
    """
    types, window = flat.get("layer_types"), flat.get("sliding_window")
    if architecture == "qwen3":
        if flat.get("use_sliding_window") is not True:
            window = None
        if types is None and window is not None:
            mwl = flat.get("max_window_layers", 28)
            types = ["sliding_attention" if isinstance(mwl, int) and i >= mwl else "full_attention" for i in range(num_layers)]
    if not isinstance(types, list) or "sliding_attention" not in types[:num_layers]:
        return None, None, None
    if window is None or window == 0:
        return None, None, None
    if not isinstance(window, int) or isinstance(window, bool) or window < 0:
        return None, None, f"sliding_window={window!r} is not a positive integer"
    if architecture == "mla":
        return None, None, "vLLM's DeepSeek EAGLE-3 drafter ignores layer_types / sliding_window (full attention)"
    if len(types) < num_layers:
        if architecture == "llama":
            return None, None, f"layer_types has {len(types)} entries for {num_layers} layers: vLLM's Llama drafter fails to load"
        types = list(types) + ["full_attention"] * (num_layers - len(types))
    types = [t if t == "sliding_attention" else "full_attention" for t in types[:num_layers]]
    return types, window, None


def rope_parameters_of(rope_scaling: dict[str, Any] | None, rope_theta: float, max_position_embeddings: int) -> dict:
    """A drafter's rope parameters as vLLM sees them after transformers standardises the config: ``rope_type``
    (legacy ``type`` understood, ``su`` = longrope), ``rope_theta``, and ``original_max_position_embeddings``
    defaulting to ``max_position_embeddings`` for llama3 / yarn / longrope (what transformers 5 fills in)."""
    rope = dict(rope_scaling or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    rope_type = {"su": "longrope", "mrope": "default"}.get(rope_type, rope_type)
    rope.pop("type", None)
    rope.update(rope_type=rope_type, rope_theta=rope_theta)
    if rope_type in ("llama3", "yarn", "longrope"):
        rope.setdefault("original_max_position_embeddings", max_position_embeddings)
    return rope


def mla_rope_type_of(rope_params: dict) -> str:
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
