"""The drafter's sizes and config values, derived from the WEIGHTS first (names, shapes) and the config second.

Pure functions of (logical shapes, config dict): no findings here (the traps a checkpoint sets are
``formats.checks``'); a contradiction between tensors that no reading can resolve is a CheckpointError, raised in
the order ``derive`` has always raised them.

* layers: the distinct ``layers.N.`` indices (``midlayer.`` = ``layers.0.``), never ``num_hidden_layers``;
* H: ``layers.0.post_attention_layernorm.weight``; generation: layer-0 q_proj input 2H -> EAGLE-3, H -> EAGLE-1/2;
* Ht: ``fc_norm.0.weight`` -> config ``target_hidden_size`` -> H; K = fc_in / Ht;
* Vd: ``lm_head`` rows; V: ``t2d`` length -> ``embed_tokens`` rows -> config ``vocab_size`` -> Vd;
* family: ``families.detect`` (evidence first), decided before the sizes; the layer-0 attention input and the heads
  are the family's (``Family.attention_input``, ``Family.head_sizes``: for the default layer q/k/v rows divided by
  ``head_dim``: config, else the family's hint, else rows / config heads).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import families
from ..drafter.config import attention_windows_of
from ..errors import CheckpointError
from ..families import cfg_flag, cfg_int
from ..families.base import Shape, ShapeOf
from .vllm import rope_from_config

LAYER_RE = re.compile(r"^layers\.(\d+)\.")
FC_NORM_RE = re.compile(r"^fc_norm\.(\d+)\.weight$")
EAGLE3_FLAGS = ("fc_norm", "norm_output", "norm_before_fc", "use_aux_norm")


@dataclass
class WeightSizes:
    """What the tensors (and, where they are silent, the config) say the drafter is; the evidence the checks need."""

    num_layers: int
    family: str  # the decoder-layer family (families.detect), decided before the sizes
    hidden_size: int
    fc_in_features: int
    generation: str
    target_hidden_size: int = 0
    num_aux: int = 3
    target_hidden_size_config: int | None = None
    fc_norm0_shape: Shape | None = None
    target_hidden_from_ids: bool = False  # Ht = fc_in / number of aux ids (no target_hidden_size, K odd with Ht = H)
    q_proj_rows: int = 0
    kv_proj_rows: int = 0
    head_dim: int = 0
    head_dim_guessed: bool = False
    num_heads: int = 0
    num_kv_heads: int = 0
    family_sizes: dict[str, Any] = field(default_factory=dict)  # the family's own DrafterConfig fields
    family_evidence: Any = None  # what in the weights says the family (Family.weight_evidence)
    config_family: tuple[str | None, str] = (None, "")  # the family the config alone says, and why
    intermediate_size: int = 0
    vocab_size: int = 0
    draft_vocab_size: int = 0
    lm_head_shape: Shape | None = None
    embed_shape: Shape | None = None
    d2t_shape: Shape | None = None
    fc_norm_widths: list[int] = field(default_factory=list)
    input_norm: Shape | None = None


def layer_count(names: list[str], where: str) -> int:
    layer_ids = sorted({int(m.group(1)) for c in names if (m := LAYER_RE.match(c))})
    if not layer_ids:
        raise CheckpointError(f"{where}: no decoder-layer tensors (layers.N.* or midlayer.*): not an EAGLE drafter")
    if layer_ids != list(range(len(layer_ids))):
        raise CheckpointError(f"{where}: decoder layers {layer_ids} are not numbered 0..{len(layer_ids) - 1}")
    return len(layer_ids)


def hidden_and_fc(shp: ShapeOf, need: Callable[[str], Shape], where: str) -> tuple[int, int]:
    """H (post-attention norm, final norm, hidden_norm, o_proj rows, in that order) and fc's input width."""
    pal = shp("layers.0.post_attention_layernorm.weight")
    norm = shp("norm.weight")
    hn = shp("layers.0.hidden_norm.weight")
    h = pal[0] if pal is not None else norm[0] if norm is not None else hn[0] if hn is not None else need("layers.0.self_attn.o_proj.weight")[0]
    for c, s in (("norm.weight", norm), ("layers.0.hidden_norm.weight", hn), ("layers.0.post_attention_layernorm.weight", pal)):
        if s is not None and s != (h,):
            raise CheckpointError(f"{where}: contradicting shapes: '{c}' is {list(s)} but the hidden size is {h}")
    fc = need("fc.weight")
    if len(fc) != 2 or fc[0] != h:
        raise CheckpointError(f"{where}: contradicting shapes: fc.weight is {list(fc)}, expected [{h}, K*Ht]")
    return h, fc[1]


