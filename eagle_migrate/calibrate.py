"""Calibration: a short fine-tune of a converted EAGLE-3.1 drafter, trained the way vLLM runs it.

The objective, the unrolled k-step attention pattern and the loop live in :mod:`eagle_migrate.train`, the held-out
statistics (simulated acceptance, paired differences with standard errors) in :mod:`eagle_migrate.judge`; this module
picks what trains (``norms`` | ``norms+fc`` | ``all``), evaluates simulated greedy acceptance per held-out suite
(chat, long context, template shift: sequences that are the target's own greedy continuations) for the source and
the candidate, keeps the best checkpoint, stops early, and refuses to hand back a drafter worse than the one it got
without saying so (``require_improvement`` turns that into :class:`CheckFailed`, exit 1).

Two entry points:
* :func:`calibrate` -- library form: an :class:`EagleDrafter` and a loaded :class:`Target` in, the model updated in
  place (best weights) and a :class:`CalibrationResult` out.
* :func:`calibrate_checkpoint` -- a checkpoint folder in the vLLM layout in, calibrated in place (what ``convert``
  calls).
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, Field

from .calibration_data import (
    default_data,
    heldout_sequences,
    resolve_data,
    vllm_continuations,
)
from .aux_ids import vllm_default_aux_ids
from .choices import TrainMode, values
from .drafter.model import EagleDrafter
from .progress import StageProgress
from .errors import CheckFailed, InputError, UnsupportedError
from .judge import (
    JUDGE_Z,
    Comparison,
    SimulatedAcceptance,
    futility,
    judge_block,
    simulated_acceptance,
)
from .train import Evaluation, FitConfig, Progress, draft_to_target_ids, fit
from .features import FeatureStore, HeldoutFromFiles, PrecomputedFeatures, TargetHead, split_files

TRAIN_MODES: tuple[str, ...] = values(TrainMode)
# learning rates per mode (docs/calibration.md has the sweep they come from)
# all: 1e-3 from a sweep of the EAGLE-2 -> 3.1 fine-tune on the SmolLM2 pair (3e-4 / 1e-3 / 3e-3 at 120 steps: held-out
# simulated AL 1.214 / 1.277 / 1.271, 3e-3 already past its best at step 100; docs/benchmarks.md); norms+fc unmeasured
DEFAULT_LR: dict[str, float] = {"norms": 5e-3, "norms+fc": 5e-4, "all": 1e-3}
# held-out sizes: docs/calibration.md "How many held-out drafts" (a 2 % AL change at AL 1.3 and 2.5 needs about
# 2,200-2,500 drafts per suite for one AL's standard error, fewer for a paired difference): chat and template-shift
# get ~2,000-3,000 scored positions each (40-48 prompts x 64 continuation tokens); the long suite stays smaller
# (each long document costs a long target forward) and says so through its standard error
DEFAULTS: dict[str, Any] = {"steps": 200, "warmup": 10, "schedule": "cosine", "clip": 1.0, "k": 3, "seq_len": 512,
                            "batch": 4, "eval_every": 25, "patience": 4, "heldout_new_tokens": 64,
                            "heldout_per_suite": 48, "heldout_long_buckets": (1024, 2048, 4096, 8192),
                            "heldout_long_per_bucket": 4, "heldout_shift_max": 48}
# on a CPU the fine-tune must finish in minutes for a small target (docs/benchmarks.md "calibration": the SmolLM2
# pair peaked at step 30 of 40 with 256-token sequences): fewer, shorter steps, and no 4k/8k-token documents
CPU_DEFAULTS: dict[str, Any] = {"steps": 60, "seq_len": 256, "eval_every": 10, "patience": 3,
                                "heldout_per_suite": 40, "heldout_long_buckets": (1024, 2048),
                                "heldout_long_per_bucket": 2, "heldout_shift_max": 40}


def _default_patience(train: str, dflt: dict[str, Any]) -> int | None:
    """Early stopping for the norm modes; none for ``all``: retraining every weight (EAGLE-2 sources) climbs slowly
    through dips longer than the norm modes' patience (SmolLM2 on an H100: a 100-step dip at step 200, a 400-step
    one at 475, best at step 925 of 1000; docs/benchmarks.md). The best evaluation is still the one returned."""
    return None if train == "all" else dflt["patience"]


def defaults_for(device: str | torch.device) -> dict[str, Any]:
    """:data:`DEFAULTS`, with :data:`CPU_DEFAULTS` over them on a CPU."""
    return {**DEFAULTS, **(CPU_DEFAULTS if torch.device(device).type == "cpu" else {})}

NORM_SUFFIXES = ("hidden_norm.weight", "input_layernorm.weight", "post_attention_layernorm.weight")


def trainable_names(model: EagleDrafter, mode: str) -> list[str]:
    """Parameter names that train in ``mode`` (embeddings and d2t never do).

    norms: ``fc_norm.*`` (the inserted EAGLE-3.1 norms), ``input_norm`` when present, and the norms they feed or
    that see the fed-back state: every layer's ``hidden_norm`` / ``input_layernorm`` / ``post_attention_layernorm``
    and the final ``norm``. norms+fc: plus ``fc``. all: every parameter except ``embed_tokens``.
    """
    if mode not in TRAIN_MODES:
        raise InputError(f"--train {mode!r}: expected one of {', '.join(TRAIN_MODES)}")
    names = [n for n, _ in model.named_parameters()]
    norms = [n for n in names if n.startswith("fc_norm.") or n in ("input_norm.weight", "norm.weight") or n.endswith(NORM_SUFFIXES)]
    if mode == "norms":
        return norms
    if mode == "norms+fc":
        return norms + [n for n in names if n.startswith("fc.")]
    return [n for n in names if n != "embed_tokens.weight"]


class SuiteAcceptance(BaseModel):
    """Simulated greedy acceptance on one held-out suite."""

    suite: str
    num_sequences: int
    before: SimulatedAcceptance = Field(description="the drafter as it came in (initialised / converted)")
    after: SimulatedAcceptance = Field(description="the drafter handed back (best checkpoint)")
    source: SimulatedAcceptance | None = Field(None, description="the original source drafter, when given")

    @property
    def delta(self) -> float:
        return self.after.acceptance_length - self.before.acceptance_length


class Judge(BaseModel):
    """The held-out judge's findings: every comparison is paired over the same positions (docs/calibration.md)."""

    z: float = JUDGE_Z
    block: int = Field(description="consecutive positions per independent unit of the paired standard error")
    heldout_sequences: int
    heldout_drafts: int = Field(description="drafts of the returned drafter's greedy walk over the held-out suites")
    heldout_positions: int = Field(description="draftable positions every drafter is scored on")
    statistics_tokens: int | None = Field(None, description="tokens of the fc_norm statistics (convert's pass)")
    training_tokens: int | None = Field(None, description="tokens in the training sequences (each step sees a batch "
                                        "of them); None for precomputed features")
    vs_initial: Comparison | None = Field(None, description="returned minus initial (the structural conversion)")
    vs_source: Comparison | None = Field(None, description="returned minus the source drafter")
    initial_vs_source: Comparison | None = Field(None, description="structural conversion minus the source")
    worse_than_source: bool | None = Field(None, description="the returned drafter is below the source beyond noise "
                                           "on some suite (None: no source given)")
    verdict: str = Field("", description="one plain line")


