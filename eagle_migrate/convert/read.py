"""The first two steps of every conversion: *read* (the source checkpoint, the target's config, the data to use) and
*map* (the aux layer ids decided and checked, rope and positions taken from the target, the provenance record).
Both are the same for every source generation; what differs is in the converters (eagle3.py, eagle2.py,
passthrough.py). Imports: torch, allocator, aux_evidence (the measurement), calibration_data (the data choice), devices,
drafter.config, errors, fingerprints, formats (the reader, aux_ids, io, output), pairing, target,
convert.options/records/result."""

from __future__ import annotations

import datetime as _dt
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import aux_evidence as ev
from ..allocator import fixed_mmap_threshold
from ..calibration_data import resolve_data as pick_data
from ..devices import resolve_device, resolve_dtype
from ..drafter.config import DrafterConfig
from ..errors import InputError, PairingError, UnsupportedError, a_an
from ..fingerprints import target_name
from ..formats import aux_ids as _aux
from ..formats import read_checkpoint
from ..formats.aux_ids import AuxIds
from ..formats.io import sha256_files
from ..formats.output import check_output_dir
from ..pairing import TargetInfo, check_pairing, target_family_note
from ..target import LazyTarget
from .options import ConvertOptions
from .records import sequences_for, stats_sequences
from .result import Provenance


def now(t: float | None = None) -> str:
    """``t`` (time.time(); default: now) as an ISO timestamp in UTC, to the second."""
    when = _dt.datetime.now(_dt.timezone.utc) if t is None else _dt.datetime.fromtimestamp(t, _dt.timezone.utc)
    return when.isoformat(timespec="seconds")


def default_aux_ids(num_target_layers: int, k: int = 3) -> list[int]:
    """vLLM's default ids as vLLM captures them (:func:`eagle_migrate.formats.aux_ids.vllm_default_aux_ids`); PairingError
    when they are not ``k`` distinct layers (vLLM would crash on the first request)."""
    err = _aux.pairing_error(None, k, num_target_layers)
    if err:
        raise PairingError(err, "pass a drafter that records its eagle_aux_hidden_state_layer_ids")
    return _aux.vllm_default_aux_ids(num_target_layers)


@dataclass
class Job:
    """One conversion as the skeleton carries it from step to step (filled by :func:`read` and :func:`map_source`)."""

    opts: ConvertOptions
    source: Path
    out: Path
    device: str
    dtype: torch.dtype
    ck: Any  # formats.base.Checkpoint
    target: LazyTarget
    t0: float  # when the conversion started (time.time(): the retarget fine-tune's deadline counts from it)
    data: str | None = None  # the data actually used (a default picked for a real target)
    warnings: list[str] = field(default_factory=list)
    source_findings: list[Any] = field(default_factory=list)  # the source's error / warning findings (formats Finding)
    aux: AuxIds | None = None
    nbr_measurement: Any = None  # aux_ids.Measurement of norm_before_residual (when the config did not state it)
    aux_ids: list[int] = field(default_factory=list)  # vLLM convention, ascending
    update: dict[str, Any] = field(default_factory=dict)  # config changes every output gets (aux ids, rope, positions)
    changes: list[str] = field(default_factory=list)  # ... described
    source_sha256: str = ""
    store_dtype: torch.dtype = torch.bfloat16
    provenance: Provenance | None = None
    first_sequences: list[list[int]] | None = None  # the aux-id measurement's first prompts (target_fit replays them)

    @property
    def cfg(self) -> DrafterConfig:
        return self.ck.config


