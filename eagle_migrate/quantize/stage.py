"""The ``quantize`` stage: read a drafter, calibrate activation ranges (static schemes), pack, write config.json +
model.safetensors + provenance.json atomically, and measure acceptance before / after (the gate).

Imports: torch, pydantic, ``devices``, ``errors``, ``fingerprints``, ``formats`` (reader, common, io, output, vllm,
write), ``drafter.config``, ``target``, ``quant`` (schemes, linears, numerics, pack),
``quantize.{calibrate_acts, gate, options}``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, Field

from .. import __version__
from .. import target as target_loader
from ..devices import resolve_device
from ..drafter.config import DrafterConfig
from ..errors import CheckFailed, InputError, UnsupportedError
from ..fingerprints import target_name
from ..formats import read_checkpoint
from ..formats.common import carried_mark
from ..formats.io import sha256_files
from ..formats.output import atomic_output_dir, check_output_dir, save_safetensors, write_json
from ..formats.vllm import speculative_config, vllm_config_dict
from ..formats.write import prepare_tensors
from ..quant.linears import linear_prefixes
from ..quant.numerics import nbytes
from ..quant.pack import LayerReport, quantize_state_dict
from ..quant.schemes import SCHEMES, SchemeConfig, SchemeName, get_scheme, quantization_config
from .calibrate_acts import CalibrationReport, activation_ranges
from .gate import AcceptanceReport, gate_engine, measure_acceptance
from .options import QuantizeOptions

ProgressFn = Callable[[str], None]


class QuantizeResult(BaseModel):
    """What ``eagle-migrate quantize`` did (``--json`` prints exactly this)."""

    source: str
    output: str
    scheme: SchemeName
    scheme_description: str
    format: str = Field(..., description="compressed-tensors format written")
    source_format: str = Field(..., description="eagle3 or eagle3.1")
    source_producer: str
    quantized: list[str] = Field(..., description="Linear layers quantized (checkpoint prefixes)")
    ignore: list[str] = Field(..., description="the ignore list written (vLLM runtime names)")
    kept: list[str] = Field(..., description="tensors copied unchanged")
    layers: list[LayerReport]
    quantized_bytes_before: int
    quantized_bytes_after: int
    quantized_ratio: float = Field(..., description="quantized layers: bytes before / after")
    checkpoint_bytes_before: int = Field(..., description="source weight files on disk")
    checkpoint_bytes_after: int = Field(..., description="output weight files on disk")
    checkpoint_ratio: float
    min_sqnr_db: float | None = Field(None, description="worst layer (null when every layer is exact)")
    calibration: CalibrationReport | None = None
    acceptance: AcceptanceReport | None = None
    quantization_config: dict[str, Any]
    speculative_config: dict[str, Any] = Field(..., description="the --speculative-config for vllm serve")
    files: list[str]
    seconds: float
    notes: list[str] = Field(default_factory=list)


# ----- reading the source ------------------------------------------------------------------------------------------
def read_source(path: Path):
    """A ``Checkpoint`` of any producer layout ``eagle_migrate.formats`` reads (canonical vLLM-layout names), checked
    to be an unquantized EAGLE-3 drafter quantize supports. Quantizing keeps the layout and how vLLM reads the aux
    ids: stored ids whose convention is undecided are carried verbatim and marked undecided in the output
    (:func:`aux_ids_block`); nothing here needs their convention."""
    ck = read_checkpoint(Path(path))
    cfg = ck.config
    if ck.quantization or (ck.raw_config or {}).get("quantization_config"):
        raise InputError(f"{path} is already quantized", "quantize the unquantized drafter")
    if cfg.generation != "eagle3":
        raise UnsupportedError(f"{path} is an EAGLE-2 drafter; vLLM's compressed-tensors path is for EAGLE-3 drafters",
                               "run `eagle-migrate convert` first, then quantize its output")
    if not cfg.supported_architecture:
        raise UnsupportedError(f"{path}: {cfg.architecture} drafters are not supported by quantize")
    return ck


def source_float_dtype(ckpt) -> torch.dtype:
    """The float dtype holding most of the checkpoint's parameters (bfloat16 when there is none)."""
    from collections import Counter

    c: Counter[str] = Counter()
    for n in ckpt.canonical_names():
        info = ckpt.info(n)
        if info.dtype in ("float32", "bfloat16", "float16"):
            c[info.dtype] += info.numel
    return getattr(torch, c.most_common(1)[0][0]) if c else torch.bfloat16


# ----- writing -----------------------------------------------------------------------------------------------------
def aux_ids_block(ck) -> dict[str, Any]:
    """The ``eagle_migrate`` config block of a quantized output: our version, and for a source whose aux-id
    convention nothing decided, the undecided mark with the stored ids (carried verbatim: the literal reading, which
    is what vLLM serves). InputError when the config would hold ids other than the stored ones."""
    mark = carried_mark(ck.aux)
    if mark and sorted(ck.config.aux_layer_ids or []) != sorted(ck.aux.stored):
        raise InputError(f"{ck.path}: aux layer ids {ck.aux.stored} are undecided, but the output would hold "
                         f"{ck.config.aux_layer_ids}", "decide the convention first (convert --target, or --aux-ids-convention)")
    return {"version": __version__, **mark}