def source_verdict(vs_source: Comparison, after: Mapping[str, SimulatedAcceptance],
                   source: Mapping[str, SimulatedAcceptance], z: float = JUDGE_Z) -> tuple[bool, str]:
    """(worse than the source beyond noise, one plain line saying how the returned drafter compares)."""
    below = vs_source.below(z)
    if below:
        n, d = min(below.items(), key=lambda kv: kv[1].relative)
        return True, (f"EAGLE-3.1 conversion drafts about {abs(100 * d.relative):.0f} % below the source on {n} "
                      f"(held-out simulated AL {after[n].acceptance_length:.3f} vs {source[n].acceptance_length:.3f}, "
                      f"paired difference {d.diff:+.3f} +/- {d.se:.3f} over {d.num_positions} positions); keep the "
                      "EAGLE-3 drafter, or calibrate with --data sharegpt (or --data FILE of your traffic) and more "
                      "--steps or --train norms+fc")
    if vs_source.better(z):
        return False, (f"EAGLE-3.1 conversion drafts about {100 * vs_source.relative:.1f} % above the source (held-out "
                       f"simulated AL, paired difference {vs_source.diff:+.3f} +/- {vs_source.se:.3f})")
    return False, (f"EAGLE-3.1 conversion is within noise of the source (paired difference {vs_source.diff:+.3f} "
                   f"+/- {vs_source.se:.3f} in AL, {100 * vs_source.relative:+.1f} %)")


