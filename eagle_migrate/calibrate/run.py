"""The calibration run: :func:`calibrate` fine-tunes an :class:`EagleDrafter` against a loaded target (training
features, held-out suites, :func:`eagle_migrate.train.fit` under the judge, the verdict against the initial and the
source drafter) and returns a :class:`~.result.CalibrationResult`; the model keeps the best weights.
Imports: torch, calibration_data, drafter.model, errors, features, formats.aux_ids, judge, train,
calibrate.{settings,result,progress}."""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..calibration_data import heldout_sequences
from ..drafter.model import EagleDrafter
from ..errors import InputError
from ..features import FeatureStore, HeldoutFromFiles, PrecomputedFeatures, TargetHead, split_files
from ..formats.aux_ids import vllm_default_aux_ids
from ..judge import Comparison, SimulatedAcceptance, futility, judge_block, simulated_acceptance
from ..train import Evaluation, FitConfig, FitResult, Progress, draft_to_target_ids, fit
from .progress import progress_adapter
from .result import CalibrationResult, Judge, SuiteAcceptance, check_improvement, source_verdict
from .settings import CalibrationSettings, defaults_for, resolve_device, trainable_names


# training features of at most this many bytes are kept in memory after their first capture (a step that draws the
# same sequence again reads them, not the target): on the SmolLM2 pair, 32 sequences of 256 tokens (57 MB) were
# captured again at every epoch, 114 s of a 15-minute convert on 2 cores (docs/benchmarks.md "convert's default
# recalibration in 15 minutes"); larger sets stream as before (or use the disk cache)
TRAIN_FEATURES_IN_MEMORY = 1 << 30


def _in_memory(target: Any, sequences: Sequence[Sequence[int]], layer_ids: Sequence[int], seq_len: int) -> bool:
    """Whether the training features of ``sequences`` fit :data:`TRAIN_FEATURES_IN_MEMORY` (aux states and the last
    state per token, in the store's dtype)."""
    tokens = sum(min(len(x), seq_len) for x in sequences)
    width = (len(layer_ids) + 1) * target.info.hidden_size * torch.finfo(_feature_dtype(target)).bits // 8
    return tokens * width <= TRAIN_FEATURES_IN_MEMORY


def _feature_dtype(target: Any) -> torch.dtype:
    """Features are kept in the target's own float dtype (a bf16 target's states lose nothing in bf16, and host
    memory, disk cache and the host-to-GPU copy halve); fp32 otherwise."""
    dt = getattr(target, "dtype", None)
    return dt if dt in (torch.bfloat16, torch.float16) else torch.float32


