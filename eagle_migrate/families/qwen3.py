"""The Qwen3 family: vLLM's ``Eagle3Qwen3ForCausalLM`` (``qwen3_eagle3.py``, vllm-contract.md section 13): the Llama
layer plus a per-head RMSNorm ``self_attn.q_norm`` / ``k_norm`` [head_dim] on queries and keys before rope, no
``o_proj`` bias, ``head_dim`` from the config (transformers' ``Qwen3Config`` defaults it to 128, not H / heads), and
sliding windows read through ``Qwen3Config`` (``use_sliding_window``, ``max_window_layers``).

Decided by evidence first (docs/formats.md section 8): q/k norm weights in the weights, else the config as vLLM reads
it (``config_archs`` / ``config_model_types``). The data is :data:`ROW`; :class:`Qwen3` is the behaviour that differs
from the Llama layer's."""

from __future__ import annotations

import functools
import re
from typing import Any

from ..errors import CheckpointError
from .base import Family, FamilyRow, MakeFinding, ShapeOf, cfg_int

QK_NORM_RE = re.compile(r"^layers\.(\d+)\.self_attn\.([qk])_norm\.weight$")
DEFAULT_HEAD_DIM = 128  # transformers' Qwen3Config default, which vLLM uses when the config has no head_dim


@functools.cache
def attention_class() -> type:
    """The Qwen3 attention (vLLM's Qwen3Attention.forward): the Llama attention with per-head RMSNorms on queries
    and keys before rope, and never an o_proj bias. Built on first use (torch)."""
    from .layers import Attention, RMSNorm  # lazy: torch stays out of inspect

    class QKNormAttention(Attention):
        def __init__(self, cfg: Any, in_features: int):
            super().__init__(cfg, in_features, o_bias=False)
            self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps)

        def norm_qk(self, q, k):
            return self.q_norm(q), self.k_norm(k)

    return QKNormAttention


ROW = FamilyRow(
    name="qwen3",
    title="Qwen3",
    vllm_arch="Eagle3Qwen3ForCausalLM",
    model_type="qwen3",
    hf_arch="Qwen3ForCausalLM",
    config_archs=("Eagle3Qwen3ForCausalLM", "PeagleQwen3ForCausalLM", "Qwen3ForCausalLM"),
    config_model_types=("qwen3",),
    eagle3_archs=("Eagle3Qwen3ForCausalLM",),
    target_note=("per-head `q_norm` / `k_norm`", ("qwen3",)),
    inspect_measures_aux_ids=False,
    short_layer_types_fail=False,  # Qwen3Config: entries past the list are full attention
    traps=(
        ("qk_norm_weights_missing", "error", "a Qwen3 config without `q_norm` / `k_norm` weights: vLLM loads all-ones norms without a word (a drafter trained as a Llama layer must be written as `LlamaForCausalLMEagle3`)", ()),
        ("qk_norm_weights_incomplete", "error", "some layers lack `q_norm` or `k_norm`: all-ones for those", ()),
        ("family_mismatch", "error", "`q_norm` / `k_norm` weights under a Llama config: vLLM's Llama drafter has no such parameters", ()),
        ("head_dim_missing", "error", "a Qwen3 config without `head_dim` while the weights' head_dim is not 128: vLLM builds Qwen3Config's default 128", ()),
        ("head_dim_not_hidden_over_heads", "info", "head_dim != H / heads (legal in Qwen3): taken from the config or the `q_norm` width and written explicitly", ()),
    ),
)