class CalibrationResult(BaseModel):
    """What a calibration run did and what it achieved (JSON via ``model_dump``; Markdown via :meth:`markdown`)."""

    train: str = Field(description="norms | norms+fc | all")
    trainable: list[str]
    device: str
    settings: dict[str, Any]
    steps_run: int
    best_step: int = Field(description="0 = the initial weights were kept")
    stopped_early: bool
    stop_reason: str | None = Field(None, description="why it stopped early: patience | time limit | no reachable "
                                    "improvement (judge.futility: no candidate can beat the initial weights in the "
                                    "steps left)")
    resumed_from: int | None = None
    improved: bool = Field(description="the held-out score of the returned drafter beats the initial one")
    score_before: float = Field(description="mean simulated AL over the suites, initial drafter")
    score_after: float = Field(description="mean simulated AL over the suites, returned drafter")
    score_source: float | None = None
    suites: dict[str, SuiteAcceptance]
    seconds: float
    tokens_seen: int = Field(description="training positions (step 0) the drafter was trained on")
    train_sequences: int
    history: list[dict[str, Any]] = Field(default_factory=list)
    warning: str | None = None
    judge: Judge | None = Field(None, description="the paired held-out comparisons (None: no held-out suites)")
    data: str | None = Field(None, description="where the training sequences came from")
    data_warning: str | None = Field(None, description="set when the data cannot carry the decision (the built-in set)")
    not_measured: list[str] = Field(default_factory=list, description="what this run could not measure and why "
                                    "(--hidden-states: no target generation)")

    def markdown(self) -> str:
        k = self.settings.get("k", 3)
        j = self.judge
        counts = (f" Held-out: {j.heldout_sequences} sequences, {j.heldout_drafts} drafts, {j.heldout_positions} "
                  f"positions; training set {j.training_tokens} tokens"
                  + (f"; statistics {j.statistics_tokens} tokens" if j.statistics_tokens is not None else "") + "."
                  if j else "")
        lines = [
            f"## Calibration ({self.train}, {self.device})", "",
            f"{self.steps_run} steps (best at {self.best_step}{f', stopped early: {self.stop_reason}' if self.stopped_early else ''}), "
            f"{self.tokens_seen} training tokens, {self.seconds:.0f} s. Simulated greedy AL +/- standard error, k = {k}."
            + counts, "",
            "| suite | drafts | source | before | after | after - before (paired) | after - source (paired) | per-position after |",
            "|---|---|---|---|---|---|---|---|",
        ]

        def al(a: SimulatedAcceptance | None) -> str:
            return "-" if a is None else f"{a.acceptance_length:.3f} +/- {a.acceptance_length_se or 0:.3f}"

        def pd(c: Comparison | None, n: str) -> str:
            d = c.suites.get(n) if c else None
            return "-" if d is None else f"{d.diff:+.3f} +/- {d.se:.3f} ({100 * d.relative:+.1f} %)"

        for s in self.suites.values():
            pp = ", ".join(f"{x:.3f}" for x in s.after.per_position_rate)
            lines.append(f"| {s.suite} | {s.after.num_drafts} | {al(s.source)} | {al(s.before)} | {al(s.after)} | "
                         f"{pd(j.vs_initial if j else None, s.suite)} | {pd(j.vs_source if j else None, s.suite)} | {pp} |")
        if j and j.verdict:
            lines += ["", f"**Verdict:** {j.verdict}"]
        if self.data_warning:
            lines += ["", f"**Data:** {self.data_warning}"]
        if self.warning:
            lines += ["", f"**Warning:** {self.warning}"]
        return "\n".join(lines) + "\n"


