"""``inspect_checkpoint``: what a drafter checkpoint is, and every trap that would make vLLM load it silently wrong.

Cheap by construction: safetensors are read through their headers (names, shapes, dtypes); the only tensor data
read are ``d2t``/``t2d`` and small tensors (norm weights and anything of at most ``SMALL_NUMEL`` elements, for the
NaN/Inf check). ``deep=True`` checks every tensor for NaN/Inf, one tensor at a time. With a target, the pairing is
checked from the target's config.json; the target is run when the stored aux ids can be read two ways and nothing in
the checkpoint decides (the measurement of :mod:`eagle_migrate.aux_evidence`), and for the drafter's fit to it
(:mod:`eagle_migrate.target_fit`: step 0 on the target's own text; without --target nothing is run).

Findings have a stable ``code`` (one table: formats/traps.py; docs/formats.md shows it) and a severity: ``error`` (vLLM refuses it or runs
it wrongly: exit 1), ``warning`` (probably wrong, or wrong on some vLLM versions) and ``info``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, get_type_hints

import numpy as np
from pydantic import BaseModel, Field, create_model

from . import families
from .devices import resolve_device, resolve_dtype
from .errors import TargetError
from .formats import aux_ids as _aux
from .formats import read_checkpoint
from .formats.aux_ids import AuxIds, Convention
from .formats.base import Checkpoint, Finding
from .formats.common import QUANT_SUFFIXES
from .formats.traps import finding
from .pairing import TargetInfo, pairing_findings

SMALL_NUMEL = 1 << 16


class _CommonSizes(BaseModel):
    """The sizes every family has."""

    hidden_size: int = Field(..., description="H")
    target_hidden_size: int = Field(..., description="Ht (fc input is K*Ht)")
    num_aux: int = Field(..., description="K, aux hidden states fused by fc (EAGLE-1/2: fc takes cat(embed, h), reported as 2)")
    vocab_size: int = Field(..., description="V, target vocabulary")
    draft_vocab_size: int = Field(..., description="Vd, lm_head rows")
    intermediate_size: int = Field(..., description="I, MLP width")
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_layers: int = Field(..., description="decoder layers, counted from the weights")


class ReportSizes(families.report_fields_model(), _CommonSizes):
    """H, Ht, K, V, Vd, I, heads and layers of the drafter (from its weights), then each family's own sizes
    (``Family.report_fields``: None unless the drafter is of that family)."""


class Flags(BaseModel):
    fc_norm: bool
    norm_output: bool
    norm_before_fc: bool
    norm_before_residual: bool


class FileEntry(BaseModel):
    name: str
    bytes: int


class _TargetSummaryBase(BaseModel):
    @classmethod
    def of(cls, info: Any) -> TargetSummary:
        """The summary of a :class:`eagle_migrate.pairing.TargetInfo` (its fields of the same names)."""
        return cls.model_validate({name: getattr(info, name) for name in cls.model_fields} | {"path": str(info.path)})


# the target's config as the report shows it: TargetInfo's fields (their one definition), less the two it keeps for
# the run (rms_norm_eps, the raw config)
_TARGET_HINTS = get_type_hints(TargetInfo)
TargetSummary = create_model(
    "TargetSummary", __base__=_TargetSummaryBase, __doc__="The target's config as the pairing checks saw it.",
    **{f.name: (_TARGET_HINTS[f.name], ...) for f in dataclasses.fields(TargetInfo) if f.name not in ("rms_norm_eps", "raw")})


class InspectReport(BaseModel):
    """Everything ``eagle-migrate inspect`` prints (one JSON document with --json)."""

    path: str
    format: str = Field(..., description="eagle2 (EAGLE-1/2 weights), eagle3 or eagle3.1")
    producer: str = Field(..., description="safeailab, specforge, speculators, modelopt, torchspec, vllm, eagle-migrate or unknown")
    layout: str = Field(..., description="the reader that parsed it, e.g. safeailab-eagle3, torchspec-vllm")
    architecture: str = Field(..., description=f"the drafter family: {families.names_text()}")
    sizes: ReportSizes
    aux_layer_ids: list[int] | None = Field(..., description="in vLLM's convention (residual stream after i layers), ascending")
    aux_layer_ids_stored: list[int] | None = Field(..., description="as written in the checkpoint's config")
    aux_layer_ids_convention: str = Field(..., description="vllm (input-to-layer), output-of-layer (SpecForge/ModelOpt-style trainers) or undecided (aux_layer_ids is then the literal reading, what vLLM does)")
    aux_ids_evidence: AuxIds | None = Field(None, description="stored ids, where, both readings with their evidence, the decision and how it was made")
    flags: Flags
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    dtype: str = Field(..., description="dtype of the floating weights (or 'mixed: a, b')")
    num_parameters: int = Field(..., description="elements of all tensors (packed weights counted unpacked)")
    num_tensors: int
    files: list[FileEntry]
    total_bytes: int
    quantization: dict[str, Any] | None
    target: TargetSummary | None = None
    target_fit: Any = Field(None, description="with --target: whether the drafter fits it (a target_fit.TargetFit: the "
                            "config's evidence and step-0 agreement on the target's own text; --trained-for: the same "
                            "on the target it was trained for, the reference)")
    deep: bool = Field(False, description="every tensor was checked for NaN/Inf")
    findings: list[Finding]

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def ok(self) -> bool:
        return not self.errors


_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


# ----- tensor-value checks ---------------------------------------------------------------------------------------
def _is_norm(name: str) -> bool:
    return name.endswith("norm.weight") or name.startswith("fc_norm.") or name == "input_norm.weight"


def _check_finite(ck: Checkpoint, deep: bool) -> list[Finding]:
    bad: list[str] = []
    checked = 0
    for c, stored in ck.name_map.items():
        info = ck.store.infos[stored]
        if not (_is_norm(c) or info.numel <= SMALL_NUMEL or deep):
            continue
        if info.dtype in ("bool", "int8", "uint8", "int16", "int32", "int64"):
            continue
        a = ck.store.array(stored)  # numpy (bfloat16/float8 widened exactly): inspect never imports torch
        checked += 1
        if a.dtype.kind != "f":
            continue
        if not bool(np.isfinite(a).all()):
            bad.append(c)
        del a
    out = []
    if bad:
        out.append(finding("error", "nonfinite_weights", f"NaN/Inf in {len(bad)} tensor(s): {', '.join(bad[:6])}{' ...' if len(bad) > 6 else ''}"))
    if not deep:
        out.append(finding("info", "nonfinite_check_partial", f"NaN/Inf checked in {checked} norm/small tensor(s); --deep checks every tensor"))
    return out


def _check_vocab_maps(ck: Checkpoint, v_target: int | None) -> list[Finding]:
    out: list[Finding] = []
    cfg = ck.config
    v = v_target or ck.meta.get("vocab_size_declared") or cfg.vocab_size
    d2t = t2d = None
    d2t_int = False
    if ck.has("d2t"):
        d2t = ck.array("d2t")
        dtype = ck.info("d2t").dtype
        if d2t.dtype.kind in "fb":
            out.append(finding("error", "d2t_dtype", f"d2t has dtype {dtype}; it must hold int64 offsets"))
        else:
            d2t_int = True
            tgt = np.arange(d2t.size, dtype=np.int64) + d2t.reshape(-1).astype(np.int64)
            if d2t.size and (int(tgt.min()) < 0 or int(tgt.max()) >= v):
                out.append(finding("error", "d2t_out_of_range", f"draft id + d2t reaches [{int(tgt.min())}, {int(tgt.max())}], outside the target vocab [0, {v})"))
            if d2t.size > 1 and not bool((tgt[1:] > tgt[:-1]).all()):
                out.append(finding("error", "d2t_not_monotonic", "draft id + d2t is not strictly increasing: not an offset table (ids stored instead of offsets, or duplicated tokens)"))
            # (an identity table with Vd == V is reported as d2t_with_full_vocab by the reader)
    if ck.has("t2d"):
        t2d = ck.array("t2d").reshape(-1) != 0
        if t2d.size != v:
            out.append(finding("warning", "t2d_shape", f"t2d has {t2d.size} entries, the target vocab is {v} (vLLM ignores t2d)"))
        elif int(t2d.sum()) != cfg.draft_vocab_size:
            out.append(finding("warning", "t2d_inconsistent", f"t2d marks {int(t2d.sum())} tokens but Vd = {cfg.draft_vocab_size} (vLLM ignores t2d; d2t decides)"))
        elif d2t is not None and d2t_int:
            tgt = np.arange(d2t.size, dtype=np.int64) + d2t.reshape(-1).astype(np.int64)
            if int(tgt.min()) >= 0 and int(tgt.max()) < v and not bool(t2d[tgt].all()):
                out.append(finding("warning", "t2d_inconsistent", "t2d and d2t disagree about which target tokens are in the draft vocab (vLLM ignores t2d)"))
    return out


def _check_norm_weights(ck: Checkpoint) -> list[Finding]:
    """fc_norm weights that are all ones are what vLLM silently uses when they are missing: worth a remark."""
    out = []
    if ck.config.fc_norm:
        ones = []
        for k in range(ck.config.num_aux):
            n = f"fc_norm.{k}.weight"
            if ck.has(n):
                t = ck.array(n)
                if t.dtype.kind == "f" and bool((t == 1).all()):
                    ones.append(n)
        if ones and len(ones) == ck.config.num_aux:
            out.append(finding("info", "fc_norm_all_ones", "every fc_norm weight is exactly 1.0: an uncalibrated EAGLE-3.1 conversion?"))
    return out


# ----- target pairing ---------------------------------------------------------------------------------------------
# ----- report -----------------------------------------------------------------------------------------------------
def _dtype_summary(ck: Checkpoint) -> str:
    counts: dict[str, int] = {}
    for c, s in ck.name_map.items():
        info = ck.store.infos[s]
        if c in ("d2t", "t2d") or (c.rsplit(".", 1)[-1] in QUANT_SUFFIXES and not c.endswith(".weight_packed")):
            continue
        label = f"{info.dtype} (packed)" if c.endswith(".weight_packed") else info.dtype
        counts[label] = counts.get(label, 0) + info.numel
    if not counts:
        return "unknown"
    ordered = sorted(counts, key=lambda k: -counts[k])
    return ordered[0] if len(ordered) == 1 else "mixed: " + ", ".join(ordered)


def _num_parameters(ck: Checkpoint) -> int:
    shapes = ck.meta.get("logical_shapes", {})
    n = 0
    for c, s in ck.name_map.items():
        if c.rsplit(".", 1)[-1] in QUANT_SUFFIXES:
            if c.endswith(".weight_packed"):
                shp = shapes.get(c[: -len("_packed")])
                if shp:
                    k = 1
                    for x in shp:
                        k *= x
                    n += k
            continue
        shp = shapes.get(c) or ck.store.infos[s].shape
        k = 1
        for x in shp:
            k *= x
        n += k
    return n


_AUX_CODES = ("aux_ids_convention_ambiguous", "aux_ids_convention", "aux_ids_measured")


def _sizes_pair(ck: Checkpoint, ti: Any) -> bool:
    cfg = ck.config
    return cfg.target_hidden_size == ti.hidden_size and ck.meta.get("vocab_size_declared", cfg.vocab_size) == ti.vocab_size


def _measures_aux(ck: Checkpoint) -> bool:
    """inspect measures undecided aux ids on the target for this family (``Family.inspect_measures_aux_ids``)."""
    fam = families.find(ck.config.architecture)
    return fam is not None and fam.inspect_measures_aux_ids


def _resolve_aux(ck: Checkpoint, target: str | None, ti: Any, override: Convention | None, device: str) -> None:
    """Decide the aux-id convention where the checkpoint does not: the override, else (with a target) the readings
    valid on it, else a measurement. An inconclusive measurement is reported (a warning with the measurement and the
    flag), never refused: inspect changes nothing."""
    a: AuxIds | None = ck.aux
    lt = None
    if a is None or a.stored is None or ck.config.generation != "eagle3":
        return
    if ti is None:
        b = _aux.resolve(a, ck.config.num_aux, 0, override=override) if override else a
    elif (override or not a.decided) and _sizes_pair(ck, ti) and _measures_aux(ck) and not ck.quantization:
        from .aux_evidence import resolve_for_target  # lazy: torch stays out of inspect unless it measures
        from .target import LazyTarget  # lazy: torch, as aux_evidence

        dev = resolve_device(device)
        lt = LazyTarget(target, dev, resolve_dtype("auto", dev))
        try:
            b = resolve_for_target(ck, lt, override=override)
        except TargetError as e:  # e.g. a config-only target folder: report the ambiguity, say why it was not measured
            ck.findings = [f for f in ck.findings if f.code not in _AUX_CODES] + [
                f.model_copy(update={"message": f.message + f" (not measured: {e.message})"}) for f in _aux.findings(a, ck.producer)]
            return
        # measured but inconclusive: inspect changes nothing, so it reports (a warning naming both readings, the
        # measurement and the flag; the literal reading is what vLLM serves) and never refuses; convert stops there
    else:
        b = _aux.resolve(a, ck.config.num_aux, ti.num_layers, override=override)
    if b is not a:
        _aux.apply(ck, b)
        ck.findings = [f for f in ck.findings if f.code not in _AUX_CODES] + _aux.findings(b, ck.producer)
    if lt is not None and b.decided and b.ids is not None:
        _measure_nbr(ck, lt, b.ids)


def _measure_nbr(ck: Checkpoint, lt: Any, ids: list[int]) -> None:
    """norm_before_residual, when the config does not state it: measured on the target (reported as a finding and
    in ``flags``)."""
    from .aux_evidence import decide_norm_before_residual, norm_before_residual_open  # lazy: torch stays out of inspect unless it measures

    if not norm_before_residual_open(ck) or _aux.pairing_error(ids, ck.config.num_aux, lt.info.num_layers):
        return
    m = decide_norm_before_residual(ck, lt, ids)
    if m is None:
        return
    if m.verdict == "no-evidence":
        ck.findings.append(finding(
            "warning", "norm_before_residual_measured",
            f"norm_before_residual is not in the config, and measuring it on the target decided nothing: the drafter "
            f"drafts with neither value ({m.no_evidence}; {m.tried()}); the layout's default "
            f"{ck.config.norm_before_residual} is read, as vLLM reads it. {_aux.NO_EVIDENCE_CAUSES}"))
        return
    said = (f"{m.winner} by measurement" if m.winner is not None
            else f"measuring did not decide it ({m.verdict}); the layout's default {ck.config.norm_before_residual} is read")
    ck.findings.append(finding("info", "norm_before_residual_measured",
                               f"norm_before_residual is not in the config: {said} ({m.summary()})"))


def _target_fit(ck: Checkpoint, target: str, ti: Any, trained_for: str | None, device: str) -> Any:
    """Whether the drafter fits ``target`` (:func:`eagle_migrate.target_fit.assess`): measured where step 0 can run
    on it (the sizes pair, the aux ids are decided and valid, the drafter is not quantized and its family measures),
    else the config's evidence alone; a target without weights: the config alone, saying why."""
    from .target import LazyTarget  # lazy: torch stays out of inspect unless it measures
    from .target_fit import assess  # lazy: torch, as target

    ids = ck.config.aux_layer_ids
    ok = (_sizes_pair(ck, ti) and _measures_aux(ck) and ids is not None and (ck.aux is None or ck.aux.decided)
          and not _aux.pairing_error(ids, ck.config.num_aux, ti.num_layers))
    dev = resolve_device(device)
    lt = LazyTarget(target, dev, resolve_dtype("auto", dev))
    try:
        return assess(ck, lt, list(ids) if ok else None, trained_for_path=trained_for, measure=ok)
    except TargetError as e:  # a config-only target folder: the config's evidence alone
        fit = assess(ck, lt, None, measure=False)
        fit.message += f" (not measured: {e.message})"
        return fit