def calibrate(
    model: EagleDrafter,
    target: Any,
    train_sequences: Sequence[Sequence[int]] | None = None,
    heldout: Mapping[str, Sequence[Any]] | None = None,
    settings: CalibrationSettings | None = None,
    *,
    source: EagleDrafter | None = None,
    loss_masks: Sequence[Sequence[bool]] | None = None,
    statistics_tokens: int | None = None,
    data_name: str | None = None,
    data_warning: str | None = None,
    **options: Any,
) -> CalibrationResult:
    """Fine-tune ``model`` (in place) on ``train_sequences`` under the unrolled k-step objective.

    ``settings``: the run's options (:class:`CalibrationSettings`); keyword ``options`` (its field names: ``train``,
    ``steps``, ``lr``, ...) are laid over it. ``heldout``: {suite: sequences}; a sequence is a
    :class:`HeldoutSequence` (prompt + the target's greedy continuation) or a token list (a prompt: the target
    continues it greedily for ``heldout_new_tokens``). ``source``: the original drafter, evaluated on the same suites
    for the report. ``settings.hidden_states_dir``: a folder of feature files
    (:class:`eagle_migrate.features.PrecomputedFeatures`) used instead of running the target on
    ``train_sequences``. ``max_minutes`` / ``ends_by``: the fine-tune's wall-clock budget
    (:meth:`CalibrationSettings.budget_s`; docs/calibration.md ``--max-minutes``). ``steps`` 0: the judge alone (no
    training feature is captured and nothing trains; the drafter and the source are scored). Returns the report; the model
    holds the best weights (possibly the initial ones). Raises :class:`CheckFailed` when ``require_improvement``
    and the held-out score did not improve, or the returned drafter is below ``source`` beyond noise.

    The judge (docs/calibration.md): every drafter is scored on the same held-out positions; a candidate replaces
    the best only when better by more than :data:`JUDGE_Z` standard errors of the paired difference, so the
    returned drafter is the initial one unless a candidate beat it beyond noise. ``statistics_tokens``,
    ``data_name`` and ``data_warning`` are reported as they are (convert's statistics pass, the data's name).
    """
    s = CalibrationSettings.of(settings, **options)
    report = progress_adapter(s.progress)
    t0 = time.perf_counter()
    dev = resolve_device(s.device)
    dflt = defaults_for(dev)
    cfg = s.fit_config(dflt)
    seq_len = s.seq_len or dflt["seq_len"]
    batch = s.batch or dflt["batch"]
    new_tokens = s.heldout_new_tokens or dflt["heldout_new_tokens"]
    names = trainable_names(model, s.mode)
    if not names:
        raise InputError(f"--train {s.mode}: the drafter has no such parameters")
    layer_ids = model.cfg.aux_layer_ids or vllm_default_aux_ids(target.info.num_layers)
    cdir = Path(s.cache_dir) if s.cache_dir is not None else None

    model.to(dev, torch.float32)
    if source is not None:
        source.to(dev, torch.float32).eval()
    head = TargetHead.from_target(target, draft_to_target_ids(model).cpu(), dev)
    precomputed = s.hidden_states_dir
    judge_only = cfg.steps == 0  # no training: the judge scores the drafter as it is (and the source)
    feats, n_train, suites, not_measured = _features_and_suites(
        target, train_sequences, heldout, precomputed, layer_ids, judge_only=judge_only, batch=batch, seq_len=seq_len,
        new_tokens=new_tokens, loss_masks=loss_masks, cdir=cdir, report=report)

    block = judge_block(cfg.k)
    before = _evaluate_suites(model, suites, cfg.k, dev)
    src_res = _evaluate_suites(source, suites, cfg.k, dev) if source is not None and suites else None
    s_before = _score(before)
    report({"phase": "before", "score": s_before, **{n: r.acceptance_length for n, r in before.items()}})
    if judge_only:
        fr = FitResult(steps_run=0, best_step=0, best_score=s_before, initial_score=s_before)
        after, vs_initial = before, None
    else:
        cfg = cfg.model_copy(update={"max_seconds": s.budget_s(time.time())})  # ends_by: what is left now
        fr, after, vs_initial = _fit_judged(model, names, feats, head, cfg, dev, suites, before, block,
                                            resume_dir=s.resume_dir, report=report)
    s_after = _score(after)
    improved = bool(suites) and fr.best_step > 0
    warning = (None if suites else "no held-out suites: nothing was judged") if judge_only else \
        _improvement_warning(suites, fr.best_step, improved, before, after, vs_initial)
    judge = None
    if suites:
        what = "EAGLE-3.1 conversion" if model.cfg.is_eagle31 else "fine-tuned EAGLE-3 drafter (architecture kept)"
        judge = _judge(before, after, src_res, vs_initial, block, statistics_tokens, _num_tokens(feats), what)
        if judge.worse_than_source:
            warnings.warn(judge.verdict, stacklevel=2)
            report({"phase": "warning", "message": judge.verdict})
    if warning:
        warnings.warn(warning, stacklevel=2)
        report({"phase": "warning", "message": warning})
    result = CalibrationResult(
        train=s.mode, trainable=names, device=str(dev),
        settings={**cfg.model_dump(), "seq_len": seq_len, "batch": batch, "heldout_new_tokens": new_tokens,
                  "aux_layer_ids": list(layer_ids)},
        steps_run=fr.steps_run, best_step=fr.best_step, stopped_early=fr.stopped_early, stop_reason=fr.stop_reason,
        resumed_from=fr.resumed_from,
        improved=improved, score_before=s_before, score_after=s_after,
        score_source=_score(src_res) if src_res else None,
        suites={n: SuiteAcceptance(suite=n, num_sequences=before[n].num_sequences, before=before[n], after=after[n],
                                   source=src_res[n] if src_res else None) for n in before},
        seconds=time.perf_counter() - t0, tokens_seen=fr.tokens_seen, train_sequences=n_train, history=fr.history,
        warning=warning, judge=judge, data=data_name, data_warning=data_warning, not_measured=not_measured,
    )
    if s.require_improvement:
        check_improvement(result)
    return result


