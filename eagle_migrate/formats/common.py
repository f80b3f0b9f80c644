"""What every layout reader shares: stored -> canonical names, logical shapes of packed tensors, and the
derivation of a ``DrafterConfig`` from the WEIGHTS first (names, shapes) and the config second.

Canonical names are the vLLM-layout names (``fc.weight``, ``layers.0.self_attn.q_proj.weight``, ``norm.weight``,
``lm_head.weight``, ``d2t``, ...). A layout reader only has to say how its config is to be read (``ConfigView``);
sizes always come from the tensors:

* layers: the distinct ``layers.N.`` indices (``midlayer.`` = ``layers.0.``), never ``num_hidden_layers``;
* H: ``layers.0.post_attention_layernorm.weight``; generation: layer-0 q_proj input 2H -> EAGLE-3, H -> EAGLE-1/2;
* Ht: ``fc_norm.0.weight`` -> config ``target_hidden_size`` -> H; K = fc_in / Ht;
* Vd: ``lm_head`` rows; V: ``t2d`` length -> ``embed_tokens`` rows -> config ``vocab_size`` -> Vd;
* heads: q/k/v rows divided by ``head_dim`` (config, else ``q_norm`` width, else rows / config heads).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..drafter.config import (
    DrafterConfig,
    attention_windows_of,
    mla_rope_type_of,
    rope_parameters_of,
)
from ..errors import CheckpointError
from .base import Checkpoint, Finding
from .io import TensorInfo, TensorStore
from .traps import finding
from .vllm import rope_from_config

# Tensors a compressed-tensors / ModelOpt quantized linear carries next to (or instead of) ``.weight``.
QUANT_SUFFIXES = (
    "weight_packed", "weight_scale", "weight_scale_2", "weight_zero_point", "weight_global_scale", "weight_shape",
    "weight_g_idx", "input_scale", "input_global_scale", "input_zero_point", "output_scale", "k_scale", "v_scale",
)
# Names some trainers save that are not part of the drafter (dropped on read, reported as info).
IGNORED_NAMES = ("verifier_lm_head.weight", "verifier_norm.weight", "verifier_norm.bias")
MLA_MARKERS = ("q_a_proj", "kv_a_proj_with_mqa", "kv_b_proj", "q_a_layernorm", "kv_a_layernorm")
EAGLE3_ARCHS = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Qwen3ForCausalLM",
                "Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM", "Eagle3Speculator", "Eagle3DraftModel")

_LAYER_RE = re.compile(r"^layers\.(\d+)\.")
_QK_NORM_RE = re.compile(r"^layers\.(\d+)\.self_attn\.([qk])_norm\.weight$")
# architectures vLLM's registry maps to the Qwen3 / Llama EAGLE-3 drafter classes (plus the plain model names that
# speculators' transformer_layer_config and trainers write)
QWEN3_ARCHS = ("Eagle3Qwen3ForCausalLM", "PeagleQwen3ForCausalLM", "Qwen3ForCausalLM")
LLAMA_ARCHS = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "LlamaForCausalLM")
QWEN3_DEFAULT_HEAD_DIM = 128  # transformers' Qwen3Config default, which vLLM uses when the config has no head_dim


# ----- names ------------------------------------------------------------------------------------------------------
@dataclass
class NameScan:
    """Stored names seen through the canonical lens."""

    name_map: dict[str, str]  # canonical -> stored
    prefix: str  # "model." when it was stripped, else ""
    midlayer: bool  # stored with ``midlayer.`` (SafeAILab / SpecForge / TorchSpec native)
    ignored: list[str] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return list(self.name_map)


def scan_names(store: TensorStore) -> NameScan:
    stored = store.names()
    if not stored:
        raise CheckpointError(f"{store.root}: the weight files hold no tensors")
    # strip ``model.`` only when every non-lm_head name carries it (HF-style wrappers put lm_head outside)
    body = [n for n in stored if not n.startswith("lm_head.")]
    prefix = "model." if body and all(n.startswith("model.") for n in body) else ""
    name_map: dict[str, str] = {}
    midlayer = False
    ignored: list[str] = []
    for s in stored:
        c = s[len(prefix):] if prefix and s.startswith(prefix) else s
        if c.startswith("midlayer."):
            midlayer = True
            c = "layers.0." + c[len("midlayer."):]
        if c in IGNORED_NAMES:
            ignored.append(s)
            continue
        if c in name_map:
            raise CheckpointError(f"{store.root}: tensors '{name_map[c]}' and '{s}' both mean '{c}'")
        name_map[c] = s
    return NameScan(name_map, prefix, midlayer, ignored)


def config_family(flat: dict[str, Any], layout: str) -> tuple[str | None, str]:
    """The drafter family (llama / qwen3) vLLM would build from the config alone, and the key that decides it.

    The speculators layout: ``transformer_layer_config.model_type`` (vLLM maps qwen3 -> Eagle3Qwen3ForCausalLM,
    llama or none -> Eagle3LlamaForCausalLM); every other layout: the first known architecture, else model_type.
    None when the config says nothing we know."""
    mt = flat.get("model_type")
    archs = flat.get("architectures") if isinstance(flat.get("architectures"), list) else []
    if layout == "speculators":
        if mt == "qwen3":
            return "qwen3", "transformer_layer_config.model_type qwen3"
        return ("llama", f"transformer_layer_config.model_type {mt or '(none: llama)'}") if mt in (None, "llama") else (None, "")
    for a in archs:
        if a in QWEN3_ARCHS:
            return "qwen3", f"architectures {a}"
        if a in LLAMA_ARCHS:
            return "llama", f"architectures {a}"
    if mt in ("qwen3", "llama"):
        return mt, f"model_type {mt}"
    return None, ""


def _family(nm: dict[str, str], flat: dict[str, Any], layout: str, num_layers: int, hd: int, h: int, nh: int,
            hd_cfg: int | None, findings: list[Finding], where: str, shp) -> str:
    """llama or qwen3, by evidence: q_norm/k_norm weights first, the config second; the family's traps as findings."""
    qk = {(int(m.group(1)), m.group(2)) for c in nm if (m := _QK_NORM_RE.match(c))}
    cfg_fam, why = config_family(flat, layout)
    if qk:
        family = "qwen3"
        if cfg_fam == "llama":
            findings.append(finding("error", "family_mismatch", f"the config says a Llama drafter ({why}) but the weights carry q_norm/k_norm (a Qwen3 layer): vLLM's Llama drafter has no such parameters; convert writes it as Eagle3Qwen3ForCausalLM"))
    elif cfg_fam == "qwen3":
        family = "qwen3"
        findings.append(finding("error", "qk_norm_weights_missing", f"a Qwen3 drafter ({why}) without self_attn.q_norm/k_norm weights: vLLM loads all-ones norms without a word, which changes attention unless the drafter was trained so; if it was trained as a Llama layer, it must be written as LlamaForCausalLMEagle3"))
    else:
        family = "llama"
    if family == "qwen3":
        missing = [f"layers.{i}.self_attn.{x}_norm.weight" for i in range(num_layers) for x in "qk" if (i, x) not in qk]
        if qk and missing:
            findings.append(finding("error", "qk_norm_weights_incomplete", f"missing {', '.join(missing)}: vLLM silently uses all-ones norms for them"))
        for i, x in sorted(qk):
            s = shp(f"layers.{i}.self_attn.{x}_norm.weight")
            if s != (hd,):
                raise CheckpointError(f"{where}: contradicting shapes: layers.{i}.self_attn.{x}_norm.weight is {list(s or ())}, expected [head_dim={hd}]")
        if hd_cfg is None and flat and hd != QWEN3_DEFAULT_HEAD_DIM:
            findings.append(finding("error", "head_dim_missing", f"a Qwen3 drafter with head_dim {hd} but no head_dim in the config: vLLM builds it with Qwen3Config's default {QWEN3_DEFAULT_HEAD_DIM}"))
        if nh and hd * nh != h:
            findings.append(finding("info", "head_dim_not_hidden_over_heads", f"head_dim {hd} != H/heads = {h}/{nh}: taken from the {'config' if hd_cfg else 'q_norm width'}, written explicitly"))
    return family