def generation_of(s: WeightSizes, shp: ShapeOf, need: Callable[[str], Shape], where: str) -> None:
    """eagle3 (layer-0 attention input 2H) or eagle2 (H), from the family's attention input."""
    h = s.hidden_size
    qin = families.get(s.family).attention_input(s, shp, need, where)
    if qin == 2 * h:
        s.generation = "eagle3"
    elif qin == h:
        s.generation = "eagle2"
    else:
        raise CheckpointError(f"{where}: contradicting shapes: layer-0 attention input is {qin}, expected 2*H = {2 * h} (EAGLE-3) or H = {h} (EAGLE-1/2)")
    if s.generation == "eagle2" and s.fc_in_features != 2 * h:
        raise CheckpointError(f"{where}: contradicting shapes: an EAGLE-1/2 fc must be [H, 2H] = [{h}, {2 * h}], found {[h, s.fc_in_features]}")


def target_sizes(s: WeightSizes, shp: ShapeOf, flat: dict[str, Any], aux_ids: list[int] | None, where: str) -> None:
    """Ht and K: fc_norm width, else config target_hidden_size, else H; K = fc_in / Ht (EAGLE-1/2: Ht = H, K = 2)."""
    s.target_hidden_size_config = cfg_int(flat, "target_hidden_size")
    s.fc_norm0_shape = shp("fc_norm.0.weight")
    if s.generation == "eagle2":
        s.target_hidden_size, s.num_aux = s.hidden_size, 2
        return
    ht = s.fc_norm0_shape[0] if s.fc_norm0_shape is not None else (s.target_hidden_size_config or s.hidden_size)
    n_ids = len(aux_ids) if aux_ids else None
    k_hint = cfg_int(flat, "num_aux_hidden_states") or n_ids or flat.get("_eagle_config_num_aux") or 3
    if s.fc_in_features % ht:
        if s.fc_in_features % k_hint:
            raise CheckpointError(f"{where}: contradicting shapes: fc input width {s.fc_in_features} is neither a multiple of Ht={ht} nor of K={k_hint}")
        ht = s.fc_in_features // k_hint
    k_aux = s.fc_in_features // ht
    if s.target_hidden_size_config is None and ht == s.hidden_size and k_aux not in (2, 3, 4, 5) and n_ids and s.fc_in_features % n_ids == 0:
        # no target_hidden_size and a K that makes no sense with Ht = H: trust the id count
        ht, k_aux, s.target_hidden_from_ids = s.fc_in_features // n_ids, n_ids, True
    s.target_hidden_size, s.num_aux = ht, k_aux


def mlp_size(s: WeightSizes, shp: ShapeOf, where: str) -> None:
    h = s.hidden_size
    gp = shp("layers.0.mlp.gate_proj.weight")
    if gp is None:
        raise CheckpointError(f"{where}: no 'layers.0.mlp.gate_proj.weight' tensor: not a Llama-style drafter layer")
    up, dp = shp("layers.0.mlp.up_proj.weight"), shp("layers.0.mlp.down_proj.weight")
    if gp[1] != h or (up is not None and up != gp) or (dp is not None and dp != (h, gp[0])):
        raise CheckpointError(f"{where}: contradicting shapes: MLP gate/up/down are {list(gp)}, {list(up or ())}, {list(dp or ())} for H={h}")
    for i in range(1, s.num_layers):
        qi = shp(f"layers.{i}.self_attn.q_proj.weight")
        if qi is not None and qi[1] != h:
            raise CheckpointError(f"{where}: contradicting shapes: layers.{i}.self_attn.q_proj takes {qi[1]} inputs, expected H={h}")
    s.intermediate_size = gp[0]


def vocab_sizes(s: WeightSizes, shp: ShapeOf, flat: dict[str, Any], where: str) -> None:
    """V (t2d, embed_tokens, config, Vd) and Vd (lm_head, d2t, config, V)."""
    h = s.hidden_size
    lm, emb, t2d, d2t = shp("lm_head.weight"), shp("embed_tokens.weight"), shp("t2d"), shp("d2t")
    if lm is not None and (len(lm) != 2 or lm[1] != h):
        raise CheckpointError(f"{where}: contradicting shapes: lm_head.weight is {list(lm)}, expected [Vd, {h}]")
    if emb is not None and (len(emb) != 2 or emb[1] != h):
        raise CheckpointError(f"{where}: contradicting shapes: embed_tokens.weight is {list(emb)}, expected [V, {h}]")
    v_cfg, vd_cfg = cfg_int(flat, "vocab_size"), cfg_int(flat, "draft_vocab_size")
    v = t2d[0] if t2d is not None else emb[0] if emb is not None else v_cfg
    vd = lm[0] if lm is not None else d2t[0] if d2t is not None else (vd_cfg or v)
    if v is None:
        v = vd
    if v is None:
        raise CheckpointError(f"{where}: cannot tell the vocabulary size (no lm_head, embed_tokens, t2d or config vocab_size)")
    if d2t is not None and d2t != (vd,):
        raise CheckpointError(f"{where}: contradicting shapes: d2t is {list(d2t)} but lm_head has {vd} rows")
    s.vocab_size, s.draft_vocab_size, s.lm_head_shape, s.embed_shape, s.d2t_shape = v, vd, lm, emb, d2t