def read(source: Path, target: str, out: Path, opts: ConvertOptions) -> Job:
    """*read*: check the arguments, read the source checkpoint (memory-mapped) and the target's config."""
    t0 = time.time()
    if not source.exists():
        raise InputError(f"{source}: no such file or folder")
    check_output_dir(out, opts.force, opts.inputs(source, target))
    fixed_mmap_threshold()  # freed per-sequence temporaries go back to the OS (see its docstring)
    dev = resolve_device(opts.device)
    cdtype = resolve_dtype(opts.dtype, dev)
    torch.manual_seed(opts.seed)

    opts.progress("read source", 0, 1)
    ck = read_checkpoint(source)
    opts.progress("read source", 1, 1)
    cfg = ck.config
    if not cfg.supported_architecture:
        raise UnsupportedError(f"{source}: {cfg.architecture.upper()} drafters are recognised but cannot be converted yet")
    if ck.quantization:
        raise UnsupportedError(f"{source}: the drafter is quantized ({ck.quantization.get('scheme')}); convert the unquantized drafter, then quantize")
    job = Job(opts=opts, source=source, out=out, device=dev, dtype=cdtype, ck=ck, target=LazyTarget(target, dev, cdtype),
              t0=t0, data=opts.data)
    # the source's problems: listed as fixed or as still there once the output is written (base.sort_findings)
    job.source_findings = [f for f in ck.findings if f.severity in ("error", "warning")]
    return job


def resolve_data(job: Job) -> None:
    """The calibration data: ``--data`` as given, else ShareGPT on a real target when it is here (a warning else)."""
    if job.opts.hidden_states_dir is not None:
        return

    tok = job.target.tokenizer
    job.data, warning = pick_data(job.data, tok)
    if warning and tok is not None:
        job.warnings.append(warning)


def _first_sequences(job: Job) -> list[list[int]] | None:
    """The statistics pass's own sequences (measured first: their states are kept for that pass), or None."""
    o = job.opts
    if o.hidden_states_dir is not None or (job.data is None and job.target.tokenizer is None):
        return None  # a tokenizer-less toy's statistics run on random tokens: the measurement wants the target's own text
    return sequences_for(job.data, job.target, stats_sequences(o.num_sequences, job.device), o.seed,
                         o.max_length)