def _mla_sizes(shp, flat: dict[str, Any], h: int, findings: list[Finding], where: str) -> dict[str, Any]:
    """MLA sizes from the layer-0 weights (DeepseekV2MLAAttention's shapes), the config only where the weights are
    silent; a config that disagrees with the weights is an error finding.

    q_b_proj [nh*(nope+rope), q_lora] (or q_proj [nh*(nope+rope), in]), kv_a_proj_with_mqa [kv_lora+rope, in],
    kv_a_layernorm [kv_lora], kv_b_proj [nh*(nope+v), kv_lora], o_proj [H, nh*v]: rope = kv_a rows - kv_lora,
    nh = (q_b rows - kv_b rows + o cols) / rope, nope = (kv_b rows - o cols) / nh, v = o cols / nh."""
    p = "layers.0.self_attn."
    qa, qb, qp = shp(p + "q_a_proj.weight"), shp(p + "q_b_proj.weight"), shp(p + "q_proj.weight")
    kva, kvn, kvb, o = shp(p + "kv_a_proj_with_mqa.weight"), shp(p + "kv_a_layernorm.weight"), shp(p + "kv_b_proj.weight"), shp(p + "o_proj.weight")
    q_rows = (qb or qp or (None,))[0]
    if kva is None or kvb is None or o is None or q_rows is None:
        raise CheckpointError(f"{where}: an MLA drafter without q_b_proj/q_proj, kv_a_proj_with_mqa, kv_b_proj and o_proj weights in layer 0")
    kv_lora = kvn[0] if kvn is not None else (kvb[1] if len(kvb) == 2 else _int(flat, "kv_lora_rank"))
    rope = kva[0] - kv_lora
    if rope <= 0 or (len(kvb) == 2 and kvb[1] != kv_lora):
        raise CheckpointError(f"{where}: contradicting shapes: kv_a_proj_with_mqa {list(kva)}, kv_b_proj {list(kvb)}, kv_lora_rank {kv_lora}")
    nh_x_nope = kvb[0] - o[1]
    if (q_rows - nh_x_nope) % rope or nh_x_nope <= 0:
        raise CheckpointError(f"{where}: contradicting shapes: q {q_rows} rows, kv_b_proj {list(kvb)}, o_proj {list(o)} do not fit qk_rope_head_dim {rope}")
    nh = (q_rows - nh_x_nope) // rope
    if nh <= 0 or nh_x_nope % nh or o[1] % nh or o[0] != h:
        raise CheckpointError(f"{where}: contradicting shapes: q {q_rows} rows, kv_b_proj {list(kvb)}, o_proj {list(o)} for {nh} heads")
    sizes: dict[str, Any] = {"num_attention_heads": nh, "q_lora_rank": qa[0] if qa is not None else None,
                             "kv_lora_rank": kv_lora, "qk_nope_head_dim": nh_x_nope // nh, "qk_rope_head_dim": rope,
                             "v_head_dim": o[1] // nh}
    if qa is not None and qb is not None and qb[1] != qa[0]:
        raise CheckpointError(f"{where}: contradicting shapes: q_a_proj {list(qa)} but q_b_proj {list(qb)}")
    for k, v in sizes.items():
        c = _int(flat, k)
        if c is not None and v is not None and c != v:
            findings.append(finding("error", "mla_size_mismatch", f"config {k}={c} but the weights say {v}: vLLM builds the drafter from the config"))
    return sizes


CPU_MLA_WIDTH = 576  # vLLM's CPU MLA kernels: kv_lora_rank + qk_rope_head_dim must be 512 + 64


def _mla_traps(flat: dict[str, Any], sizes: dict[str, Any], aux_ids: list[int] | None, norm_before_fc: bool,
               has_input_norm: bool, has_lm_head: bool, vd: int, scaling: Any,
               findings: list[Finding]) -> bool:
    """What vLLM's Eagle3DeepseekV2ForCausalLM does with an MLA drafter that a Llama one would not hit
    (vllm-contract.md section 13, deepseek_eagle3.py); returns norm_before_fc as vLLM runs it (always off)."""
    if sizes.get("q_lora_rank") is None:
        findings.append(finding("error", "mla_q_lora_missing", "an MLA drafter without q_a_proj (q_lora_rank unset): vLLM's Eagle3 DeepSeek loader fails ('no module or parameter named layers.0.self_attn.fused_qkv_a_proj'); it cannot be served"))
    elif flat and _int(flat, "q_lora_rank") is None:
        findings.append(finding("error", "mla_q_lora_rank_missing", f"q_a_proj weights but no q_lora_rank in the config: vLLM builds a plain q_proj and fails to load them; convert writes q_lora_rank={sizes['q_lora_rank']}"))
    if flat.get("model_type") == "deepseek_v3":
        findings.append(finding("error", "mla_model_type_deepseek_v3", "model_type deepseek_v3 on the drafter: vLLM rewrites it to its MTP model and refuses it (Eagle3DeepSeekMTPModel not supported); the drafter must say deepseek_v2 (convert writes that)"))
    if aux_ids is not None and 0 in aux_ids:
        findings.append(finding("error", "mla_aux_id_zero", f"aux layer ids {aux_ids} include 0: vLLM's DeepSeek target crashes collecting it ('unsupported operand type(s) for +: Tensor and NoneType')"))
    if (sizes.get("kv_lora_rank") or 0) + (sizes.get("qk_rope_head_dim") or 0) != CPU_MLA_WIDTH:
        findings.append(finding("info", "mla_cpu_head_size", f"kv_lora_rank + qk_rope_head_dim = {sizes.get('kv_lora_rank')} + {sizes.get('qk_rope_head_dim')} != {CPU_MLA_WIDTH}: vLLM's CPU MLA backend cannot run it (GPU backends can)"))
    if not has_lm_head and _int(flat, "draft_vocab_size") is not None:
        findings.append(finding("error", "mla_draft_vocab_without_lm_head", f"draft_vocab_size={vd} but no lm_head.weight: the drafter serves a randomly initialised head (sglang#27908)"))
    if scaling:
        try:
            mla_rope_type_of(rope_parameters_of(scaling, 1.0, _int(flat, "max_position_embeddings") or 2048))
        except ValueError as e:
            findings.append(finding("error", "mla_rope_scaling_unsupported", f"{e}; convert and validate refuse it"))
    if norm_before_fc or has_input_norm:
        findings.append(finding("error", "mla_norm_before_fc", "norm_before_fc / input_norm in an MLA drafter: vLLM's DeepSeek EAGLE-3 drafter has no input_norm; it ignores the flag (and refuses an input_norm.weight)"))
    if flat.get("attention_bias"):
        findings.append(finding("warning", "mla_attention_bias", "attention_bias: true, but vLLM's MLA attention has no biases"))
    return False


def is_mla(names: list[str], cfg: dict[str, Any] | None) -> bool:
    if any(m in n for n in names for m in MLA_MARKERS):
        return True
    flat = cfg or {}
    arch = " ".join(flat.get("architectures") or []) if isinstance(flat.get("architectures"), list) else ""
    return "kv_lora_rank" in flat or "Deepseek" in arch


# ----- quantization -----------------------------------------------------------------------------------------------
def quant_scheme(cfg: dict[str, Any] | None, extra: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """A short description of the drafter's own quantization (config ``quantization_config`` or ModelOpt's
    ``hf_quant_config.json``), or None."""
    qc = (cfg or {}).get("quantization_config")
    if isinstance(qc, dict) and ("quant_algo" in qc or isinstance(qc.get("quantization"), dict)) and "config_groups" not in qc:
        extra, qc = qc, None  # ModelOpt puts its hf_quant_config dict into config.json as quantization_config
    if isinstance(qc, dict):
        out: dict[str, Any] = {"quant_method": qc.get("quant_method", "unknown"), "format": qc.get("format")}
        groups = qc.get("config_groups")
        schemes = []
        if isinstance(groups, dict):
            for gname, g in groups.items():
                if not isinstance(g, dict):
                    continue
                w = g.get("weights") if isinstance(g.get("weights"), dict) else {}
                a = g.get("input_activations") if isinstance(g.get("input_activations"), dict) else {}
                schemes.append({
                    "group": gname, "targets": g.get("targets"),
                    "weights": {k: w.get(k) for k in ("num_bits", "type", "strategy", "group_size", "dynamic") if k in w},
                    "input_activations": {k: a.get(k) for k in ("num_bits", "type", "strategy", "dynamic") if k in a} or None,
                })
        out["schemes"] = schemes
        out["ignore"] = qc.get("ignore")
        out["scheme"] = describe_scheme(out)
        return out
    if isinstance(extra, dict):
        q = extra.get("quantization") if isinstance(extra.get("quantization"), dict) else extra
        algo = q.get("quant_algo")
        if algo:
            bits = 4 if "4" in str(algo) else 8
            return {"quant_method": "modelopt", "format": algo, "scheme": str(algo).lower(),
                    "ignore": q.get("exclude_modules"), "group_size": q.get("group_size"),
                    "schemes": [{"group": "modelopt", "targets": None, "weights": {"num_bits": bits}, "input_activations": None}]}
    return None


def describe_scheme(q: dict[str, Any]) -> str:
    parts = []
    for s in q.get("schemes") or []:
        w = s.get("weights") or {}
        a = s.get("input_activations") or {}
        t = f"w{w.get('num_bits', '?')}{(w.get('type') or '')[:1]}"
        if w.get("group_size"):
            t += f"g{w['group_size']}"
        if a:
            t += f"a{a.get('num_bits', '?')}{(a.get('type') or '')[:1]}" + ("-dynamic" if a.get("dynamic") else "")
        parts.append(t)
    fmt = q.get("format")
    return (fmt + ":" if fmt else "") + (",".join(parts) if parts else "?")


def _num_bits(q: dict[str, Any] | None) -> int:
    for s in (q or {}).get("schemes") or []:
        nb = (s.get("weights") or {}).get("num_bits")
        if isinstance(nb, int) and nb > 0:
            return nb
    if q and "4" in str(q.get("format", "")):
        return 4
    return 4


def logical_shapes(name_map: dict[str, str], infos: dict[str, TensorInfo], quant: dict[str, Any] | None) -> dict[str, tuple[int, ...]]:
    """Canonical ``X.weight`` -> logical [out, in] shape, unpacking packed quantized weights.

    compressed-tensors packs 4-bit weights into ``X.weight_packed`` (int32: 8 values per element; uint8: 2);
    ModelOpt NVFP4 stores ``X.weight`` as uint8 with 2 values per byte. Scale tensors are never mistaken for weights.
    """
    out: dict[str, tuple[int, ...]] = {}
    bits = _num_bits(quant)
    for c, s in name_map.items():
        info = infos[s]
        shape = info.shape
        if c.endswith(".weight_packed"):
            base = c[: -len("_packed")]
            per = {"int32": 32, "uint8": 8, "int8": 8, "int16": 16, "int64": 64}.get(info.dtype, 32) // max(bits, 1)
            if len(shape) == 2:
                out[base] = (shape[0], shape[1] * per)
        elif c.endswith(".weight") and base_is_linear(c) and info.dtype == "uint8" and quant and quant.get("quant_method") == "modelopt" and bits == 4:
            out[c] = (shape[0], shape[1] * 2) if len(shape) == 2 else shape
        elif c.endswith(".weight") or c in ("d2t", "t2d"):
            out.setdefault(c, shape)
    return out


def base_is_linear(c: str) -> bool:
    return c.endswith("_proj.weight") or c in ("fc.weight", "lm_head.weight")


# ----- config views -----------------------------------------------------------------------------------------------
@dataclass
class ConfigView:
    """How one layout's config.json is to be read, as flat HF-style keys plus where things live."""

    flat: dict[str, Any]  # hidden_size, num_attention_heads, head_dim, vocab_size, draft_vocab_size, flags, ...
    aux_ids: list[int] | None = None  # as stored
    aux_ids_source: str = "none"  # "top-level", "eagle_config", "none"
    # a fingerprint unique to one producer's writer that decides the aux-id convention: (convention, what was seen)
    aux_fingerprint: tuple[str, str] | None = None
    norm_before_residual_default: bool = False
    # flags that vLLM reads only at the top level, and where each was actually found
    nested_flags: dict[str, str] = field(default_factory=dict)
    # evidence for each aux-id reading that does not decide it (convention -> remarks), reported by inspect
    aux_notes: dict[str, list[str]] = field(default_factory=dict)


def hf_view(cfg: dict[str, Any] | None, *, aux_fingerprint: tuple[str, str] | None = None,
            aux_notes: dict[str, list[str]] | None = None, nbr_default: bool = False) -> ConfigView:
    """The plain HF-format drafter config (vLLM, SpecForge, ModelOpt, TorchSpec, SafeAILab). Aux ids are where vLLM
    0.32 looks (top level, else ``eagle_config``); their convention is decided only by ``aux_fingerprint``."""
    cfg = dict(cfg or {})
    ec = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), dict) else {}
    flat = dict(cfg)
    nested: dict[str, str] = {}
    # vLLM: norm_before_fc from eagle_config first, then top level; fc_norm / norm_output top level only
    if "norm_before_fc" in ec:
        flat["norm_before_fc"] = ec["norm_before_fc"]
        if "norm_before_fc" not in cfg:
            nested["norm_before_fc"] = "eagle_config"
    for k in ("fc_norm", "norm_output", "use_aux_norm"):
        if k in ec and k not in cfg:
            nested[k] = "eagle_config"
    ids, src = None, "none"
    if isinstance(cfg.get("eagle_aux_hidden_state_layer_ids"), list) and cfg["eagle_aux_hidden_state_layer_ids"]:
        ids, src = cfg["eagle_aux_hidden_state_layer_ids"], "top-level"
    elif isinstance(ec.get("eagle_aux_hidden_state_layer_ids"), list) and ec["eagle_aux_hidden_state_layer_ids"]:
        ids, src = ec["eagle_aux_hidden_state_layer_ids"], "eagle_config"
    if "num_aux_hidden_states" not in flat and isinstance(ec.get("eagle_aux_hidden_state_layer_ids"), list):
        flat["_eagle_config_num_aux"] = len(ec["eagle_aux_hidden_state_layer_ids"])
    if ids is not None and not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise CheckpointError(f"eagle_aux_hidden_state_layer_ids must be a list of integers, found {ids!r}")
    return ConfigView(flat, ids, src, aux_fingerprint, nbr_default, nested, dict(aux_notes or {}))