def write_quantized(out: Path, cfg: DrafterConfig, tensors: dict[str, torch.Tensor], qc: dict[str, Any],
                    source_dtype: torch.dtype, metadata: dict[str, str] | None = None,
                    marks: dict[str, Any] | None = None) -> list[str]:
    """config.json (vLLM layout + top-level quantization_config) and model.safetensors into an empty folder;
    ``marks``: the ``eagle_migrate`` config block (:func:`aux_ids_block`)."""
    sd = prepare_tensors(cfg, tensors, dtype=None, keep_t2d=False, quantized=True)
    meta = {"format": "pt", "producer": f"eagle-migrate {__version__}"}
    meta.update(metadata or {})
    save_safetensors(sd, out / "model.safetensors", meta)
    d = vllm_config_dict(cfg, {"quantization_config": qc, **({"eagle_migrate": marks} if marks else {})})
    d["torch_dtype"] = str(source_dtype).removeprefix("torch.")
    write_json(out / "config.json", d)
    return list(sd)


def _library_versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"torch": torch.__version__}
    for pkg in ("compressed-tensors", "safetensors"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def _parent_provenance(source: Path) -> dict[str, Any] | None:
    """The source checkpoint's own provenance.json (convert's record), kept whole so the lineage of every stage
    survives quantization; None when there is none or it is unreadable."""
    f = (source if source.is_dir() else source.parent) / "provenance.json"
    try:
        got = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return got if isinstance(got, dict) else None


def _provenance(result: QuantizeResult, source: Path, ckpt, src_files: list[Path], options: dict[str, Any]) -> dict:
    return {
        "tool": "eagle-migrate", "version": __version__, "command": "quantize",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "source": {"path": str(source.resolve()), "sha256": sha256_files(src_files) if src_files else None,
                   "format": ckpt.config.format_name, "producer": str(ckpt.producer)},
        "options": options,
        "libraries": _library_versions(),
        "result": {k: v for k, v in result.model_dump(mode="json").items() if k not in ("layers", "quantization_config", "kept")},
        "parent": _parent_provenance(source),
    }


def _result(spec: SchemeConfig, source: Path, out: Path, ckpt, sd: dict[str, torch.Tensor], prefixes: list[str],
            layers: list[LayerReport], qc: dict[str, Any], written: Path, src_files: list[Path], k: int,
            **extra: Any) -> QuantizeResult:
    """The result of a written output (``written``: its model.safetensors); ``files`` / ``seconds`` filled later."""
    quantized = {p + ".weight" for p in prefixes} | {p + ".bias" for p in prefixes}
    qb = sum(x.bytes_before for x in layers)
    qa = sum(x.bytes_after for x in layers)
    cb = sum(f.stat().st_size for f in src_files) if src_files else sum(nbytes(t) for t in sd.values())
    ca = written.stat().st_size
    sq = [x.sqnr_db for x in layers if x.sqnr_db is not None]
    return QuantizeResult(
        source=str(source), output=str(out), scheme=spec.name, scheme_description=spec.description, format=spec.format,
        source_format=ckpt.config.format_name, source_producer=str(ckpt.producer), quantized=prefixes,
        ignore=qc["ignore"], kept=[n for n in sd if n not in quantized], layers=layers, quantized_bytes_before=qb,
        quantized_bytes_after=qa, quantized_ratio=round(qb / qa, 3) if qa else 0.0, checkpoint_bytes_before=cb,
        checkpoint_bytes_after=ca, checkpoint_ratio=round(cb / ca, 3) if ca else 0.0, min_sqnr_db=min(sq) if sq else None,
        quantization_config=qc, speculative_config=speculative_config(str(out), k), files=[], seconds=0.0, **extra)


# ----- the stage ---------------------------------------------------------------------------------------------------
def quantize(source: str | Path, out: str | Path, scheme: SchemeName | None = None, *,
             progress: ProgressFn | None = None, **options: Any) -> QuantizeResult:
    """Quantize a drafter checkpoint into ``out`` (atomic; with provenance.json): :func:`run` with these keywords as
    its :class:`QuantizeOptions`.

    ``validate``: ``auto`` measures acceptance before/after when a target is given (vLLM for FP8; the reference
    engine on CPU for NVFP4, vLLM for NVFP4 on a GPU), ``vllm`` / ``reference`` force an engine, ``none`` skips it.
    ``max_al_drop_pct`` gates: when acceptance drops by more, ``CheckFailed`` is raised (its ``result`` attribute
    holds the report) and no output is written.
    """
    return run(source, out, QuantizeOptions.of(scheme=scheme, progress=progress, **options))


def run(source: str | Path, out: str | Path, opts: QuantizeOptions) -> QuantizeResult:
    """The quantize stage with its options model (see :func:`quantize`)."""
    t0 = time.perf_counter()
    if opts.scheme is None:
        raise InputError("no quantization scheme given", f"pass --scheme, one of {', '.join(SCHEMES)}")
    spec = get_scheme(opts.scheme)
    source, out = Path(source), Path(out)
    say = opts.progress or (lambda _m: None)
    target, data, quantize_fc, quantize_lm_head = opts.target, opts.data, opts.quantize_fc, opts.quantize_lm_head
    force, max_al_drop_pct, num_speculative_tokens = opts.force, opts.max_al_drop_pct, opts.num_speculative_tokens
    device = resolve_device(opts.device)
    validate, engine = gate_engine(spec, opts.validate, target, max_al_drop_pct, (opts.vllm_options or {}).get("python"))
    check_output_dir(out, force, [source, target, data])
    notes: list[str] = []
    say("reading the checkpoint")
    ckpt = read_source(source)
    aux_ids_block(ckpt)  # refuse before any work when the ids could not be carried verbatim
    cfg = ckpt.config
    if ckpt.aux is not None and ckpt.aux.stored is not None and not ckpt.aux.decided:
        notes.append(f"aux layer ids {ckpt.aux.stored} carried verbatim (convention undecided, marked so in config.json: "
                     "eagle_migrate.aux_ids_convention); vLLM reads them literally, as it read the source")
    src_dtype = source_float_dtype(ckpt)
    sd = {n: ckpt.tensor(n) for n in ckpt.canonical_names() if n != "t2d"}
    prefixes = linear_prefixes(cfg, sd, quantize_fc=quantize_fc, quantize_lm_head=quantize_lm_head)

    tgt = calib = amax = None

    def load_target():
        say("loading the target")
        return target_loader.load_target(target, device=device, dtype=torch.float32)

    if spec.calibrated:
        tgt = load_target()
        amax, calib = activation_ranges(cfg, sd, tgt, data, prefixes, num_sequences=opts.num_calibration_sequences,
                                        max_len=opts.calibration_max_len, progress=say)
    elif data is not None:
        notes.append(f"--data is not used by {spec.name} (no activation scales to calibrate)")
    qsd, layers = quantize_state_dict(sd, cfg, spec, activation_amax=amax, quantize_fc=quantize_fc,
                                      quantize_lm_head=quantize_lm_head, progress=say)
    qc = quantization_config(spec, quantize_fc=quantize_fc, quantize_lm_head=quantize_lm_head)
    if quantize_lm_head:
        notes.append("lm_head quantized: acceptance is most sensitive there (quant-formats.md §9); check the AL drop")

    src_files = list(getattr(ckpt.store, "files", []))
    with atomic_output_dir(out, force, [source, target, data]) as tmp:
        write_quantized(tmp, cfg, qsd, qc, src_dtype, {"quantization": spec.name}, marks=aux_ids_block(ckpt))
        acceptance = None
        if engine is not None:
            say(f"measuring acceptance before/after ({engine})")
            acceptance = measure_acceptance(
                engine, spec, source=source, quantized=tmp, work_parent=out.parent, cfg=cfg, sd=sd, target=target,
                target_obj=tgt, suites=opts.suites, k=num_speculative_tokens, max_al_drop_pct=max_al_drop_pct,
                vllm_options=opts.vllm_options, load_target=load_target)
        result = _result(spec, source, out, ckpt, sd, prefixes, layers, qc, tmp / "model.safetensors", src_files,
                         num_speculative_tokens, calibration=calib, acceptance=acceptance, notes=notes)
        if acceptance is not None and acceptance.passed is False:
            result.seconds = round(time.perf_counter() - t0, 2)
            err = CheckFailed(
                f"acceptance length dropped {acceptance.drop_pct:.2f}% ({acceptance.before:.3f} -> {acceptance.after:.3f}), "
                f"more than --max-al-drop {max_al_drop_pct}%; {acceptance.paired_text()}; nothing was written",
                "try fp8-dynamic, keep fc unquantized, or calibrate on data closer to the traffic (--data)",
            )
            err.result = result  # type: ignore[attr-defined]
            raise err
        tname = target_name(str(target)) if target is not None else None
        options = {"scheme": spec.name, "target": target, "target_name": tname.name if tname else None,
                   "target_hub_id": tname.hub_id if tname else None,
                   "data": None if data is None else str(data) if not isinstance(data, list) else "token ids",
                   "quantize_fc": quantize_fc, "quantize_lm_head": quantize_lm_head,
                   "num_calibration_sequences": opts.num_calibration_sequences if spec.calibrated else None,
                   "max_al_drop_pct": max_al_drop_pct, "validate": validate}
        write_json(tmp / "provenance.json", _provenance(result, source, ckpt, src_files, options))
        result.files = sorted(p.name for p in tmp.iterdir())
    result.seconds = round(time.perf_counter() - t0, 2)
    return result