class Qwen3(Family):
    """The Llama layer's behaviour plus the per-head q/k norms and Qwen3Config's window and head_dim rules."""

    def window_keys(self, flat: dict[str, Any], num_layers: int) -> tuple[Any, Any]:
        """Qwen3Config sets ``sliding_window = None`` unless ``use_sliding_window`` and, without ``layer_types``,
        makes layers i >= ``max_window_layers`` (28) sliding."""
        types, window = flat.get("layer_types"), flat.get("sliding_window")
        if flat.get("use_sliding_window") is not True:
            window = None
        if types is None and window is not None:
            mwl = flat.get("max_window_layers", 28)
            types = ["sliding_attention" if isinstance(mwl, int) and i >= mwl else "full_attention" for i in range(num_layers)]
        return types, window

    # ----- the torch module ---------------------------------------------------------------------------------------
    def o_proj_has_bias(self, cfg: Any) -> bool:
        return False  # vLLM's Qwen3Attention never has one

    def attention(self, cfg: Any, in_features: int) -> Any:
        return attention_class()(cfg, in_features)

    # ----- sizes --------------------------------------------------------------------------------------------------
    def weight_evidence(self, names: list[str]) -> set[tuple[int, str]]:
        """The (layer, q|k) of every ``self_attn.q_norm`` / ``k_norm`` weight."""
        return {(int(m.group(1)), m.group(2)) for c in names if (m := QK_NORM_RE.match(c))}

    def head_dim_hint(self, shp: ShapeOf) -> int | None:
        qn = shp("layers.0.self_attn.q_norm.weight")
        return None if qn is None else qn[0]

    def check_weights(self, s: Any, shp: ShapeOf, where: str) -> None:
        for i, x in sorted(s.family_evidence):
            w = shp(f"layers.{i}.self_attn.{x}_norm.weight")
            if w != (s.head_dim,):
                raise CheckpointError(f"{where}: contradicting shapes: layers.{i}.self_attn.{x}_norm.weight is {list(w or ())}, expected [head_dim={s.head_dim}]")

    def head_checks(self, s: Any, flat: dict[str, Any], finding: MakeFinding) -> list[Any]:
        """The Llama head checks, then the Qwen3 traps: q_norm/k_norm weights against the config's family,
        head_dim defaults."""
        out = super().head_checks(s, flat, finding)
        layers = s.family_evidence
        cfg_fam, why = s.config_family
        if layers and cfg_fam == "llama":
            out.append(finding("error", "family_mismatch", f"the config says a Llama drafter ({why}) but the weights carry q_norm/k_norm (a Qwen3 layer): vLLM's Llama drafter has no such parameters; convert writes it as Eagle3Qwen3ForCausalLM"))
        elif not layers and cfg_fam == self.name:
            out.append(finding("error", "qk_norm_weights_missing", f"a Qwen3 drafter ({why}) without self_attn.q_norm/k_norm weights: vLLM loads all-ones norms without a word, which changes attention unless the drafter was trained so; if it was trained as a Llama layer, it must be written as LlamaForCausalLMEagle3"))
        missing = [f"layers.{i}.self_attn.{x}_norm.weight" for i in range(s.num_layers) for x in "qk" if (i, x) not in layers]
        if layers and missing:
            out.append(finding("error", "qk_norm_weights_incomplete", f"missing {', '.join(missing)}: vLLM silently uses all-ones norms for them"))
        hd_cfg = cfg_int(flat, "head_dim")
        if hd_cfg is None and flat and s.head_dim != DEFAULT_HEAD_DIM:
            out.append(finding("error", "head_dim_missing", f"a Qwen3 drafter with head_dim {s.head_dim} but no head_dim in the config: vLLM builds it with Qwen3Config's default {DEFAULT_HEAD_DIM}"))
        if s.num_heads and s.head_dim * s.num_heads != s.hidden_size:
            out.append(finding("info", "head_dim_not_hidden_over_heads", f"head_dim {s.head_dim} != H/heads = {s.hidden_size}/{s.num_heads}: taken from the {'config' if hd_cfg else 'q_norm width'}, written explicitly"))
        return out

    # ----- the vLLM layout ----------------------------------------------------------------------------------------
    def attention_tensor_names(self, cfg: Any, prefix: str) -> list[str]:
        # vLLM loads all-ones norms without a word when these are missing
        return super().attention_tensor_names(cfg, prefix) + [prefix + "self_attn.q_norm.weight", prefix + "self_attn.k_norm.weight"]


QWEN3 = Qwen3(ROW)