def decide_aux_ids(job: Job, measure: bool = True) -> tuple[AuxIds | None, list[int]]:
    """The aux ids of an EAGLE-3 / 3.1 source in vLLM's convention: the stored ones read by the override, a
    writer's fingerprint or a measurement on the target (:func:`eagle_migrate.aux_evidence.resolve_for_target`), else
    vLLM's default written explicitly. Readings shown equivalent on the target: the stored ids, with a warning.
    ``measure`` False (a passthrough, which keeps how vLLM reads the ids): undecided ids are carried verbatim and
    marked undecided. PairingError (exit 2) when the stored ids cannot be decided and must be.
    Where the config does not state ``norm_before_residual`` and the target is measured, it is measured too."""
    ck, cfg, tinfo, progress = job.ck, job.cfg, job.target.info, job.opts.progress
    first: list[list[int]] | None = None
    a0 = ck.aux
    needs = (measure and a0 is not None and a0.stored is not None and not a0.decided and job.opts.aux_ids_convention is None
             and cfg.generation == "eagle3")
    if needs or (measure and ev.norm_before_residual_open(ck)):
        first = _first_sequences(job)
    elif measure and job.opts.hidden_states_dir is None:  # the target-fit measurement's prompts (base.target_fit)
        first = _first_sequences(job)
    job.first_sequences = first

    def tick(done: int, total: int) -> None:
        progress("aux ids", done, total)

    progress("aux ids", 0, 1)
    if measure:
        aux = ev.resolve_for_target(ck, job.target, override=job.opts.aux_ids_convention, seed=job.opts.seed,
                                    data=job.data, sequences=first, progress=tick)
    else:
        aux = _aux.resolve(a0, cfg.num_aux, tinfo.num_layers, override=job.opts.aux_ids_convention) if a0 is not None \
            else _aux.from_stored(None, "none")
    progress("aux ids", 1, 1)
    if aux.stored is not None:
        if not aux.decided and not measure and _aux.pairing_error(aux.stored, cfg.num_aux, tinfo.num_layers) is None:
            ck.aux = aux
            job.warnings.append(f"warning: aux layer ids {aux.stored} carried as stored (read literally, as vLLM reads "
                                "them); their convention is undecided and marked so in config.json (eagle_migrate."
                                "aux_ids_convention). Pass --aux-ids-convention to record it")
            return aux, sorted(aux.stored)
        if not aux.decided:
            hint = (_aux.NO_EVIDENCE_HINT if aux.no_evidence else _aux.UNDECIDED_HINT if aux.measurement is not None
                    else "a drafter for this target records aux ids within 0..L")
            raise PairingError(_aux.undecided_message(aux, tinfo.num_layers, cfg.num_aux), hint)
        if aux.decided_by == "measurement" and (worse := ev.worse_than_literal(aux.measurement, "vllm")):
            raise PairingError(f"aux layer ids {aux.stored}: {worse}; nothing is written",
                               "pass --aux-ids-convention vllm|output-of-layer if you know the convention")
        _aux.apply(ck, aux)
        if aux.decided_by in ("equivalent", "producer"):  # the output carries these ids: the warning is about it
            job.warnings += [f"{f.severity}: {f.message}" for f in _aux.findings(aux, ck.producer)]
        elif aux.decided_by in ("measurement", "unambiguous", "override"):
            job.source_findings += [f for f in _aux.findings(aux, ck.producer) if f.severity in ("error", "warning")]
        ids = aux.ids
    else:
        if cfg.num_aux != 3:
            raise PairingError(f"the drafter fuses K={cfg.num_aux} aux states but records no aux layer ids (vLLM's default has 3)")
        ids = default_aux_ids(tinfo.num_layers)
        job.warnings.append(f"no aux layer ids in the source: vLLM's default {ids} for {a_an(tinfo.num_layers)}-layer target written explicitly")
    if job.opts.norm_before_residual is not None and ck.config.generation == "eagle3":
        was = ck.config.norm_before_residual if ck.meta.get("norm_before_residual_stated", True) else None
        ck.config = ck.config.model_copy(update={"norm_before_residual": job.opts.norm_before_residual})
        ck.meta.update(norm_before_residual_stated=True, norm_before_residual_decided_by="override")
        job.changes.append(f"norm_before_residual: {str(job.opts.norm_before_residual).lower()} by --norm-before-residual"
                           + (f" (the config said {str(was).lower()})" if was is not None else " (not in the config)"))
    elif measure and ev.norm_before_residual_open(ck) and pairing_ok(ck, ids, tinfo):
        progress("norm_before_residual", 0, 1)
        m = ev.decide_norm_before_residual(ck, job.target, ids, seed=job.opts.seed, data=job.data, sequences=first, progress=
                                           lambda d, t: progress("norm_before_residual", d, t))
        progress("norm_before_residual", 1, 1)
        if m is not None:
            job.nbr_measurement = m
            literal = str(bool(ck.meta["norm_before_residual_layout_default"])).lower()
            if m.verdict == "no-evidence":
                raise PairingError(
                    f"norm_before_residual is not in the config, and the drafter predicts none of the target's tokens "
                    f"with it true or false ({m.no_evidence}), so the measurement decides nothing. Tried: "
                    f"{m.tried({'true': 'norm_before_residual true', 'false': 'norm_before_residual false'})}. "
                    f"{_aux.NO_EVIDENCE_CAUSES}", _aux.NO_EVIDENCE_HINT.replace(
                        "if you know the convention the ids were written in, --aux-ids-convention vllm|output-of-layer",
                        "if you know the flag, pass --norm-before-residual or --no-norm-before-residual"))
            if worse := ev.worse_than_literal(m, literal):
                raise PairingError(f"norm_before_residual: {worse}; nothing is written",
                                   "if you know the flag, pass --norm-before-residual or --no-norm-before-residual")
            if m.winner is not None:
                job.warnings.append(f"info: norm_before_residual is not in the config: {m.winner} by measurement ({m.summary()})")
            else:
                job.warnings.append(f"warning: norm_before_residual is not in the config and measuring did not decide it "
                                    f"({m.verdict}: {m.summary()}); the layout's default {ck.config.norm_before_residual} is kept")
    job.target.keep_only(ids)
    return aux, ids