# ----- calibrate's steps --------------------------------------------------------------------------------------------
def _features_and_suites(target: Any, train_sequences: Sequence[Sequence[int]] | None,
                         heldout: Mapping[str, Sequence[Any]] | None, precomputed: str | Path | None,
                         layer_ids: Sequence[int], *, judge_only: bool, batch: int, seq_len: int, new_tokens: int,
                         loss_masks: Sequence[Sequence[bool]] | None, cdir: Path | None,
                         report: Progress) -> tuple[Any, int, dict[str, Any], list[str]]:
    """(training features, their count, held-out suites, what was not measured): a precomputed folder split into
    both; for the judge alone (``judge_only``) no training features (they would never be read); else the target run
    on the training sequences and on the held-out continuations."""
    if precomputed is not None and not heldout:
        return _precomputed_split(target, precomputed, layer_ids, report)
    if judge_only:
        return None, 0, _heldout_suites(target, heldout, layer_ids, new_tokens, cdir, report), []
    feats, n_train = _training_features(target, train_sequences, precomputed, layer_ids, batch=batch, seq_len=seq_len,
                                        loss_masks=loss_masks, cdir=cdir, report=report)
    return feats, n_train, _heldout_suites(target, heldout, layer_ids, new_tokens, cdir, report), []


def _training_features(target: Any, train_sequences: Sequence[Sequence[int]] | None, precomputed: str | Path | None,
                       layer_ids: Sequence[int], *, batch: int, seq_len: int,
                       loss_masks: Sequence[Sequence[bool]] | None, cdir: Path | None, report: Progress) -> tuple[Any, int]:
    """(the training features, the number of training sequences): a precomputed folder, or the target run on
    ``train_sequences`` (captured up front when cached)."""
    if precomputed is not None:
        fnw = target.final_norm_weight
        feats: Any = PrecomputedFeatures(precomputed, list(layer_ids), target.info.hidden_size,
                                         final_norm=None if fnw is None else (fnw.detach(), target.info.rms_norm_eps),
                                         num_layers=target.info.num_layers)
        return feats, len(feats)
    if not train_sequences:
        raise InputError("calibration needs training sequences (or precomputed features)")
    feats = FeatureStore(target, train_sequences, layer_ids, batch=batch, seq_len=seq_len, loss_masks=loss_masks,
                         cache_dir=cdir, name="calib-train", store_dtype=_feature_dtype(target),
                         keep_in_memory=_in_memory(target, train_sequences, layer_ids, seq_len))
    if cdir is not None:
        feats.prefetch(lambda e: report({"phase": "capture", **e}))
    return feats, len(train_sequences)