def resolve_device(device: Any = "auto") -> torch.device:
    """:func:`eagle_migrate.devices.resolve_device` as a ``torch.device`` (cuda without CUDA is an InputError)."""
    from .devices import resolve_device as _resolve

    return torch.device(_resolve(device))


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
    *,
    train: str = "norms",
    steps: int | None = None,
    lr: float | None = None,
    warmup: int | None = None,
    schedule: str | None = None,
    clip: float | None = None,
    k: int | None = None,
    seq_len: int | None = None,
    batch: int | None = None,
    seed: int = 0,
    device: str | torch.device | None = "auto",
    cache_dir: str | Path | None = None,
    resume_dir: str | Path | None = None,
    require_improvement: bool = False,
    progress: StageProgress | None = None,
    source: EagleDrafter | None = None,
    loss_masks: Sequence[Sequence[bool]] | None = None,
    precomputed: str | Path | None = None,  # a folder of feature files instead of running the target
    eval_every: int | None = None,
    patience: int | None = None,
    heldout_new_tokens: int | None = None,
    max_minutes: float | None = None,
    statistics_tokens: int | None = None,
    data_name: str | None = None,
    data_warning: str | None = None,
) -> CalibrationResult:
    """Fine-tune ``model`` (in place) on ``train_sequences`` under the unrolled k-step objective.

    ``heldout``: {suite: sequences}; a sequence is a :class:`HeldoutSequence` (prompt + the target's greedy
    continuation) or a token list (a prompt: the target continues it greedily for ``heldout_new_tokens``).
    ``source``: the original drafter, evaluated on the same suites for the report. ``precomputed``: a folder of
    feature files (:class:`eagle_migrate.features.PrecomputedFeatures`) used instead of running the target on
    ``train_sequences``. ``max_minutes``: a wall-clock budget for the training loop, checked after every step; the
    step where it runs out is evaluated and the best evaluation kept (the schedule stays step-based: with a budget
    shorter than ``steps`` need, the learning rate has not decayed when it stops). Returns the report; the model
    holds the best weights (possibly the initial ones). Raises :class:`CheckFailed` when ``require_improvement``
    and the held-out score did not improve, or the returned drafter is below ``source`` beyond noise.

    The judge (docs/calibration.md): every drafter is scored on the same held-out positions; a candidate replaces
    the best only when better by more than :data:`JUDGE_Z` standard errors of the paired difference, so the
    returned drafter is the initial one unless a candidate beat it beyond noise. ``statistics_tokens``,
    ``data_name`` and ``data_warning`` are reported as they are (convert's statistics pass, the data's name).
    """
    report = _progress_adapter(progress)
    t0 = time.perf_counter()
    dev = resolve_device(device)
    dflt = defaults_for(dev)
    cfg = _fit_config(train, dflt, steps=steps, lr=lr, warmup=warmup, schedule=schedule, clip=clip, k=k, seed=seed,
                      eval_every=eval_every, patience=patience, max_minutes=max_minutes)
    seq_len = seq_len or dflt["seq_len"]
    batch = batch or dflt["batch"]
    new_tokens = heldout_new_tokens or dflt["heldout_new_tokens"]
    names = trainable_names(model, train)
    if not names:
        raise InputError(f"--train {train}: the drafter has no such parameters")
    layer_ids = model.cfg.aux_layer_ids or vllm_default_aux_ids(target.info.num_layers)
    cdir = Path(cache_dir) if cache_dir is not None else None

    model.to(dev, torch.float32)
    if source is not None:
        source.to(dev, torch.float32).eval()
    head = TargetHead.from_target(target, draft_to_target_ids(model).cpu(), dev)
    not_measured: list[str] = []
    if precomputed is not None and not heldout:
        feats, n_train, suites, not_measured = _precomputed_split(target, precomputed, layer_ids, report)
    else:
        feats, n_train = _training_features(target, train_sequences, precomputed, layer_ids, batch=batch, seq_len=seq_len,
                                            loss_masks=loss_masks, cdir=cdir, report=report)
        suites = _heldout_suites(target, heldout, layer_ids, new_tokens, cdir, report)

    block = judge_block(cfg.k)
    before = _evaluate_suites(model, suites, cfg.k, dev)
    src_res = _evaluate_suites(source, suites, cfg.k, dev) if source is not None and suites else None
    s_before = _score(before)
    report({"phase": "before", "score": s_before, **{n: r.acceptance_length for n, r in before.items()}})
    fr, after, vs_initial = _fit_judged(model, names, feats, head, cfg, dev, suites, before, block,
                                        resume_dir=resume_dir, report=report)
    s_after = _score(after)
    improved = bool(suites) and fr.best_step > 0
    warning = _improvement_warning(suites, fr.best_step, improved, before, after, vs_initial)
    judge = None
    if suites:
        judge = _judge(before, after, src_res, vs_initial, block, statistics_tokens, _num_tokens(feats))
        if judge.worse_than_source:
            warnings.warn(judge.verdict, stacklevel=2)
            report({"phase": "warning", "message": judge.verdict})
    if warning:
        warnings.warn(warning, stacklevel=2)
        report({"phase": "warning", "message": warning})
    result = CalibrationResult(
        train=train, trainable=names, device=str(dev),
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
    if require_improvement:
        check_improvement(result)
    return result


# ----- calibrate's steps --------------------------------------------------------------------------------------------
def _fit_config(train: str, dflt: dict[str, Any], *, steps: int | None, lr: float | None, warmup: int | None,
                schedule: str | None, clip: float | None, k: int | None, seed: int, eval_every: int | None,
                patience: int | None, max_minutes: float | None) -> FitConfig:
    """The trainer's settings: the caller's where given, else the device's defaults (:func:`defaults_for`)."""
    return FitConfig(
        steps=dflt["steps"] if steps is None else steps, lr=lr or DEFAULT_LR.get(train, 5e-4),
        warmup=dflt["warmup"] if warmup is None else warmup, schedule=schedule or dflt["schedule"],
        clip=clip or dflt["clip"], k=k or dflt["k"], seed=seed,
        eval_every=eval_every or dflt["eval_every"], patience=_default_patience(train, dflt) if patience is None else patience,
        max_seconds=None if max_minutes is None else max_minutes * 60.0,
    )


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
                         cache_dir=cdir, name="calib-train", store_dtype=_feature_dtype(target))
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
        held = heldout_sequences(target, list(seqs), new_tokens, cdir, name)
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
        return c.better(), {"diff_vs_best": c.diff, "diff_se": c.se}

    # norm weights range from ~1 to ~25 (fc_norm = the aux layers' RMS): Adam's steps are absolute, so each norm's
    # learning rate is scaled by its mean |weight| -> the same relative change per step for every norm
    params = dict(model.named_parameters())
    norms = set(trainable_names(model, "norms"))
    lr_scale = {n: max(float(params[n].detach().abs().mean()), 1e-3) for n in names if n in norms}
    initial = {n: params[n].detach().clone() for n in names}
    fr = fit(model, names, feats, head, cfg, device=dev, evaluate=evaluate if suites else None,
             initial_score=Evaluation(_score(before), before) if suites else None, resume_dir=resume_dir,
             progress=report, lr_scale=lr_scale, better=better, give_up=futility if suites else None)
    after = _evaluate_suites(model, suites, cfg.k, dev)
    vs_initial = Comparison.of(after, before, block) if suites else None
    if vs_initial is not None and fr.best_step > 0 and not vs_initial.better():
        # accepted step by step, yet not beyond noise against the initial drafter itself: hand back the initial one
        with torch.no_grad():
            for n in names:
                params[n].copy_(initial[n])
        fr.best_step = 0
        after = _evaluate_suites(model, suites, cfg.k, dev)
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
            f"+/- {d.se:.3f})" for n, d in worse.items())
    return None