def report_from_checkpoint(ck: Checkpoint, target: str | None = None, deep: bool = False,
                           aux_ids_convention: Convention | None = None, device: str = "auto",
                           trained_for: str | None = None) -> InspectReport:
    ti = None
    if target is not None:
        from .target import target_info  # lazy: target imports torch: inspect without --target needs none

        ti = target_info(target)
    _resolve_aux(ck, target, ti, aux_ids_convention, device)
    fit = _target_fit(ck, target, ti, trained_for, device) if target is not None and ck.config.generation == "eagle3" \
        else None
    findings = list(ck.findings)
    findings += _check_vocab_maps(ck, ti.vocab_size if ti else None)
    findings += _check_finite(ck, deep)
    findings += _check_norm_weights(ck)
    if ti is not None:
        findings += pairing_findings(ck, ti)
    # each trap is emitted once, by the one check that owns it; errors first
    uniq = sorted(findings, key=lambda f: _SEVERITY_ORDER[f.severity])
    cfg = ck.config
    root = Path(ck.path).resolve()
    files = []
    for f in ck.store.files:
        try:
            name = str(Path(f).relative_to(root))
        except ValueError:
            name = str(f)
        files.append(FileEntry(name=name, bytes=Path(f).stat().st_size))
    extra_files = [p for p in ("config.json", "hf_quant_config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json")
                   if (Path(ck.path) / p).is_file()]
    for p in extra_files:
        files.append(FileEntry(name=p, bytes=(Path(ck.path) / p).stat().st_size))
    return InspectReport(
        path=str(ck.meta.get("input_path", ck.path)),
        format=ck.format,
        producer=ck.producer,
        layout=ck.layout,
        architecture=cfg.architecture,
        sizes=ReportSizes(
            hidden_size=cfg.hidden_size, target_hidden_size=cfg.target_hidden_size,
            num_aux=cfg.num_aux if cfg.generation == "eagle3" else 2,
            vocab_size=ck.meta.get("vocab_size_declared", cfg.vocab_size), draft_vocab_size=cfg.draft_vocab_size,
            intermediate_size=cfg.intermediate_size, num_attention_heads=cfg.num_attention_heads,
            num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, num_layers=cfg.num_layers,
            **(fam.report_sizes(cfg) if (fam := families.find(cfg.architecture)) else {}),
        ),
        aux_layer_ids=cfg.aux_layer_ids,
        aux_layer_ids_stored=ck.meta.get("aux_ids_stored"),
        aux_layer_ids_convention=(ck.aux.convention or "undecided") if ck.aux is not None else "vllm",
        aux_ids_evidence=ck.aux,
        flags=Flags(fc_norm=cfg.fc_norm, norm_output=cfg.norm_output, norm_before_fc=cfg.norm_before_fc,
                    norm_before_residual=cfg.norm_before_residual),
        rope_theta=cfg.rope_theta,
        rope_scaling=cfg.rope_scaling,
        max_position_embeddings=cfg.max_position_embeddings,
        dtype=_dtype_summary(ck),
        num_parameters=_num_parameters(ck),
        num_tensors=len(ck.name_map),
        files=files,
        total_bytes=sum(f.bytes for f in files),
        quantization=ck.quantization,
        target=None if ti is None else TargetSummary.of(ti),
        target_fit=fit,
        deep=deep,
        findings=uniq,
    )


def inspect_checkpoint(path: str | Path, target: str | None = None, deep: bool = False,
                       aux_ids_convention: Convention | None = None, device: str = "auto",
                       trained_for: str | None = None) -> InspectReport:
    """Read ``path`` (any supported layout; never modified) and report what it is and what is wrong with it.

    ``aux_ids_convention`` (vllm | output-of-layer) overrides how stored aux ids are read. With ``target``, whether
    the drafter fits it (``target_fit``: :mod:`eagle_migrate.target_fit`, the target loaded for a step-0
    measurement on its own text, seconds on a small target); ``trained_for``: the target it was trained for (a local
    path or hub id), measured the same way as the reference. Raises CheckpointError
    (exit 2) when the input cannot be read at all; TargetError when ``target`` cannot; PairingError when the aux
    ids can be read two ways and measuring on ``target`` does not tell which.
    """
    ck = read_checkpoint(path)
    ck.meta["input_path"] = str(path)
    return report_from_checkpoint(ck, target=target, deep=deep, aux_ids_convention=aux_ids_convention, device=device,
                                  trained_for=trained_for)
