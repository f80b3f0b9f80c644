"""The checkpoint form of calibration (what convert calls): :func:`calibrate_checkpoint` loads the drafter of a
folder in the vLLM layout and its target, picks the data and the held-out suites (a file of served prompts: a
held-out part is the suite ``traffic``, the rest answered by the target and trained on; ``answered:SPEC``: SPEC's
first requests answered by the target and trained on), runs :func:`~.run.calibrate`
with the same :class:`~.settings.CalibrationSettings`, and writes the best weights back atomically.
Imports: torch, calibration_data, corpora, devices, errors, formats (read, output, write), loader, target, calibrate.{settings,result,run}."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch

from ..calibration_data import (
    TRAFFIC_SUITE,
    TRAIN_ANSWERS,
    answer_tokens,
    answered,
    answered_prompts,
    default_data,
    engine_continuations,
    is_traffic,
    resolve_data,
    traffic_prompts,
)
from ..corpora import TRAFFIC_MIN_HELDOUT, is_answered
from ..devices import resolve_dtype
from ..errors import DataError, UnsupportedError
from ..formats import read_checkpoint
from ..formats.output import atomic_output_dir
from ..formats.write import write_vllm
from ..loader import load_drafter
from ..target import Target, TargetWeights, load_target
from .result import CalibrationResult, check_improvement
from .run import calibrate
from .settings import CalibrationSettings, defaults_for, resolve_device, seq_len_for


def calibrate_checkpoint(
    checkpoint: str | Path,
    target: Any,
    settings: CalibrationSettings | None = None,
    *,
    in_place: bool = True,
    out: str | Path | None = None,
    loaded_target: Any = None,
    source_checkpoint: str | Path | None = None,
    statistics_tokens: int | None = None,
    **options: Any,
) -> CalibrationResult:
    """Calibrate the drafter in ``checkpoint`` (vLLM layout) against ``target`` (path or loaded Target) and write
    the best weights back (``in_place``) or to ``out``; every tensor and config key but the trained ones is kept.

    ``settings``: the run's options (:class:`CalibrationSettings`; keyword ``options`` with its field names are laid
    over it). ``settings.dtype``: the target's (``auto``/None: bf16 on CUDA, fp32 on CPU; the drafter always trains
    in fp32 master weights). ``loaded_target``: the same target already loaded (convert passes its own, so a GPU
    does not hold it twice); ``target`` stays the path vLLM reads for the held-out continuations.
    ``source_checkpoint``: the drafter the checkpoint was converted from, scored on the same held-out positions (the
    source comparison). ``settings.data`` None: :func:`resolve_data` picks ShareGPT for a real target when it is
    here, else the built-in set with a loud warning. ``statistics_tokens`` is reported as it is (convert's pass)."""
    s = CalibrationSettings.of(settings, **options)
    dev = resolve_device(s.device)
    tgt = _target(target, loaded_target, s, dev)
    ck = read_checkpoint(Path(checkpoint))
    if ck.quantization:
        raise UnsupportedError(f"{checkpoint}: the drafter is quantized; calibrate the unquantized drafter, then quantize it")
    model = load_drafter(ck, tgt)
    source = load_drafter(source_checkpoint, tgt) if source_checkpoint is not None else None
    hs = s.hidden_states_dir
    data, data_warning = resolve_data(s.data, tgt.tokenizer) if hs is None else (s.data, None)
    if data_warning and tgt.tokenizer is not None:
        warnings.warn(data_warning, stacklevel=2)
    dflt = defaults_for(dev)
    seq_len = seq_len_for(data, s.seq_len, dflt)
    traffic, own = hs is None and is_traffic(data), hs is None and is_answered(data)
    if hs is not None:  # training and held-out files both from the folder (run._precomputed_split)
        train_seqs, held = None, None
    else:
        train_seqs, held = default_data(tgt, data, s.num_sequences or 64, s.seed, seq_len, suites=s.suites,
                                        heldout_per_suite=s.heldout_per_suite or dflt["heldout_per_suite"],
                                        long_buckets=dflt["heldout_long_buckets"], shift_max=dflt["heldout_shift_max"],
                                        long_per_bucket=s.heldout_long_per_bucket or dflt["heldout_long_per_bucket"],
                                        with_train=not (traffic or own))
    asked = None  # training prompts the target answers (with the held-out continuations); None when the run only judges
    if traffic:  # the served prompts: a held-out part is the judge's own suite
        asked, held = _traffic(tgt, data, held or {}, seq_len, s, s.heldout_per_suite or dflt["heldout_per_suite"])
        train_seqs = None
    elif own:  # answered:SPEC: SPEC's first requests, the target's own answers to them trained on
        asked = None if s.steps == 0 else answered_prompts(tgt, data, s.num_sequences or 64, s.seed, seq_len)
        train_seqs = None
    if not _is_target(target) and tgt.tokenizer is not None and held:
        held, answers = _heldout_continuations(str(target), held, s.heldout_new_tokens or dflt["heldout_new_tokens"],
                                               s, asked, seq_len)
        if answers is not None:
            train_seqs, asked = answers, None
    if asked is not None:  # no engine made the answers: transformers' generate in the run (cached)
        train_seqs = answered(tgt, asked, seq_len, Path(s.cache_dir) if s.cache_dir is not None else None, _tick(s))
    res = calibrate(model, tgt, train_seqs, held, s.replace(device=dev, seq_len=seq_len, require_improvement=False),
                    source=source, statistics_tokens=statistics_tokens, data_name=str(hs or data or "builtin:chat"),
                    data_warning=data_warning)
    if res.best_step > 0 and (in_place or out is not None):
        _write_back(Path(checkpoint), Path(out) if out is not None else Path(checkpoint), ck, model, res)
    if s.require_improvement:
        check_improvement(res)
    return res


def _traffic(tgt: Any, data: Any, held: dict[str, Any], seq_len: int, s: CalibrationSettings,
             heldout_max: int) -> tuple[list[list[int]] | None, dict[str, Any]]:
    """``--data FILE`` of served prompts: (training prompts, held-out suites). The file is split by content
    (:func:`eagle_migrate.calibration_data.traffic_prompts`: the triage's held-out file beside it, else
    :func:`eagle_migrate.corpora.split_traffic`): the training prompts are to be answered by the target (its own
    greedy text; None when the run only judges: ``steps`` 0 reads no training sequence), the held-out ones become the
    suite :data:`~eagle_migrate.calibration_data.TRAFFIC_SUITE` beside the others; no held-out prompt is trained on."""
    train_prompts, judged = traffic_prompts(tgt, data, s.num_sequences or 64, s.seed, seq_len, heldout_max)
    if not train_prompts:
        raise DataError(f"{data}: every prompt is held out for the judge; nothing is left to train on",
                        f"give at least {2 * TRAFFIC_MIN_HELDOUT} distinct prompts")
    return (None if s.steps == 0 else train_prompts), ({**held, TRAFFIC_SUITE: judged} if judged else dict(held))


def _tick(s: CalibrationSettings) -> Any:
    return (lambda stage, done, total, info="": s.progress(f"calibrate: {stage}", done, total, info)) \
        if s.progress is not None else None


def _is_target(target: Any) -> bool:
    return isinstance(target, Target)


def _target(target: Any, loaded_target: Any, s: CalibrationSettings, dev: torch.device) -> Any:
    """The target to train against: ``target`` when it is loaded, else convert's ``loaded_target``, else only the
    tensors --hidden-states needs (embeddings, final norm, lm_head, read lazily), else the model loaded."""
    if _is_target(target):
        return target
    if loaded_target is not None:
        return loaded_target
    if s.hidden_states_dir is not None:  # never the whole target
        return TargetWeights(str(target))
    tdtype = s.dtype if isinstance(s.dtype, torch.dtype) else resolve_dtype(s.dtype or "auto", dev.type)
    return load_target(str(target), device=str(dev), dtype=tdtype)


def _heldout_continuations(target: str, held: Any, new_tokens: int, s: CalibrationSettings,
                           asked: list[list[int]] | None = None, seq_len: int = 0) -> tuple[Any, Any]:
    """(the held-out prompts with the target's greedy continuations, the traffic's training sequences or None) from
    the engine ``s.engine`` names (``s.vllm_python`` the interpreter that has vLLM;
    ``calibration_data.engine_continuations``: vLLM, or ``auto``'s choice), in one call: the training prompts
    ``asked`` (a traffic file's) answered there too (:func:`~eagle_migrate.calibration_data.answer_tokens` new
    tokens within ``seq_len``). When the engine makes none, the prompts as they are and None: transformers' generate
    in the run continues them (the slower fallback: the reference engine, or ``auto`` whose vLLM failed, with a
    warning). An engine asked for by name that fails fails."""
    sets = dict(held)
    budget: Any = new_tokens
    if asked:
        sets[TRAIN_ANSWERS] = asked
        budget = {**{n: new_tokens for n in held}, TRAIN_ANSWERS: answer_tokens(asked, seq_len)}
    made = engine_continuations(s.engine, target, sets, budget, cache_dir=s.cache_dir, python=s.vllm_python,
                                progress=_tick(s))
    if made is None:
        return held, None
    train = [h.ids[:seq_len] for h in made.pop(TRAIN_ANSWERS)] if asked else None
    return made, train


def _write_back(checkpoint: Path, dest: Path, ck: Any, model: Any, res: CalibrationResult) -> None:
    """The calibrated weights written to ``dest`` atomically (vLLM layout, the checkpoint's dtype), with the
    checkpoint's sidecar files (provenance.json, ...)."""
    sd = {n: t.detach().cpu() for n, t in model.state_dict().items()}
    if not ck.has("embed_tokens.weight"):
        sd.pop("embed_tokens.weight", None)
    raw = json.loads((checkpoint / "config.json").read_text()) if (checkpoint / "config.json").exists() else {}
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(str(raw.get("torch_dtype", "float32")), torch.float32)
    with atomic_output_dir(dest, force=True) as tmp:
        write_vllm(model.cfg, sd, tmp, dtype=dt, metadata={"calibrated": res.train},
                   extra_config={"eagle_migrate_calibration": {"train": res.train, "steps": res.steps_run, "best_step": res.best_step,
                                                               "score_before": round(res.score_before, 4), "score_after": round(res.score_after, 4),
                                                               "verdict": res.judge.verdict if res.judge else None}})
        for extra in checkpoint.iterdir():  # provenance.json and other sidecar files travel along
            if extra.is_file() and extra.name not in ("config.json", "model.safetensors") and not extra.name.endswith(".safetensors"):
                (tmp / extra.name).write_bytes(extra.read_bytes())