def _judge(before: dict[str, SimulatedAcceptance], after: dict[str, SimulatedAcceptance],
           src_res: dict[str, SimulatedAcceptance] | None, vs_initial: Comparison | None, block: int,
           statistics_tokens: int | None, training_tokens: int | None) -> Judge:
    """The judge's findings: the returned drafter against the initial one and the source, and the verdict."""
    vs_source = Comparison.of(after, src_res, block) if src_res else None
    worse_than_source = False
    if vs_source is not None:
        worse_than_source, verdict = source_verdict(vs_source, after, src_res)
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


def check_improvement(res: CalibrationResult) -> None:
    """``--require-improvement``: CheckFailed (exit 1) when the calibration did not beat the initial drafter
    beyond noise, or the returned drafter is below the source beyond noise."""
    if res.judge is not None and res.judge.worse_than_source:
        raise CheckFailed(res.judge.verdict)
    if not res.improved:
        raise CheckFailed(f"calibration did not improve the drafter: held-out simulated AL {res.score_before:.3f} -> {res.score_after:.3f}",
                          "more or more varied --data, more --steps, or --train norms+fc; the output keeps the initial weights")


def _al_text(e: dict[str, Any]) -> str:
    """The held-out AL per suite of a ``before`` / ``heldout-eval`` event: ``chat 1.301 long 1.429 ...``."""
    return " ".join(f"{k} {v:.3f}" for k, v in e.items() if isinstance(v, float) and k != "score")