def pairing_ok(ck: Any, ids: list[int], tinfo: TargetInfo) -> bool:
    return _aux.pairing_error(ids, ck.config.num_aux, tinfo.num_layers) is None


def map_source(job: Job, aux: AuxIds | None, aux_ids: list[int]) -> None:
    """*map*: the decided aux ids checked against the target, the source hashed, the provenance record started, and
    the config changes every output gets (aux ids, rope and positions from the target)."""
    opts, ck, tinfo = job.opts, job.ck, job.target.info
    check_pairing(job.cfg, tinfo, aux_ids)
    if job.cfg.generation == "eagle3" and (note := target_family_note(job.cfg.architecture, tinfo.model_type)):
        job.warnings.append(note)
    job.aux, job.aux_ids = aux, sorted(aux_ids)
    opts.progress("hash source", 0, 1)
    job.source_sha256 = sha256_files(ck.store.files)
    opts.progress("hash source", 1, 1)
    tspec = job.target.spec
    tcfg_path = Path(tspec).expanduser() / "config.json"
    cmd = opts.command if opts.command is not None else " ".join([os.path.basename(sys.argv[0] or "python")] + sys.argv[1:])
    tname = target_name(tspec)
    job.provenance = Provenance(
        command=cmd, source=str(job.source), source_sha256=job.source_sha256,
        source_files=[Path(f).name for f in ck.store.files], source_format=ck.format, source_producer=ck.producer,
        target=tspec, target_name=tname.name if tname else None, target_hub_id=tname.hub_id if tname else None,
        target_config_sha256=sha256_files([tcfg_path]) if tcfg_path.is_file() else None,
        data=job.data, hidden_states_dir=str(opts.hidden_states_dir) if opts.hidden_states_dir else None, seed=opts.seed,
        device=job.device, dtype=str(job.dtype).removeprefix("torch."), output_format=opts.output_format,
        started_at=now(job.t0), aux_ids=aux, norm_before_residual_evidence=job.nbr_measurement)
    job.store_dtype = _float_dtype([ck.info(n).dtype for n in ("fc.weight", "norm.weight", "layers.0.post_attention_layernorm.weight")
                                    if ck.has(n)])
    cfg, ids = job.cfg, job.aux_ids
    job.update = {"aux_layer_ids": ids}
    if (cfg.rope_theta, cfg.rope_scaling) != (tinfo.rope_theta, tinfo.rope_scaling):
        job.update.update(rope_theta=tinfo.rope_theta, rope_scaling=tinfo.rope_scaling)
        job.changes.append(f"rope_theta/rope_scaling taken from the target ({cfg.rope_theta}, {cfg.rope_scaling} -> "
                           f"{tinfo.rope_theta}, {tinfo.rope_scaling})")
    tmax = tinfo.max_position_embeddings or cfg.max_position_embeddings
    if tmax > cfg.max_position_embeddings:
        job.update["max_position_embeddings"] = int(tmax)
        job.changes.append(f"max_position_embeddings {cfg.max_position_embeddings} -> {tmax} (the target's)")
    if aux is not None and aux.stored is not None and aux.convention == "output-of-layer":
        job.changes.append(f"aux layer ids {aux.stored} (output-of-layer, by {aux.decided_by}) written as vLLM ids {ids} "
                           "(top level and eagle_config)")
    elif aux is None or aux.stored is None or sorted(aux.stored) != ids:
        job.changes.append(f"aux layer ids written explicitly: {ids} (top level and eagle_config)")


def _float_dtype(store_dtypes: list[str]) -> torch.dtype:
    for d in store_dtypes:
        if d in ("bfloat16", "float16", "float32"):
            return getattr(torch, d)
    return torch.bfloat16