# ----- derivation -------------------------------------------------------------------------------------------------
def _int(flat: dict[str, Any], key: str) -> int | None:
    v = flat.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or v <= 0:
        return None
    return int(v)


def _flag(flat: dict[str, Any], key: str) -> bool | None:
    v = flat.get(key)
    return bool(v) if isinstance(v, (bool, int)) else None


def _guess_head_dim(qrows: int, kvrows: int, h: int) -> int:
    for hd in (128, 64, 96, 80, 256, 160, 112, 192, 32, 48, 16):
        if qrows % hd == 0 and kvrows % hd == 0 and hd <= qrows:
            return hd
    return kvrows


def derive(
    root: Path,
    store: TensorStore,
    scan: NameScan,
    view: ConfigView,
    *,
    producer: str,
    layout: str,
    raw_config: dict[str, Any] | None,
    quantization: dict[str, Any] | None = None,
    strict_layers_check: bool = True,
) -> Checkpoint:
    """Build the Checkpoint: DrafterConfig from the weights first, config second; structural findings."""
    findings: list[Finding] = []
    nm = scan.name_map
    infos = store.infos
    shapes = logical_shapes(nm, infos, quantization)
    flat = view.flat
    where = f"{root}"

    def shp(c: str) -> tuple[int, ...] | None:
        return shapes.get(c)

    def need(c: str) -> tuple[int, ...]:
        s = shp(c)
        if s is None:
            raise CheckpointError(f"{where}: no '{c}' tensor (stored {'midlayer.' if scan.midlayer else ''}names: {len(nm)}); not an EAGLE drafter?")
        return s

    layer_ids = sorted({int(m.group(1)) for c in nm if (m := _LAYER_RE.match(c))})
    if not layer_ids:
        raise CheckpointError(f"{where}: no decoder-layer tensors (layers.N.* or midlayer.*): not an EAGLE drafter")
    if layer_ids != list(range(len(layer_ids))):
        raise CheckpointError(f"{where}: decoder layers {layer_ids} are not numbered 0..{len(layer_ids) - 1}")
    num_layers = len(layer_ids)
    mla = is_mla(list(nm), flat)

    # H
    pal = shp("layers.0.post_attention_layernorm.weight")
    norm = shp("norm.weight")
    hn = shp("layers.0.hidden_norm.weight")
    if pal is not None:
        h = pal[0]
    elif norm is not None:
        h = norm[0]
    elif hn is not None:
        h = hn[0]
    else:
        o = need("layers.0.self_attn.o_proj.weight")
        h = o[0]
    for c, s in (("norm.weight", norm), ("layers.0.hidden_norm.weight", hn), ("layers.0.post_attention_layernorm.weight", pal)):
        if s is not None and s != (h,):
            raise CheckpointError(f"{where}: contradicting shapes: '{c}' is {list(s)} but the hidden size is {h}")
    fc = need("fc.weight")
    if len(fc) != 2 or fc[0] != h:
        raise CheckpointError(f"{where}: contradicting shapes: fc.weight is {list(fc)}, expected [{h}, K*Ht]")
    fc_in = fc[1]

    # q/k/v (llama) or MLA
    if mla:
        qin_shape = shp("layers.0.self_attn.q_a_proj.weight") or shp("layers.0.self_attn.q_proj.weight") or shp("layers.0.self_attn.kv_a_proj_with_mqa.weight")
        qin = qin_shape[1] if qin_shape else 2 * h
    else:
        q = need("layers.0.self_attn.q_proj.weight")
        k = need("layers.0.self_attn.k_proj.weight")
        v = need("layers.0.self_attn.v_proj.weight")
        qin = q[1]
        if k[1] != qin or v[1] != qin or k[0] != v[0]:
            raise CheckpointError(f"{where}: contradicting shapes: q/k/v projections {list(q)}, {list(k)}, {list(v)}")
    if qin == 2 * h:
        generation = "eagle3"
    elif qin == h:
        generation = "eagle2"
    else:
        raise CheckpointError(f"{where}: contradicting shapes: layer-0 attention input is {qin}, expected 2*H = {2 * h} (EAGLE-3) or H = {h} (EAGLE-1/2)")
    if generation == "eagle2" and fc_in != 2 * h:
        raise CheckpointError(f"{where}: contradicting shapes: an EAGLE-1/2 fc must be [H, 2H] = [{h}, {2 * h}], found {list(fc)}")

    # hidden size from config
    h_cfg = _int(flat, "hidden_size")
    if h_cfg is not None and h_cfg != h:
        findings.append(finding("error", "hidden_size_mismatch", f"config hidden_size={h_cfg} but the weights have H={h}; vLLM builds the drafter from the config and fails or mis-loads"))

    # Ht and K
    ht_cfg = _int(flat, "target_hidden_size")
    fcn0 = shp("fc_norm.0.weight")
    if generation == "eagle2":
        ht, k_aux = h, 2
    else:
        ht = fcn0[0] if fcn0 is not None else (ht_cfg or h)
        if fcn0 is not None and ht_cfg is not None and ht_cfg != fcn0[0]:
            findings.append(finding("error", "target_hidden_size_mismatch", f"config target_hidden_size={ht_cfg} but fc_norm.0.weight is [{fcn0[0]}]"))
        n_ids = len(view.aux_ids) if view.aux_ids else None
        k_hint = _int(flat, "num_aux_hidden_states") or n_ids or flat.get("_eagle_config_num_aux") or 3
        if fc_in % ht:
            findings.append(finding("error", "fc_width_not_multiple", f"fc input width {fc_in} is not a multiple of Ht={ht}: vLLM cannot build fc for this drafter"))
            if fc_in % k_hint:
                raise CheckpointError(f"{where}: contradicting shapes: fc input width {fc_in} is neither a multiple of Ht={ht} nor of K={k_hint}")
            ht = fc_in // k_hint
        k_aux = fc_in // ht
        if ht_cfg is None and ht == h and k_aux not in (2, 3, 4, 5) and n_ids and fc_in % n_ids == 0:
            # no target_hidden_size and a K that makes no sense with Ht = H: trust the id count
            ht, k_aux = fc_in // n_ids, n_ids
            findings.append(finding("warning", "target_hidden_size_missing", f"config has no target_hidden_size; Ht={ht} inferred from fc width {fc_in} and {n_ids} aux ids"))
        if ht != h and ht_cfg is None and fcn0 is None:
            findings.append(finding("warning", "target_hidden_size_missing", f"Ht={ht} differs from H={h} but the config has no target_hidden_size: vLLM will size fc as K*H"))
        if ht_cfg is None and fcn0 is not None and ht != h:
            findings.append(finding("error", "target_hidden_size_missing", f"fc_norm weights are [{ht}] (= Ht) but the config has no target_hidden_size: vLLM would build fc and fc_norm for H={h}"))
        if k_aux != 3 and _int(flat, "num_aux_hidden_states") is None and flat.get("_eagle_config_num_aux") != k_aux:
            findings.append(finding("warning", "num_aux_missing", f"K={k_aux} aux states but no num_aux_hidden_states in the config: vLLM builds fc for 3 (vllm#54526)"))

    # heads
    mla_sizes: dict[str, int | None] = {}
    if mla:
        mla_sizes = _mla_sizes(shp, flat, h, findings, where)
        nh = mla_sizes.pop("num_attention_heads")
        hd = mla_sizes["qk_nope_head_dim"] + mla_sizes["qk_rope_head_dim"]
        nkv = nh
    else:
        qrows, kvrows = q[0], k[0]
        hd_cfg = _int(flat, "head_dim")
        qn = shp("layers.0.self_attn.q_norm.weight")
        nh_cfg = _int(flat, "num_attention_heads")
        nkv_cfg = _int(flat, "num_key_value_heads")
        if generation == "eagle2" and nh_cfg and qrows % nh_cfg == 0:
            hd = qrows // nh_cfg  # SafeAILab EAGLE-1 ignores head_dim: hd = H / nh
        elif hd_cfg and qrows % hd_cfg == 0 and kvrows % hd_cfg == 0:
            hd = hd_cfg
        elif qn is not None:
            hd = qn[0]
        elif nh_cfg and qrows % nh_cfg == 0 and kvrows % (qrows // nh_cfg) == 0:
            hd = qrows // nh_cfg
        else:
            hd = _guess_head_dim(qrows, kvrows, h)
            findings.append(finding("info", "head_dim_guessed", f"no usable head_dim / num_attention_heads in the config: head_dim={hd} guessed from q/k widths {qrows}/{kvrows}"))
        if hd_cfg and hd_cfg != hd:
            findings.append(finding("error", "head_dim_mismatch", f"config head_dim={hd_cfg} does not fit q/k widths {qrows}/{kvrows} (head_dim {hd} does)"))
        if qrows % hd or kvrows % hd:
            raise CheckpointError(f"{where}: contradicting shapes: q/k widths {qrows}/{kvrows} are not multiples of head_dim {hd}")
        nh, nkv = qrows // hd, kvrows // hd
        if nh % nkv:
            raise CheckpointError(f"{where}: contradicting shapes: {nh} query heads are not a multiple of {nkv} kv heads")
        if nh_cfg and nh_cfg != nh:
            findings.append(finding("error", "num_heads_mismatch", f"config num_attention_heads={nh_cfg} but the weights have {nh} heads of {hd}"))
        if nkv_cfg and nkv_cfg != nkv:
            findings.append(finding("error", "num_kv_heads_mismatch", f"config num_key_value_heads={nkv_cfg} but the weights have {nkv}"))
        o = shp("layers.0.self_attn.o_proj.weight")
        if o is not None and o != (h, qrows):
            raise CheckpointError(f"{where}: contradicting shapes: o_proj is {list(o)}, expected [{h}, {qrows}]")

    family = "mla" if mla else _family(nm, flat, layout, num_layers, hd, h, nh, _int(flat, "head_dim"), findings, where, shp)

    # MLP
    gp = shp("layers.0.mlp.gate_proj.weight")
    if gp is None:
        raise CheckpointError(f"{where}: no 'layers.0.mlp.gate_proj.weight' tensor: not a Llama-style drafter layer")
    inter = gp[0]
    up, dp = shp("layers.0.mlp.up_proj.weight"), shp("layers.0.mlp.down_proj.weight")
    if gp[1] != h or (up is not None and up != gp) or (dp is not None and dp != (h, inter)):
        raise CheckpointError(f"{where}: contradicting shapes: MLP gate/up/down are {list(gp)}, {list(up or ())}, {list(dp or ())} for H={h}")
    for i in range(1, num_layers):
        qi = shp(f"layers.{i}.self_attn.q_proj.weight")
        if qi is not None and qi[1] != h:
            raise CheckpointError(f"{where}: contradicting shapes: layers.{i}.self_attn.q_proj takes {qi[1]} inputs, expected H={h}")

    # vocab
    lm = shp("lm_head.weight")
    emb = shp("embed_tokens.weight")
    t2d = shp("t2d")
    d2t = shp("d2t")
    if lm is not None and (len(lm) != 2 or lm[1] != h):
        raise CheckpointError(f"{where}: contradicting shapes: lm_head.weight is {list(lm)}, expected [Vd, {h}]")
    if emb is not None and (len(emb) != 2 or emb[1] != h):
        raise CheckpointError(f"{where}: contradicting shapes: embed_tokens.weight is {list(emb)}, expected [V, {h}]")
    v_cfg = _int(flat, "vocab_size")
    vd_cfg = _int(flat, "draft_vocab_size")
    if t2d is not None:
        v = t2d[0]
    elif emb is not None:
        v = emb[0]
    elif v_cfg is not None:
        v = v_cfg
    else:
        v = None
    if lm is not None:
        vd = lm[0]
    elif d2t is not None:
        vd = d2t[0]
    else:
        vd = vd_cfg or v
    if v is None:
        v = vd
    if v is None:
        raise CheckpointError(f"{where}: cannot tell the vocabulary size (no lm_head, embed_tokens, t2d or config vocab_size)")
    if v_cfg is not None and v_cfg != v:
        findings.append(finding("error", "vocab_size_mismatch", f"config vocab_size={v_cfg} but the weights say V={v}"))
    if vd_cfg is not None and vd is not None and vd_cfg != vd:
        findings.append(finding("error", "draft_vocab_size_mismatch", f"config draft_vocab_size={vd_cfg} but lm_head has {vd} rows: vLLM fails with a size mismatch (EAGLE#249)"))
    if d2t is not None and d2t != (vd,):
        raise CheckpointError(f"{where}: contradicting shapes: d2t is {list(d2t)} but lm_head has {vd} rows")
    if vd > v:
        findings.append(finding("error", "draft_vocab_exceeds_vocab", f"draft vocab Vd={vd} > target vocab V={v}"))
    if generation == "eagle3" and lm is None:
        sev = "error" if vd != v else "warning"
        findings.append(finding(sev, "no_lm_head", "no lm_head.weight: vLLM shares the target's head" + (" (valid only when Vd = V)" if vd != v else ", which is only right if the drafter was trained with it")))
    if generation == "eagle3" and vd != v and d2t is None:
        findings.append(finding("error", "d2t_missing", f"reduced draft vocab (Vd={vd} < V={v}) without d2t: vLLM maps draft ids as identity and drafts wrong tokens"))
    if generation == "eagle3" and vd == v and d2t is not None:
        findings.append(finding("error", "d2t_with_full_vocab", "d2t present although Vd = V: vLLM >= 0.30 refuses to load it ('no module or parameter named draft_id_to_target_id'); drop it"))

    # flags
    e3 = generation == "eagle3"
    fc_norm_w = sorted(int(m.group(1)) for c in nm if (m := re.match(r"^fc_norm\.(\d+)\.weight$", c)))
    if fc_norm_w and not e3:
        raise CheckpointError(f"{where}: contradicting tensors: fc_norm.* weights in an EAGLE-1/2 drafter")
    if not e3:  # EAGLE-1/2 configs carry no EAGLE-3 flags that mean anything
        flat = {k: v for k, v in flat.items() if k not in ("fc_norm", "norm_output", "norm_before_fc", "use_aux_norm")}
        view.nested_flags = {}
    fc_norm_cfg = _flag(flat, "fc_norm")
    if fc_norm_cfg is None and _flag(flat, "use_aux_norm") is not None:
        fc_norm_cfg = _flag(flat, "use_aux_norm")
        findings.append(finding("warning", "fc_norm_alias", "config uses the SGLang alias use_aux_norm; vLLM reads only fc_norm"))
    fc_norm = bool(fc_norm_cfg) or bool(fc_norm_w)
    if fc_norm_w:
        if fc_norm_w != list(range(k_aux)):
            findings.append(finding("error", "fc_norm_weights_incomplete", f"fc_norm weights {fc_norm_w} do not cover the K={k_aux} aux chunks; vLLM silently uses ones for the missing ones"))
        for i in fc_norm_w:
            s = shp(f"fc_norm.{i}.weight")
            if s != (ht,):
                raise CheckpointError(f"{where}: contradicting shapes: fc_norm.{i}.weight is {list(s or ())}, expected [Ht={ht}]")
        if not fc_norm_cfg:
            where_flag = view.nested_flags.get("fc_norm")
            findings.append(finding("error", "fc_norm_flag_missing", "fc_norm.* weights present but the config does not set fc_norm: true at the top level"
                                    + (f" (it is only in {where_flag})" if where_flag else "") + ": vLLM refuses to load ('no module or parameter named fc_norm')"))
    elif fc_norm_cfg:
        findings.append(finding("error", "fc_norm_weights_missing", "config sets fc_norm: true but there are no fc_norm.* weights: vLLM silently loads all-ones norms"))
    elif view.nested_flags.get("fc_norm"):
        findings.append(finding("error", "flag_nested_only", f"fc_norm is set only in {view.nested_flags['fc_norm']}; vLLM reads it at the top level only and ignores it"))

    input_norm = shp("input_norm.weight")
    nbf_cfg = _flag(flat, "norm_before_fc")
    norm_before_fc = bool(nbf_cfg) or input_norm is not None
    if input_norm is not None:
        if input_norm != (fc_in,):
            raise CheckpointError(f"{where}: contradicting shapes: input_norm.weight is {list(input_norm)}, expected [K*Ht={fc_in}]")
        if not nbf_cfg:
            findings.append(finding("error", "norm_before_fc_flag_missing", "input_norm.weight present but norm_before_fc is not set: vLLM silently drops input_norm"))
    elif nbf_cfg:
        findings.append(finding("error", "input_norm_missing", "norm_before_fc: true but no input_norm.weight: vLLM silently uses an all-ones norm"))
    if view.nested_flags.get("norm_before_fc"):
        findings.append(finding("warning", "norm_before_fc_nested", "norm_before_fc is only inside eagle_config: vLLM reads it there, SGLang and older tools read the top level (vllm PR #42143, sglang#32334)"))

    no_cfg = _flag(flat, "norm_output")
    norm_output = bool(no_cfg)
    if no_cfg is None and view.nested_flags.get("norm_output"):
        findings.append(finding("error", "flag_nested_only", f"norm_output is set only in {view.nested_flags['norm_output']}; vLLM reads it at the top level only and ignores it"))
    if norm_output:
        findings.append(finding("info", "norm_output_unverifiable", "norm_output: true is carried by no weight: it must match how the drafter was trained (post-norm state fed back)"))
        if producer == "specforge":
            findings.append(finding("warning", "specforge_norm_output_semantics", "SpecForge before PR #879 trained with the pre-norm state fed back even with norm_output: true; vLLM feeds the post-norm state. Check the SpecForge version, or validate the acceptance length"))
    nbr = _flag(flat, "norm_before_residual")
    norm_before_residual = view.norm_before_residual_default if nbr is None else nbr

    # aux ids: the stored ids and their convention are separate facts (eagle_migrate.aux_ids)
    from .. import aux_ids as _aux

    aux = _aux.from_stored(view.aux_ids, view.aux_ids_source, fingerprint=view.aux_fingerprint, notes=view.aux_notes)
    aux_ids: list[int] | None = None
    meta: dict[str, Any] = {"aux_ids_stored": view.aux_ids, "aux_ids_source": view.aux_ids_source,
                            "prefix_stripped": scan.prefix, "midlayer": scan.midlayer, "logical_shapes": shapes,
                            "ignored_tensors": scan.ignored}
    if generation == "eagle3":
        if view.aux_ids is None:
            findings.append(finding("warning", "aux_ids_missing", "no eagle_aux_hidden_state_layer_ids: vLLM silently falls back to (2, T//2, T-3); the ids the drafter was trained on must be written explicitly"))
        else:
            # the decided reading, or while undecided the literal one (what vLLM does with this checkpoint)
            ids = aux.ids if aux.decided else list(view.aux_ids)
            problems = _aux.check_aux_ids_alone(ids, k_aux)  # the target's part: inspect's pairing
            findings.extend(problems)
            if not any(f.severity == "error" for f in problems):
                aux_ids = sorted(ids)
            findings.extend(_aux.findings(aux, producer))
            if view.aux_ids_source == "eagle_config":
                findings.append(finding("warning", "aux_ids_nested_only", "aux ids only in eagle_config: vLLM's GPU Model Runner V2 (default from 0.29) reads only top-level ids and silently falls back to defaults"))

    # rope / positions
    theta, scaling = rope_from_config(flat)
    if flat and "rope_theta" not in flat and not isinstance(flat.get("rope_parameters"), dict) and generation == "eagle3":
        findings.append(finding("info", "rope_theta_missing", "config has no rope_theta: 10000 assumed (SpecForge#265); copy the target's"))
    mpe = _int(flat, "max_position_embeddings") or 2048
    eps = flat.get("rms_norm_eps")
    eps = float(eps) if isinstance(eps, (int, float)) and not isinstance(eps, bool) and eps > 0 else 1e-5

    # layer count
    nhl = _int(flat, "num_hidden_layers")
    if nhl is not None and nhl != num_layers and strict_layers_check:
        findings.append(finding("error", "num_hidden_layers_mismatch", f"config num_hidden_layers={nhl} but the weights hold {num_layers} decoder layer(s): vLLM would build {nhl} layers and leave the extra ones random"))

    if h != ht and generation == "eagle3" and emb is None:
        findings.append(finding("error", "embed_tokens_missing", f"H={h} differs from Ht={ht} but there is no embed_tokens.weight: vLLM fails (KeyError 'embed_tokens.weight', vllm#18906)"))
    if scan.prefix:
        findings.append(finding("error", "model_prefix", "tensor names carry a 'model.' prefix: vLLM fails ('no module or parameter named model'); convert to strip it"))
    if flat.get("tie_word_embeddings") is True and generation == "eagle3":
        findings.append(finding("warning", "tie_word_embeddings", "tie_word_embeddings: true; EAGLE-3 drafters need an untied lm_head"))
    if scan.ignored:
        findings.append(finding("info", "ignored_tensors", f"dropped training-only tensors: {', '.join(scan.ignored)}"))

    if mla:
        norm_before_fc = _mla_traps(flat, mla_sizes, aux_ids, norm_before_fc, input_norm is not None, lm is not None,
                                    vd, scaling, findings)

    # sliding-window draft layers, as vLLM reads them for this family (carried into DrafterConfig)
    layer_types, window, problem = attention_windows_of(flat, family, num_layers)
    if problem:
        sev = "warning" if family == "mla" else "error"  # MLA: our drafter does as vLLM does (no window)
        findings.append(finding(sev, "sliding_window", f"layer_types / sliding_window not applied: {problem}"))
    elif window is not None:
        layers = [i for i, t in enumerate(layer_types) if t == "sliding_attention"]
        if len(layers) < num_layers:  # llm_base_proposer.validate_same_kv_cache_group
            findings.append(finding("error", "sliding_window", f"draft layer(s) {layers} are sliding-window and the "
                                    "others full attention: vLLM 0.32 refuses to load such a drafter ('All drafting "
                                    "layers should belong to the same kv cache group')"))
        findings.append(finding("info", "sliding_window", f"draft layer(s) {layers} use sliding-window attention of "
                                f"{window} tokens (a query sees the last {window} positions; speculators' trainer "
                                "default is 2048), as vLLM serves them: carried by eagle-migrate's drafter and "
                                "written into every layout it converts to"))

    try:
        cfg = DrafterConfig(
            generation=generation,
            hidden_size=h,
            target_hidden_size=ht,
            num_aux=k_aux if generation == "eagle3" else 3,
            vocab_size=max(v, vd),
            draft_vocab_size=vd,
            intermediate_size=inter,
            num_attention_heads=nh,
            num_key_value_heads=nkv,
            head_dim=hd,
            num_layers=num_layers,
            rms_norm_eps=eps,
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=mpe,
            aux_layer_ids=aux_ids,
            fc_norm=fc_norm if generation == "eagle3" else False,
            norm_output=norm_output if generation == "eagle3" else False,
            norm_before_fc=norm_before_fc if generation == "eagle3" else False,
            norm_before_residual=norm_before_residual,
            attention_bias=("layers.0.self_attn.q_proj.bias" in nm),
            fc_bias=("fc.bias" in nm),
            has_lm_head=lm is not None,
            has_embed_tokens=emb is not None,
            architecture=family,
            layer_types=layer_types,
            sliding_window=window,
            **mla_sizes,
        )
    except ValidationError as e:
        err = e.errors()[0]
        raise CheckpointError(f"{where}: inconsistent drafter description ({'.'.join(str(x) for x in err['loc'])}: {err['msg']})") from None
    meta["vocab_size_declared"] = v
    return Checkpoint(
        path=root, config=cfg, producer=producer, store=store, name_map=dict(nm), raw_config=raw_config,
        quantization=quantization, findings=findings, layout=layout, meta=meta, aux=aux if generation == "eagle3" else None,
    )


def weights_generation(p: Any) -> str:
    """'eagle3', 'eagle2' or 'unknown' from the layer-0 shapes alone (attention input 2H vs H); cached on the probe."""
    if "_generation" in p.side:
        return p.side["_generation"]
    nm = p.scan.name_map
    quant = quant_scheme(p.config, p.side.get("hf_quant_config.json"))
    shapes = logical_shapes(nm, p.store.infos, quant)
    h = None
    for c in ("layers.0.post_attention_layernorm.weight", "norm.weight", "layers.0.hidden_norm.weight"):
        if c in shapes and len(shapes[c]) == 1:
            h = shapes[c][0]
            break
    q = None
    for c in ("layers.0.self_attn.q_proj.weight", "layers.0.self_attn.q_a_proj.weight", "layers.0.self_attn.kv_a_proj_with_mqa.weight"):
        if c in shapes and len(shapes[c]) == 2:
            q = shapes[c][1]
            break
    gen = "unknown"
    if h is not None and q is not None:
        gen = "eagle3" if q == 2 * h else "eagle2" if q == h else "unknown"
    elif "layers.0.hidden_norm.weight" in nm or p.scan.midlayer:
        gen = "eagle3"
    p.side["_generation"] = gen
    return gen