def _train_info(e: dict[str, Any], al_text: str) -> str:
    """One ``train`` event as a progress line: loss, top-1 agreement per draft step, the last held-out AL."""
    acc = "/".join(f"{x:.2f}" for x in e.get("step_acc", []))
    return f"loss {e['loss']:.3f}, top-1 per step {acc}" + (f"; held-out AL {al_text}" if al_text else "")


def _progress_adapter(progress: StageProgress | None) -> Progress:
    """The trainer's per-step records -> the library's stage events (``eagle_migrate.progress``): training steps
    carry the loss, per-step top-1 and the last held-out AL as ``info``."""
    if progress is None:
        return lambda e: None
    counts = {"heldout": 0, "eval": 0}
    last_al = {"text": ""}

    def adapt(e: dict[str, Any]) -> None:
        ph = e.get("phase")
        if ph == "train":
            progress("calibrate", e["step"], e["steps"], _train_info(e, last_al["text"]))
        elif ph == "capture":
            progress("calibrate: target features", e["batch"], e["batches"], "")
        elif ph == "heldout":
            counts["heldout"] += 1
            progress("calibrate: held-out suites", counts["heldout"], None, f"{e['suite']}: {e['sequences']} sequences")
        elif ph in ("before", "heldout-eval"):
            counts["eval"] += 1
            last_al["text"] = _al_text(e)
            progress("calibrate: held-out evaluations", counts["eval"], None, last_al["text"])
    return adapt


