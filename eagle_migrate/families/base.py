"""A drafter decoder-layer family in two parts: :class:`FamilyRow`, its data (names for vLLM / speculators /
transformers, the architectures and config keys that say it, its weight names, trap rows, config fields: one frozen
row per family, no code), and :class:`Family`, its behaviour (the attention module, rope rules, sizes from the
weights, checks), whose defaults are the Llama layer's (the generic EAGLE-3 layer; a family's behaviour class
overrides what its layer does differently). Plus the small pure helpers family rules share (config values, rope
parameters as vLLM reads them).

Imports only ``errors`` and the standard library: below drafter / formats / quant, which ask it. What needs torch
(the attention module) imports it inside the method (``# lazy:``), so that reading a checkpoint (``inspect``) never
imports torch.

Checks receive ``finding`` (``formats.traps.finding``: the one table of codes) and return its findings; sizes read
weights through ``shp`` (canonical name -> logical shape or None) and fill in ``s`` (``formats.sizes.WeightSizes``,
duck-typed); both raise :class:`~eagle_migrate.errors.CheckpointError` on tensors that contradict each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from ..errors import CheckpointError

Shape = tuple[int, ...]
ShapeOf = Callable[[str], Shape | None]
Finding = Any  # formats.base.Finding (made by the ``finding`` callable a check receives)
MakeFinding = Callable[[str, str, str], Finding]


def cfg_int(flat: dict[str, Any], key: str) -> int | None:
    """A positive integer config value, else None."""
    v = flat.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or v <= 0:
        return None
    return int(v)


def cfg_flag(flat: dict[str, Any], key: str) -> bool | None:
    v = flat.get(key)
    return bool(v) if isinstance(v, (bool, int)) else None


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


def guess_head_dim(qrows: int, kvrows: int) -> int:
    for hd in (128, 64, 96, 80, 256, 160, 112, 192, 32, 48, 16):
        if qrows % hd == 0 and kvrows % hd == 0 and hd <= qrows:
            return hd
    return kvrows


Trap = tuple[str, str, str, tuple[str, ...]]  # (code, severity, meaning, other severities): a row of formats/traps.py
Fields = dict[str, tuple[Any, Any]]  # name -> (annotation, pydantic FieldInfo)

# the Llama layer's Linears built with the drafter's quant_config, and the ones vLLM fuses
LLAMA_LINEARS = (*(f"self_attn.{x}_proj" for x in "qkvo"), *(f"mlp.{x}_proj" for x in ("gate", "up", "down")))
LLAMA_FUSED = {"self_attn.q_proj": ("q_proj", "k_proj", "v_proj"),  # qkv_proj
               "mlp.gate_proj": ("gate_proj", "up_proj")}  # gate_up_proj


@dataclass(frozen=True, eq=False)
class FamilyRow:
    """One family's data: what it is called, what says it, what it adds to the config, the report and the trap table,
    what the writers leave out and what quantize fuses. The defaults are the Llama layer's."""

    # ----- names: what the family is called in configs and by vLLM / speculators / transformers ----------------
    name: str  # DrafterConfig.architecture and inspect's ``architecture``
    title: str  # in messages ("a Qwen3 drafter")
    vllm_arch: str  # architectures[0] of the vLLM layout: vLLM's registry maps it to the family's drafter
    model_type: str  # the decoder layer's HF model_type (vLLM config, speculators transformer_layer_config)
    hf_arch: str  # a plain model of the family (transformer_layer_config.architectures, default verifier)
    # architectures / model types that say this family in a drafter config (families.config_family)
    config_archs: tuple[str, ...] = ()
    config_model_types: tuple[str, ...] = ()
    eagle3_archs: tuple[str, ...] = ()  # EAGLE-3 drafter architectures the readers recognise
    # (what is specific, the target model_type prefixes it is built for): a note when paired with another target
    target_note: tuple[str, tuple[str, ...]] | None = None
    inspect_measures_aux_ids: bool = False  # inspect measures undecided aux ids on the target (step 0)
    # what makes weights / a config this family's whatever else they say (Family.claims, before the sizes): a
    # substring of a tensor name, a config key, a word in the config's architectures
    claim_weights: tuple[str, ...] = ()
    claim_config_keys: tuple[str, ...] = ()
    claim_arch_words: tuple[str, ...] = ()

    # ----- DrafterConfig, inspect's report, the trap table ------------------------------------------------------
    config_fields: Fields = field(default_factory=dict)  # extra DrafterConfig fields (every family's are the model's)
    report_fields: Fields = field(default_factory=dict)  # extra fields of inspect's report sizes (Family.report_sizes)
    traps: tuple[Trap, ...] = ()  # the rows this family adds to formats/traps.py's table
    reads_norm_before_fc: bool = True  # vLLM's drafter of the family has input_norm (norm_before_fc)
    window_refusal: str | None = None  # DrafterConfig refuses layer_types with this message
    window_ignored: str | None = None  # why vLLM's drafter ignores a window the config asks for
    window_trap_note: str | None = None  # the sliding_window trap's meaning on such a window (a warning)
    short_layer_types_fail: bool = True  # a layer_types list shorter than the layers fails vLLM's load

    # ----- the vLLM / speculators layouts (formats.vllm, formats.write) ----------------------------------------
    unread_config_keys: tuple[str, ...] = ()  # config keys vLLM's drafter does not read: left out of its config
    always_num_aux: bool = False  # num_aux_hidden_states written even when K == 3
    speculators_refusal: tuple[str, str] | None = None  # (message, hint): no speculators layout

    # ----- quantize (quant.linears) -----------------------------------------------------------------------------
    # the decoder-layer Linears vLLM builds with the drafter's quant_config (everything else stays 16-bit) and the
    # Linears it fuses (first member's suffix -> every member's suffix; they share one NVFP4 global scale)
    layer_linears: tuple[str, ...] = LLAMA_LINEARS
    fused_linears: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(LLAMA_FUSED))


