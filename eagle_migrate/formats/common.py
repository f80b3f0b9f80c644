"""What every layout reader shares: stored -> canonical names, logical shapes of packed tensors, and ``derive``:
the ``Checkpoint`` (its ``DrafterConfig`` and findings) from a reader's name scan and config view.

Canonical names are the vLLM-layout names (``fc.weight``, ``layers.0.self_attn.q_proj.weight``, ``norm.weight``,
``lm_head.weight``, ``d2t``, ...). A layout reader only has to say how its config is to be read (``ConfigView``).
The sizes come from the tensors first, the config second (``formats.sizes``); the traps are ``formats.checks``'
small per-topic checks, every code in the one table ``formats.traps``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .. import families
from ..drafter.config import DrafterConfig
from ..errors import CheckpointError
from . import checks
from .base import Checkpoint
from .io import TensorInfo, TensorStore
from .sizes import cfg_flag, config_values, derive_sizes, eagle3_flags_only
from .traps import finding  # noqa: F401 (readers import it from here)

# Tensors a compressed-tensors / ModelOpt quantized linear carries next to (or instead of) ``.weight``.
QUANT_SUFFIXES = (
    "weight_packed", "weight_scale", "weight_scale_2", "weight_zero_point", "weight_global_scale", "weight_shape",
    "weight_g_idx", "input_scale", "input_global_scale", "input_zero_point", "output_scale", "k_scale", "v_scale",
)
# Names some trainers save that are not part of the drafter (dropped on read, reported as info).
IGNORED_NAMES = ("verifier_lm_head.weight", "verifier_norm.weight", "verifier_norm.bias")
SPECULATORS_ARCHS = ("Eagle3Speculator", "Eagle3DraftModel")


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



def is_eagle3_arch(arch: Any) -> bool:
    """An EAGLE-3 drafter architecture: a registered family's (``Family.eagle3_archs``) or speculators'."""
    return arch in SPECULATORS_ARCHS or any(arch in f.eagle3_archs for f in families.all_families())


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
    # the convention the producer's training code captures, and where that was read (aux_ids.resolve uses it only
    # when the readings are equivalent on the target)
    aux_producer: tuple[str, str] | None = None


def hf_view(cfg: dict[str, Any] | None, *, aux_fingerprint: tuple[str, str] | None = None,
            aux_notes: dict[str, list[str]] | None = None, nbr_default: bool = False,
            aux_producer: tuple[str, str] | None = None) -> ConfigView:
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
    return ConfigView(flat, ids, src, aux_fingerprint, nbr_default, nested, dict(aux_notes or {}), aux_producer)


# ----- our own writer's mark --------------------------------------------------------------------------------------
# Stages that keep the layout (quantize, a passthrough convert) carry undecided aux ids verbatim and say so in the
# config block our writer adds: {"eagle_migrate": {..., "aux_ids_convention": "undecided", "aux_ids_stored": [...]}}
UNDECIDED_MARK = "undecided"


def our_fingerprint(cfg: dict[str, Any]) -> tuple[str, str] | None:
    """The fingerprint of our own writer (config key ``eagle_migrate``), which stores vLLM ids -- unless the block
    says the ids were carried undecided (:data:`UNDECIDED_MARK`: quantize / a passthrough convert of a checkpoint
    whose convention nothing decided)."""
    block = cfg.get("eagle_migrate")
    if not isinstance(block, dict) or block.get("aux_ids_convention") == UNDECIDED_MARK:
        return None
    return ("vllm", "written by eagle-migrate (config key eagle_migrate), whose writer stores vLLM ids")


CARRIED_NOTE = ("written by eagle-migrate with the stored ids carried as they were (eagle_migrate.aux_ids_convention: "
                "undecided): the convention was never decided")


def carried_mark(a: Any) -> dict[str, Any]:
    """What our writer adds to its ``eagle_migrate`` config block for ``a``: the undecided mark, else nothing."""
    if a is not None and a.stored is not None and not a.decided:
        return {"aux_ids_convention": UNDECIDED_MARK, "aux_ids_stored": list(a.stored)}
    return {}


# ----- derivation -------------------------------------------------------------------------------------------------
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
    """Build the Checkpoint: the sizes from the weights first, config second (formats.sizes); the traps the
    checkpoint sets, in order (formats.checks)."""
    nm = scan.name_map
    shapes = logical_shapes(nm, store.infos, quantization)
    where = f"{root}"

    def missing(c: str) -> str:
        return f"{where}: no '{c}' tensor (stored {'midlayer.' if scan.midlayer else ''}names: {len(nm)}); not an EAGLE drafter?"

    s = derive_sizes(list(nm), shapes.get, view.flat, layout=layout, aux_ids=view.aux_ids, where=where, missing=missing)
    flat = view.flat
    findings = [*checks.hidden_size_checks(s, flat), *checks.head_checks(s, flat), *checks.vocab_checks(s, flat)]
    flat = eagle3_flags_only(flat, s.generation)
    if s.generation != "eagle3":
        view.nested_flags = {}
    cv = config_values(s, flat, view.norm_before_residual_default)
    findings += [*checks.fc_norm_checks(s, flat, view.nested_flags), *checks.input_norm_checks(s, flat, view.nested_flags),
                 *checks.norm_output_checks(flat, view.nested_flags, producer)]
    aux, aux_ids, aux_findings = checks.aux_id_checks(s, view, producer)
    findings += [*aux_findings, *checks.structure_checks(s, flat, scan, strict_layers_check),
                 *checks.family_checks(s, flat, aux_ids, cv.rope_scaling), *checks.window_checks(s, cv)]
    e3 = s.generation == "eagle3"
    try:
        cfg = DrafterConfig(
            generation=s.generation, hidden_size=s.hidden_size, target_hidden_size=s.target_hidden_size, num_aux=s.num_aux if e3 else 3,
            vocab_size=max(s.vocab_size, s.draft_vocab_size), draft_vocab_size=s.draft_vocab_size, intermediate_size=s.intermediate_size,
            num_attention_heads=s.num_heads, num_key_value_heads=s.num_kv_heads, head_dim=s.head_dim, num_layers=s.num_layers,
            rms_norm_eps=cv.rms_norm_eps, rope_theta=cv.rope_theta, rope_scaling=cv.rope_scaling,
            max_position_embeddings=cv.max_position_embeddings, aux_layer_ids=aux_ids,
            fc_norm=cv.fc_norm and e3, norm_output=cv.norm_output and e3, norm_before_fc=cv.norm_before_fc and e3,
            norm_before_residual=cv.norm_before_residual,
            attention_bias=("layers.0.self_attn.q_proj.bias" in nm), fc_bias=("fc.bias" in nm),
            has_lm_head=s.lm_head_shape is not None, has_embed_tokens=s.embed_shape is not None, architecture=s.family,
            layer_types=cv.layer_types, sliding_window=cv.sliding_window, **s.family_sizes,
        )
    except ValidationError as e:
        err = e.errors()[0]
        raise CheckpointError(f"{where}: inconsistent drafter description ({'.'.join(str(x) for x in err['loc'])}: {err['msg']})") from None
    meta: dict[str, Any] = {"aux_ids_stored": view.aux_ids, "aux_ids_source": view.aux_ids_source,
                            "prefix_stripped": scan.prefix, "midlayer": scan.midlayer, "logical_shapes": shapes,
                            "ignored_tensors": scan.ignored, "vocab_size_declared": s.vocab_size,
                            "norm_before_residual_stated": cfg_flag(flat, "norm_before_residual") is not None}
    return Checkpoint(
        path=root, config=cfg, producer=producer, store=store, name_map=dict(nm), raw_config=raw_config,
        quantization=quantization, findings=findings, layout=layout, meta=meta, aux=aux if e3 else None,
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