# ----- checkpoint form (what convert calls) -------------------------------------------------------------------------
def calibrate_checkpoint(
    checkpoint: str | Path,
    target: Any,
    *,
    data: str | None = None,
    hidden_states_dir: str | Path | None = None,
    train: str = "norms",
    steps: int | None = None,
    seed: int = 0,
    device: str | torch.device | None = "auto",
    dtype: Any = None,
    num_sequences: int | None = None,
    cache_dir: str | Path | None = None,
    resume_dir: str | Path | None = None,
    require_improvement: bool = False,
    progress: StageProgress | None = None,
    in_place: bool = True,
    out: str | Path | None = None,
    suites: Sequence[str] = ("chat", "long", "template-shift"),
    heldout_per_suite: int | None = None,
    loaded_target: Any = None,
    source_checkpoint: str | Path | None = None,
    **kw: Any,
) -> CalibrationResult:
    """Calibrate the drafter in ``checkpoint`` (vLLM layout) against ``target`` (path or loaded Target) and write
    the best weights back (``in_place``) or to ``out``; every tensor and config key but the trained ones is kept.

    ``dtype``: the target's (``auto``/None: bf16 on CUDA, fp32 on CPU; the drafter always trains in fp32 master
    weights). ``loaded_target``: the same target already loaded (convert passes its own, so a GPU does not hold
    it twice); ``target`` stays the path vLLM reads for the held-out continuations. ``source_checkpoint``: the
    drafter the checkpoint was converted from, scored on the same held-out positions (the source comparison).
    ``data`` None: :func:`resolve_data` picks ShareGPT for a real target when it is here, else the built-in set
    with a loud warning."""
    from .formats.output import atomic_output_dir
    from .formats.write import write_vllm
    from .devices import resolve_dtype
    from .target import Target, TargetWeights, load_target

    dev = resolve_device(device)
    if isinstance(target, Target):
        tgt = target
    elif loaded_target is not None:
        tgt = loaded_target
    elif hidden_states_dir is not None:  # never the whole target: embeddings, final norm, lm_head read lazily
        tgt = TargetWeights(str(target))
    else:
        tdtype = dtype if isinstance(dtype, torch.dtype) else resolve_dtype(dtype or "auto", dev.type)
        tgt = load_target(str(target), device=str(dev), dtype=tdtype)
    from .drafter.load import load_drafter
    from .formats import read_checkpoint

    ck = read_checkpoint(Path(checkpoint))
    if ck.quantization:
        raise UnsupportedError(f"{checkpoint}: the drafter is quantized; calibrate the unquantized drafter, then quantize it")
    model = load_drafter(ck, tgt)
    source = load_drafter(source_checkpoint, tgt) if source_checkpoint is not None else None
    data, data_warning = resolve_data(data, tgt.tokenizer) if hidden_states_dir is None else (data, None)
    if data_warning and tgt.tokenizer is not None:
        warnings.warn(data_warning, stacklevel=2)
    dflt = defaults_for(dev)
    seq_len = kw.pop("seq_len", None) or dflt["seq_len"]
    if hidden_states_dir is not None:  # training and held-out files both from the folder (_precomputed_split)
        train_seqs, held = None, None
    else:
        train_seqs, held = default_data(tgt, data, num_sequences or 64, seed, seq_len, suites=suites,
                                        heldout_per_suite=heldout_per_suite or dflt["heldout_per_suite"],
                                        long_buckets=dflt["heldout_long_buckets"], shift_max=dflt["heldout_shift_max"],
                                        long_per_bucket=dflt["heldout_long_per_bucket"])
    if not isinstance(target, Target) and tgt.tokenizer is not None and held:
        from .validate.engine import vllm_importable

        if vllm_importable():
            try:
                held = vllm_continuations(str(target), held, kw.get("heldout_new_tokens") or dflt["heldout_new_tokens"],
                                          cache_dir=cache_dir)
            except Exception as e:  # transformers' generate is the slower fallback
                warnings.warn(f"vLLM could not generate the held-out continuations ({str(e)[:120]}); using transformers", stacklevel=2)
    res = calibrate(model, tgt, train_seqs, held, train=train, steps=steps, seed=seed, device=dev, cache_dir=cache_dir,
                    resume_dir=resume_dir, require_improvement=False, progress=progress, seq_len=seq_len,
                    precomputed=hidden_states_dir, source=source,
                    data_name=str(hidden_states_dir or data or "builtin:chat"), data_warning=data_warning, **kw)
    dest = Path(out) if out is not None else Path(checkpoint)
    if res.best_step > 0 and (in_place or out is not None):
        sd = {n: t.detach().cpu() for n, t in model.state_dict().items()}
        if not ck.has("embed_tokens.weight"):
            sd.pop("embed_tokens.weight", None)
        raw = json.loads((Path(checkpoint) / "config.json").read_text()) if (Path(checkpoint) / "config.json").exists() else {}
        dt = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(str(raw.get("torch_dtype", "float32")), torch.float32)
        with atomic_output_dir(dest, force=True) as tmp:
            write_vllm(model.cfg, sd, tmp, dtype=dt, metadata={"calibrated": res.train},
                       extra_config={"eagle_migrate_calibration": {"train": res.train, "steps": res.steps_run, "best_step": res.best_step,
                                                                   "score_before": round(res.score_before, 4), "score_after": round(res.score_after, 4),
                                                                   "verdict": res.judge.verdict if res.judge else None}})
            for extra in Path(checkpoint).iterdir():  # provenance.json and other sidecar files travel along
                if extra.is_file() and extra.name not in ("config.json", "model.safetensors") and not extra.name.endswith(".safetensors"):
                    (tmp / extra.name).write_bytes(extra.read_bytes())
    if require_improvement:
        check_improvement(res)
    return res


__all__ = ["CalibrationResult", "SuiteAcceptance", "TRAIN_MODES", "DEFAULT_LR", "DEFAULTS", "CPU_DEFAULTS", "defaults_for", "calibrate",
           "calibrate_checkpoint", "trainable_names", "Judge", "check_improvement", "source_verdict"]