ROW_FIELDS = frozenset(f.name for f in fields(FamilyRow))


class Family:
    """One drafter decoder-layer family (``DrafterConfig.architecture``): its :class:`FamilyRow` and the code the row
    cannot say. The defaults are the Llama layer's (``LlamaForCausalLMEagle3``: q/k/v/o projections, grouped-query
    heads, neox rope); a family whose layer differs subclasses this and overrides what its layer does differently.
    A family answers its row's fields as attributes (``fam.vllm_arch`` is ``fam.row.vllm_arch``). Registered in
    ``families/__init__.py``."""

    def __init__(self, row: FamilyRow):
        self.row = row

    def __getattr__(self, key: str) -> Any:
        if key in ROW_FIELDS:
            return getattr(self.row, key)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {key!r}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.row.name!r})"

    # ----- DrafterConfig ------------------------------------------------------------------------------------------
    def check_config(self, cfg: Any) -> None:
        """Raise ValueError for a DrafterConfig vLLM's drafter of this family cannot build."""

    def rope_dim(self, cfg: Any) -> int:
        """The width rope rotates per head."""
        return cfg.head_dim

    def rope(self, cfg: Any, params: dict) -> dict:
        """The rope parameters (``rope_parameters_of``) the rope math runs for this family; the default: as given."""
        return params

    def report_sizes(self, cfg: Any) -> dict[str, Any]:
        """Values of :attr:`report_fields` for inspect's report."""
        return {}

    def window_keys(self, flat: dict[str, Any], num_layers: int) -> tuple[Any, Any]:
        """``(layer_types, sliding_window)`` as vLLM's config class of this family hands them to the layers."""
        return flat.get("layer_types"), flat.get("sliding_window")

    # ----- the torch module ---------------------------------------------------------------------------------------
    def o_proj_has_bias(self, cfg: Any) -> bool:
        """vLLM's Llama attention has an o_proj bias iff ``attention_bias`` (q/k/v-only biases mean a zero one)."""
        return cfg.attention_bias

    def attention(self, cfg: Any, in_features: int) -> Any:
        """The decoder layer's attention module (torch), exactly as vLLM computes it."""
        from .layers import Attention  # lazy: torch stays out of inspect

        return Attention(cfg, in_features, o_bias=self.o_proj_has_bias(cfg))

    # ----- sizes from the weights (formats.sizes) -----------------------------------------------------------------
    def claims(self, names: list[str], flat: dict[str, Any]) -> bool:
        """The weights or config are this family's whatever else they say (decided before the sizes are read): the
        row's ``claim_weights`` in a tensor name, a ``claim_config_keys`` key, a ``claim_arch_words`` word in the
        architectures."""
        r = self.row
        if any(m in n for n in names for m in r.claim_weights):
            return True
        if not (r.claim_config_keys or r.claim_arch_words):
            return False
        arch = " ".join(flat.get("architectures") or []) if isinstance(flat.get("architectures"), list) else ""
        return any(k in flat for k in r.claim_config_keys) or any(w in arch for w in r.claim_arch_words)

    def weight_evidence(self, names: list[str]) -> Any:
        """What in the weights says this family (falsy: nothing); kept as ``WeightSizes.family_evidence``."""
        return None

    def attention_input(self, s: Any, shp: ShapeOf, need: Callable[[str], Shape], where: str) -> int:
        """The layer-0 attention input width (2H: EAGLE-3, H: EAGLE-1/2); q/k/v agree or CheckpointError."""
        q = need("layers.0.self_attn.q_proj.weight")
        k = need("layers.0.self_attn.k_proj.weight")
        v = need("layers.0.self_attn.v_proj.weight")
        qin = q[1]
        if k[1] != qin or v[1] != qin or k[0] != v[0]:
            raise CheckpointError(f"{where}: contradicting shapes: q/k/v projections {list(q)}, {list(k)}, {list(v)}")
        s.q_proj_rows, s.kv_proj_rows = q[0], k[0]
        return qin

    def head_dim_hint(self, shp: ShapeOf) -> int | None:
        """A head_dim the weights carry besides q/k (used when the config's does not fit), else None."""
        return None

    def head_sizes(self, s: Any, shp: ShapeOf, flat: dict[str, Any], where: str) -> None:
        """head_dim, heads and kv heads of a llama-style layer: config head_dim if it fits the q/k rows, else the
        family's :meth:`head_dim_hint`, else rows / config heads, else a guess (EAGLE-1: H / heads, as SafeAILab
        computes it)."""
        qrows, kvrows = s.q_proj_rows, s.kv_proj_rows
        hd_cfg = cfg_int(flat, "head_dim")
        hint = self.head_dim_hint(shp)
        nh_cfg = cfg_int(flat, "num_attention_heads")
        if s.generation == "eagle2" and nh_cfg and qrows % nh_cfg == 0:
            hd = qrows // nh_cfg  # SafeAILab EAGLE-1 ignores head_dim: hd = H / nh
        elif hd_cfg and qrows % hd_cfg == 0 and kvrows % hd_cfg == 0:
            hd = hd_cfg
        elif hint is not None:
            hd = hint
        elif nh_cfg and qrows % nh_cfg == 0 and kvrows % (qrows // nh_cfg) == 0:
            hd = qrows // nh_cfg
        else:
            hd, s.head_dim_guessed = guess_head_dim(qrows, kvrows), True
        if qrows % hd or kvrows % hd:
            raise CheckpointError(f"{where}: contradicting shapes: q/k widths {qrows}/{kvrows} are not multiples of head_dim {hd}")
        nh, nkv = qrows // hd, kvrows // hd
        if nh % nkv:
            raise CheckpointError(f"{where}: contradicting shapes: {nh} query heads are not a multiple of {nkv} kv heads")
        o = shp("layers.0.self_attn.o_proj.weight")
        if o is not None and o != (s.hidden_size, qrows):
            raise CheckpointError(f"{where}: contradicting shapes: o_proj is {list(o)}, expected [{s.hidden_size}, {qrows}]")
        s.head_dim, s.num_heads, s.num_kv_heads = hd, nh, nkv

    def check_weights(self, s: Any, shp: ShapeOf, where: str) -> None:
        """CheckpointError for the family's own tensors that contradict the sizes (after :meth:`head_sizes`)."""

    # ----- inspect's traps (formats.checks) -------------------------------------------------------------------------
    def head_checks(self, s: Any, flat: dict[str, Any], finding: MakeFinding) -> list[Finding]:
        """Config head sizes against the weights (and the family's own traps about them)."""
        out: list[Finding] = []
        hd_cfg, nh_cfg, nkv_cfg = cfg_int(flat, "head_dim"), cfg_int(flat, "num_attention_heads"), cfg_int(flat, "num_key_value_heads")
        if s.head_dim_guessed:
            out.append(finding("info", "head_dim_guessed", f"no usable head_dim / num_attention_heads in the config: head_dim={s.head_dim} guessed from q/k widths {s.q_proj_rows}/{s.kv_proj_rows}"))
        if hd_cfg and hd_cfg != s.head_dim:
            out.append(finding("error", "head_dim_mismatch", f"config head_dim={hd_cfg} does not fit q/k widths {s.q_proj_rows}/{s.kv_proj_rows} (head_dim {s.head_dim} does)"))
        if nh_cfg and nh_cfg != s.num_heads:
            out.append(finding("error", "num_heads_mismatch", f"config num_attention_heads={nh_cfg} but the weights have {s.num_heads} heads of {s.head_dim}"))
        if nkv_cfg and nkv_cfg != s.num_kv_heads:
            out.append(finding("error", "num_kv_heads_mismatch", f"config num_key_value_heads={nkv_cfg} but the weights have {s.num_kv_heads}"))
        return out

    def vllm_checks(self, s: Any, flat: dict[str, Any], aux_ids: list[int] | None, scaling: Any,
                    finding: MakeFinding) -> list[Finding]:
        """What vLLM's drafter class of this family does with the checkpoint that another family's would not
        (``scaling``: the config's rope_scaling, as read)."""
        return []

    # ----- the vLLM / speculators layouts (formats.vllm, formats.write) --------------------------------------------
    def head_config(self, cfg: Any) -> dict[str, Any]:
        """The head keys of the decoder-layer config. ``head_dim`` is always written (Qwen3Config's default is 128,
        not H / heads)."""
        return {"head_dim": cfg.head_dim}

    def attention_tensor_names(self, cfg: Any, prefix: str) -> list[str]:
        """The attention tensors vLLM loads for layer ``prefix`` (``layers.{i}.``)."""
        names = [prefix + f"self_attn.{x}_proj.weight" for x in "qkvo"]
        if cfg.attention_bias:  # vLLM's Llama layer: o_proj has a bias too
            names += [prefix + f"self_attn.{x}_proj.bias" for x in ("qkvo" if self.o_proj_has_bias(cfg) else "qkv")]
        return names

    def check_convertible(self, cfg: Any, where: str) -> None:
        """UnsupportedError for a drafter of this family that no writer can emit so that vLLM loads it."""

    # ----- vLLM on a CPU (validate.attention_backend) --------------------------------------------------------------
    def vllm_cpu_attention(self, config: dict[str, Any]) -> bool:
        """This one level of a model's config.json asks vLLM's CPU platform for the family's own attention backend."""
        return False