def _precomputed_split(target: Any, precomputed: str | Path, layer_ids: Sequence[int],
                       report: Progress) -> tuple[Any, int, dict[str, Any], list[str]]:
    """``--hidden-states`` without held-out prompts (the target is not run, so it has no greedy continuations): the
    folder's files split into training files and a held-out suite ``files`` (:class:`HeldoutFromFiles`, scored
    where the text is the target's greedy choice). Returns (training features, their count, suites, what was not
    measured)."""
    fnw = target.final_norm_weight
    fn = None if fnw is None else (fnw.detach(), target.info.rms_norm_eps)
    ids = list(layer_ids)
    probe = PrecomputedFeatures(precomputed, ids, target.info.hidden_size, final_norm=fn, num_layers=target.info.num_layers)
    n = len(probe)
    train_idx, held_idx = split_files(n, max(1, min(16, n // 5)))
    feats = PrecomputedFeatures(precomputed, ids, target.info.hidden_size, final_norm=fn, num_layers=target.info.num_layers,
                                indices=train_idx)
    note = ["held-out suites chat / long / template-shift on the target's greedy continuations (they need the target "
            "to generate; --hidden-states does not run it)"]
    if not held_idx:
        return feats, len(train_idx), {}, note + ["held-out evaluation: the folder has too few files to hold any out"]
    report({"phase": "heldout", "suite": "files", "sequences": len(held_idx)})
    held = HeldoutFromFiles(PrecomputedFeatures(precomputed, ids, target.info.hidden_size, final_norm=fn,
                                                num_layers=target.info.num_layers, indices=held_idx),
                            target.lm_head_weight, getattr(target, "lm_head_bias", None))
    note.append(f"the simulated AL where the text is not the target's greedy choice ({1 - held.greedy_fraction:.0%} of the "
                f"positions of the held-out suite 'files', {len(held_idx)} of the folder's {n} files): its AL is a lower bound")
    return feats, len(train_idx), {"files": (held, held.prompt_lens)}, note


def _heldout_suites(target: Any, heldout: Mapping[str, Sequence[Any]] | None, layer_ids: Sequence[int],
                    new_tokens: int, cdir: Path | None, report: Progress) -> dict[str, tuple[FeatureStore, list[int]]]:
    """{suite: (features, prompt lengths)} of the held-out greedy continuations (long ones are not truncated)."""
    suites: dict[str, tuple[FeatureStore, list[int]]] = {}
    for name, seqs in (heldout or {}).items():
        if not seqs:
            continue
        report({"phase": "heldout", "suite": name, "sequences": len(seqs)})
        held = heldout_sequences(target, list(seqs), new_tokens, cdir, name,
                                 progress=lambda stage, done, total, info: report(
                                     {"phase": "generate", "stage": stage, "done": done, "total": total, "info": info}))
        store = FeatureStore(target, [h.ids for h in held], layer_ids, batch=1 if max(len(h.ids) for h in held) > 1024 else 4,
                             seq_len=max(len(h.ids) for h in held), cache_dir=cdir, name=f"heldout-{name}",
                             keep_in_memory=True)  # small, and evaluated again and again
        suites[name] = (store, [h.prompt_len for h in held])
    return suites


def _evaluate_suites(m: EagleDrafter, suites: Mapping[str, tuple[FeatureStore, list[int]]], k: int,
                     dev: torch.device) -> dict[str, SimulatedAcceptance]:
    return {n: simulated_acceptance(m, st, pl, k, dev, autocast=dev.type == "cuda") for n, (st, pl) in suites.items()}


def _score(res: Mapping[str, SimulatedAcceptance]) -> float:
    """The mean simulated AL over the suites."""
    return sum(r.acceptance_length for r in res.values()) / len(res) if res else float("nan")


def lr_scales(model: EagleDrafter, names: Sequence[str]) -> dict[str, float]:
    """Per-parameter learning-rate multipliers for Adam, whose steps are absolute: each norm's lr is scaled by its
    mean |weight| (they range from ~1 to ~25: fc_norm holds the aux layers' RMS), so every norm changes by the same
    share per step; lm_head's lr is divided by R where convert folded the final norm for ``norm_output``
    (``convert/eagle3.py``: ``norm.weight`` = R, flat, ~18 on a plain EAGLE-3 source, and lm_head divided by R).
    lm_head reads that norm's output, so undivided steps would move the logits R times as far as on the unfolded
    drafter (on the plain source the fine-tune diverged, loss 4.8 -> 5.4, session 20). A norm that is not flat was
    trained, not folded: lm_head keeps the plain lr."""
    params = dict(model.named_parameters())
    norms = set(trainable_names(model, "norms"))
    scale = {n: max(float(params[n].detach().abs().mean()), 1e-3) for n in names if n in norms}
    w = params["norm.weight"].detach() if "norm.weight" in params else None
    if model.cfg.norm_output and "lm_head.weight" in names and w is not None and bool((w == w.flatten()[0]).all()):
        scale["lm_head.weight"] = 1.0 / max(float(w.abs().mean()), 1e-3)
    return scale


def _fit_judged(model: EagleDrafter, names: list[str], feats: Any, head: TargetHead, cfg: FitConfig, dev: torch.device,
                suites: Mapping[str, tuple[FeatureStore, list[int]]], before: dict[str, SimulatedAcceptance],
                block: int, *, resume_dir: str | Path | None,
                report: Progress) -> tuple[Any, dict[str, SimulatedAcceptance], Comparison | None]:
    """Run :func:`eagle_migrate.train.fit` with the judge keeping the best (a candidate replaces it only when better
    beyond noise), then hand back the initial weights unless the result beats them beyond noise.
    Returns (the fit's result, the returned drafter's evaluation, returned minus initial)."""
    def evaluate() -> Evaluation:
        res = _evaluate_suites(model, suites, cfg.k, dev)
        report({"phase": "heldout-eval", **{n: r.acceptance_length for n, r in res.items()}})
        return Evaluation(_score(res), res)

    def better(new: Evaluation, best: Evaluation) -> tuple[bool, dict[str, Any]]:
        c = Comparison.of(new.detail, best.detail, block)
        return c.better(), {"diff_vs_best": c.diff, "diff_se": c.se, "walk_diff_vs_best": c.walk_diff,
                            "walk_diff_se": c.walk_se}

    params = dict(model.named_parameters())
    lr_scale = lr_scales(model, names)
    initial = {n: params[n].detach().clone() for n in names}
    fr = fit(model, names, feats, head, cfg, device=dev, evaluate=evaluate if suites else None,
             initial_score=Evaluation(_score(before), before) if suites else None, resume_dir=resume_dir,
             progress=report, lr_scale=lr_scale, better=better, give_up=futility if suites else None)
    # the returned weights' evaluation is the one that made them the best (the same weights: the judge's simulated AL
    # is deterministic), else scored again
    after = fr.best_eval.detail if fr.best_eval is not None and suites else _evaluate_suites(model, suites, cfg.k, dev)
    vs_initial = Comparison.of(after, before, block) if suites else None
    if vs_initial is not None and fr.best_step > 0 and not vs_initial.better():
        # accepted step by step, yet not beyond noise against the initial drafter itself: hand back the initial one
        with torch.no_grad():
            for n in names:
                params[n].copy_(initial[n])
        fr.best_step = 0
        after = before
        vs_initial = Comparison.of(after, before, block)
    return fr, after, vs_initial


def _improvement_warning(suites: Mapping[str, Any], best_step: int, improved: bool,
                         before: Mapping[str, SimulatedAcceptance], after: Mapping[str, SimulatedAcceptance],
                         vs_initial: Comparison | None) -> str | None:
    """The report's warning: no held-out suites, no improvement, or a suite that went down beyond noise."""
    s_before, s_after = _score(before), _score(after)
    if not suites:
        return "no held-out suites: the final weights are returned unchecked"
    if not improved:
        return (f"calibration did not improve the held-out simulated AL ({s_before:.3f} -> best {s_after:.3f}); "
                "the initial weights are returned unchanged" if best_step == 0 else
                f"calibration did not improve the held-out simulated AL ({s_before:.3f} -> {s_after:.3f})")
    worse = vs_initial.below() if vs_initial is not None else {}
    if worse:
        return "simulated AL went down beyond noise on " + ", ".join(
            f"{n} ({before[n].acceptance_length:.3f} -> {after[n].acceptance_length:.3f}, paired {d.diff:+.3f} "
            f"+/- {d.se:.3f}, in vLLM's walk {d.walk_diff:+.3f} +/- {d.walk_se:.3f})" for n, d in worse.items())
    return None


def _judge(before: dict[str, SimulatedAcceptance], after: dict[str, SimulatedAcceptance],
           src_res: dict[str, SimulatedAcceptance] | None, vs_initial: Comparison | None, block: int,
           statistics_tokens: int | None, training_tokens: int | None, what: str = "EAGLE-3.1 conversion") -> Judge:
    """The judge's findings: the returned drafter against the initial one and the source, and the verdict."""
    vs_source = Comparison.of(after, src_res, block) if src_res else None
    worse_than_source = False
    if vs_source is not None:
        worse_than_source, verdict = source_verdict(vs_source, after, src_res, what=what)
    else:
        verdict = "no source drafter given: the judge compared the calibrated drafter with the initial one only"
    return Judge(
        block=block, heldout_sequences=sum(r.num_sequences for r in after.values()),
        heldout_drafts=sum(r.num_drafts for r in after.values()),
        heldout_positions=sum(r.num_positions for r in after.values()), statistics_tokens=statistics_tokens,
        training_tokens=training_tokens, vs_initial=vs_initial, vs_source=vs_source,
        initial_vs_source=Comparison.of(before, src_res, block) if src_res else None,
        worse_than_source=worse_than_source if src_res else None, verdict=verdict)


def _num_tokens(feats: Any) -> int | None:
    """Tokens in the training set; None for a precomputed folder (counting would read every file)."""
    return int(feats.num_tokens) if isinstance(feats, FeatureStore) else None