def norm_weights(s: WeightSizes, names: list[str], shp: ShapeOf, where: str) -> None:
    """fc_norm.i (EAGLE-3 only, [Ht] each) and input_norm ([K*Ht])."""
    s.fc_norm_widths = sorted(int(m.group(1)) for c in names if (m := FC_NORM_RE.match(c)))
    if s.fc_norm_widths and s.generation != "eagle3":
        raise CheckpointError(f"{where}: contradicting tensors: fc_norm.* weights in an EAGLE-1/2 drafter")
    for i in s.fc_norm_widths:
        w = shp(f"fc_norm.{i}.weight")
        if w != (s.target_hidden_size,):
            raise CheckpointError(f"{where}: contradicting shapes: fc_norm.{i}.weight is {list(w or ())}, expected [Ht={s.target_hidden_size}]")
    s.input_norm = shp("input_norm.weight")
    if s.input_norm is not None and s.input_norm != (s.fc_in_features,):
        raise CheckpointError(f"{where}: contradicting shapes: input_norm.weight is {list(s.input_norm)}, expected [K*Ht={s.fc_in_features}]")


def derive_sizes(names: list[str], shp: ShapeOf, flat: dict[str, Any], *, layout: str,
                 aux_ids: list[int] | None, where: str, missing: Callable[[str], str]) -> WeightSizes:
    """Every size of the drafter, in the order their contradictions are raised (the family first: it raises none)."""
    def need(c: str) -> Shape:
        w = shp(c)
        if w is None:
            raise CheckpointError(missing(c))
        return w

    fam, evidence, config_family = families.detect(names, flat, layout)
    num_layers = layer_count(names, where)
    h, fc_in = hidden_and_fc(shp, need, where)
    s = WeightSizes(num_layers=num_layers, family=fam.name, hidden_size=h, fc_in_features=fc_in, generation="",
                    family_evidence=evidence, config_family=config_family)
    generation_of(s, shp, need, where)
    target_sizes(s, shp, flat, aux_ids, where)
    fam.head_sizes(s, shp, flat, where)
    fam.check_weights(s, shp, where)
    mlp_size(s, shp, where)
    vocab_sizes(s, shp, flat, where)
    norm_weights(s, names, shp, where)
    return s


@dataclass
class ConfigValues:
    """The DrafterConfig fields no tensor carries: flags, rope, eps, positions, attention windows."""

    fc_norm: bool
    norm_before_fc: bool
    norm_output: bool
    norm_before_residual: bool
    rope_theta: float
    rope_scaling: Any
    max_position_embeddings: int
    rms_norm_eps: float
    layer_types: Any
    sliding_window: int | None
    window_problem: str | None


def eagle3_flags_only(flat: dict[str, Any], generation: str) -> dict[str, Any]:
    """EAGLE-1/2 configs carry no EAGLE-3 flags that mean anything: drop them."""
    return flat if generation == "eagle3" else {k: v for k, v in flat.items() if k not in EAGLE3_FLAGS}


def config_values(s: WeightSizes, flat: dict[str, Any], norm_before_residual_default: bool) -> ConfigValues:
    """``flat`` already through eagle3_flags_only. norm_before_fc as vLLM runs it (always off for a family whose
    drafter has no input_norm)."""
    fc_norm_cfg = cfg_flag(flat, "fc_norm")
    if fc_norm_cfg is None:
        fc_norm_cfg = cfg_flag(flat, "use_aux_norm")
    nbr = cfg_flag(flat, "norm_before_residual")
    theta, scaling = rope_from_config(flat)
    eps = flat.get("rms_norm_eps")
    eps = float(eps) if isinstance(eps, (int, float)) and not isinstance(eps, bool) and eps > 0 else 1e-5
    layer_types, window, problem = attention_windows_of(flat, s.family, s.num_layers)
    return ConfigValues(
        fc_norm=bool(fc_norm_cfg) or bool(s.fc_norm_widths),
        norm_before_fc=(bool(cfg_flag(flat, "norm_before_fc")) or s.input_norm is not None
                        if families.get(s.family).reads_norm_before_fc else False),
        norm_output=bool(cfg_flag(flat, "norm_output")),
        norm_before_residual=norm_before_residual_default if nbr is None else nbr,
        rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=cfg_int(flat, "max_position_embeddings") or 2048, rms_norm_eps=eps,
        layer_types=layer_types, sliding_window=window, window_problem=problem,
    )
