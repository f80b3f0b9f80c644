"""DrafterConfig: the one in-memory description of an EAGLE drafter, whatever layout it came from."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .. import families

Generation = Literal["eagle2", "eagle3"]

# The decoder-layer families (``architecture`` below) are eagle_migrate.families' registry; a family's own fields
# (``Family.config_fields``) are fields of this model, its rules (``Family.check_config``) part of its validation.
LAYER_TYPES = ("full_attention", "sliding_attention")


class _CommonFields(BaseModel):
    """The fields every family has, in the order they are dumped (the families' own fields follow, then the
    attention windows)."""

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
    architecture: str = Field(families.DEFAULT.name, description=f"the decoder-layer family: {families.names_text()}")


class DrafterConfig(families.config_fields_model(), _CommonFields):
    """Sizes and flags of an EAGLE-2/EAGLE-3/EAGLE-3.1 drafter (Llama-style decoder layers; the family's attention).

    Symbols as in docs/architecture.md: H = hidden_size, Ht = target_hidden_size, K = num_aux, V = vocab_size,
    Vd = draft_vocab_size, I = intermediate_size.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # Sliding-window draft layers (speculators >= 0.9's trainer default): vLLM's attention (of a family with windows)
    # gives layer i ``per_layer_sliding_window = sliding_window`` when ``layer_types[i] == "sliding_attention"``; a
    # query at position p then sees keys p-W+1..p. Both None = every layer attends to the whole context.
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
        fam = families.find(self.architecture)
        if fam is not None:
            fam.check_config(self)
        if (self.layer_types is None) != (self.sliding_window is None):
            raise ValueError("layer_types and sliding_window are set together (both None: no sliding-window layer)")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_layers:
                raise ValueError(f"layer_types has {len(self.layer_types)} entries but num_layers={self.num_layers}")
            bad = sorted({t for t in self.layer_types if t not in LAYER_TYPES})
            if bad:
                raise ValueError(f"layer_types {bad}: only {', '.join(LAYER_TYPES)}")
            if fam is not None and fam.window_refusal:
                raise ValueError(fam.window_refusal)
        if self.fc_norm and self.norm_before_fc:
            # vLLM accepts both (input_norm first); speculators forbids it. We accept and apply in vLLM's order.
            pass
        return self

    @property
    def supported_architecture(self) -> bool:
        """The family is registered (eagle_migrate.families): it has a layer, a vLLM writer and its rules."""
        return families.find(self.architecture) is not None

    def layer_window(self, i: int) -> int | None:
        """The sliding window of draft layer ``i`` (None: full attention), as vLLM's attention applies it."""
        if self.layer_types is None or self.layer_types[i] != "sliding_attention":
            return None
        return self.sliding_window

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

    The default family (its vLLM attention and config class keep the keys as given, ``use_sliding_window`` unread):
    draft layer i is sliding when ``layer_types[i] == "sliding_attention"``, with ``sliding_window``; a list shorter
    than the layers fails vLLM's assert. Other families read the keys through their config class
    (``Family.window_keys``; entries past the list are full there) or have no window (``Family.window_ignored``).
    ``sliding_window`` 0 disables it (vLLM). Both None when no layer is sliding; ``problem`` says why a window in
    the config does not act (or cannot be read).
    """
    fam = families.get(architecture)
    types, window = fam.window_keys(flat, num_layers)
    if not isinstance(types, list) or "sliding_attention" not in types[:num_layers]:
        return None, None, None
    if window is None or window == 0:
        return None, None, None
    if not isinstance(window, int) or isinstance(window, bool) or window < 0:
        return None, None, f"sliding_window={window!r} is not a positive integer"
    if fam.window_ignored:
        return None, None, fam.window_ignored
    if len(types) < num_layers:
        if fam.short_layer_types_fail:
            return None, None, f"layer_types has {len(types)} entries for {num_layers} layers: vLLM's {fam.title} drafter fails to load"
        types = list(types) + ["full_attention"] * (num_layers - len(types))
    types = [t if t == "sliding_attention" else "full_attention" for t in types[:num_layers]]
    return types, window, None
