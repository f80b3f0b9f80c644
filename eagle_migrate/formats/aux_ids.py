"""Aux layer ids: one definition of vLLM's behaviour, one pairing check, and the decision between the two
conventions the same config key is written in (docs/formats.md, "Aux layer ids").

vLLM 0.32 (``gpu_model_runner._get_eagle3_aux_layers_from_config``, ``interfaces.EagleModelMixin``, the decoder
loops of its ``models/llama.py``) reads ``eagle_aux_hidden_state_layer_ids`` (top level, else ``eagle_config``) **literally**:
id ``i`` is the residual stream after ``i`` decoder layers (0 = the embeddings, ``L`` = the last layer's output
before the final norm). It keeps ``sorted(set(ids))``, so duplicates collapse and unsorted ids are concatenated in
ascending order; an id outside ``0..L`` is never captured. With no ids it uses ``(2, L//2, L-3)`` through the same
``sorted(set(...))``. Whenever the captured states are not K (fc's chunks), the first request fails with a shape
error. :func:`vllm_captured` is that rule; :func:`check_aux_ids` turns it into findings.

Conventions: ``vllm`` (input-to-layer: the ids as vLLM reads them) and ``output-of-layer`` (SpecForge / SGLang /
ModelOpt training: stored id ``k`` = output of layer ``k`` = vLLM id ``k + 1``). A producer's layout never decides
between them; only a fingerprint written by one producer's writer does (:data:`FINGERPRINTS`), or a measurement
with the target (:mod:`eagle_migrate.aux_evidence`), or the user (``--aux-ids-convention``). When the measurement
shows both readings serve the same on the target at hand, a known producer's training convention (read in its code:
``producer_convention``) is written, recorded as taken from the producer, not measured; and a measurement in which
the drafter drafts under no reading (verdict ``no-evidence``) decides nothing.

A part of ``formats``: the readers' checks (``formats.checks``) call it and its findings are trap rows
(``formats.traps``), so it lives beside them. Imports: pydantic, ``choices``, ``errors``, ``formats.traps`` (and
``formats.base``'s types). Runs nothing: no corpora, drafter, loader or target (the measurement is ``aux_evidence``'s).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import BaseModel, Field

from ..choices import AuxIdsConvention as Convention
from ..errors import PairingError, a_an
from .traps import finding

if TYPE_CHECKING:  # pragma: no cover
    from .base import Checkpoint, Finding

DecidedBy = Literal["fingerprint", "measurement", "equivalent", "producer", "override", "unambiguous", "undecided"]
CONVENTIONS: tuple[Convention, ...] = get_args(Convention)


# ----- vLLM's rules ---------------------------------------------------------------------------------------------------
def vllm_default_raw(num_target_layers: int) -> tuple[int, int, int]:
    """``get_eagle3_default_aux_hidden_state_layers``: (2, L//2, L-3), as vLLM writes it (may repeat a layer)."""
    t = num_target_layers
    return (2, t // 2, t - 3)


def vllm_captured(ids: list[int] | tuple[int, ...], num_target_layers: int) -> list[int]:
    """The ids whose states vLLM 0.32 actually captures, in the order it concatenates them: ``sorted(set(ids))``
    restricted to ``0..L`` (id 0 = embeddings, id L = the last layer's output before the final norm)."""
    return [i for i in sorted(set(ids)) if 0 <= i <= num_target_layers]


def vllm_default_aux_ids(num_target_layers: int) -> list[int]:
    """What vLLM captures when a drafter records no ids (on a 4-layer target: [1, 2], two states)."""
    return vllm_captured(vllm_default_raw(num_target_layers), num_target_layers)


def to_vllm(stored: list[int], convention: Convention) -> list[int]:
    """Stored ids in ``convention`` -> vLLM ids (not sorted, not deduplicated: the check reports those)."""
    return [i + 1 for i in stored] if convention == "output-of-layer" else list(stored)


def eagle2_aux_ids(num_target_layers: int) -> list[int]:
    """Aux ids we choose for an EAGLE-2 source: (2, L//2, L-1), vLLM's default with the last id moved next to the
    last hidden state the EAGLE-2 fc read; filled with the lowest unused layers on tiny targets."""
    t = num_target_layers
    ids = sorted({min(2, t - 1), t // 2, t - 1})
    while len(ids) < 3:
        cand = [i for i in range(t) if i not in ids]
        if not cand:
            raise PairingError(f"the target has only {t} layers: an EAGLE-3.1 drafter needs 3 distinct aux layers")
        ids = sorted(ids + [cand[0]])
    return ids


# ----- the one check ------------------------------------------------------------------------------------------------
def check_aux_ids(ids: list[int] | None, num_aux: int, num_target_layers: int | None = None) -> list[Finding]:
    """Findings for vLLM ids ``ids`` (None = none written) against fc's K chunks and, when known, an L-layer target.

    Errors are exactly the cases where vLLM 0.32 captures other than K states (duplicates, ids outside 0..L, a
    count other than K, a default that collapses on a small target). ``aux_id_last_layer`` (a warning) and
    ``aux_ids_unsorted`` / ``aux_ids_default`` (info) are remarks. The two halves: :func:`check_aux_ids_alone`
    (what the checkpoint says by itself: the readers report it) and :func:`check_aux_ids_on_target`.
    """
    out = check_aux_ids_alone(ids, num_aux)
    if num_target_layers is not None:
        out += check_aux_ids_on_target(ids, num_aux, num_target_layers)
    return out


def check_aux_ids_alone(ids: list[int] | None, num_aux: int) -> list[Finding]:
    """What is wrong with stored ids whatever the target: duplicates, a count other than K, negative ids, order."""
    out: list[Finding] = []
    if ids is None:
        return out
    if len(set(ids)) != len(ids):
        out.append(finding("error", "aux_ids_duplicate", f"aux layer ids {ids} repeat a layer: vLLM captures it once and fc gets {len(set(ids))} of its {num_aux} chunks"))
    elif len(ids) != num_aux:
        out.append(finding("error", "aux_ids_count_mismatch", f"{len(ids)} aux layer ids {ids} but fc takes K={num_aux} chunks"))
    if any(i < 0 for i in ids):
        out.append(finding("error", "aux_ids_out_of_range", f"aux layer ids {ids} include a negative id (vLLM never captures it)"))
    if list(ids) != sorted(ids):
        out.append(finding("info", "aux_ids_unsorted", f"aux layer ids {ids} are not ascending; vLLM concatenates in ascending order"))
    return out


def check_aux_ids_on_target(ids: list[int] | None, num_aux: int, num_target_layers: int) -> list[Finding]:
    """What only an L-layer target decides: vLLM's default ids when none are written, ids beyond L, id L."""
    out: list[Finding] = []
    t = num_target_layers
    if ids is None:
        raw, got = list(vllm_default_raw(t)), vllm_default_aux_ids(t)
        if len(got) != num_aux:
            out.append(finding("error", "aux_ids_default_invalid",
                               f"no aux ids, and vLLM's fallback (2, L//2, L-3) = {raw} for L={t} captures layers {got}, "
                               f"not the {num_aux} fc expects: vLLM crashes on the first request"))
        else:
            out.append(finding("info", "aux_ids_default", f"without ids vLLM uses {got} for this target; eagle-migrate writes them explicitly on conversion"))
        return out
    if any(i < 0 for i in ids):  # already out of range (check_aux_ids_alone)
        return out
    bad = [i for i in ids if i > t]
    if bad:
        out.append(finding("error", "aux_ids_out_of_range",
                           f"aux layer id {bad[0]} is beyond the target's {t} layers (vLLM captures ids 0..{t}); the ids are {ids}"))
    elif t in ids:
        out.append(finding("warning", "aux_id_last_layer", f"aux id {t} = the last layer's output: vLLM captures it before the final norm (transformers' hidden_states[{t}] is after it)"))
    return out


def pairing_error(ids: list[int] | None, num_aux: int, num_target_layers: int) -> str | None:
    """The first error of :func:`check_aux_ids`, or None: what convert refuses (exit 2)."""
    errs = [f.message for f in check_aux_ids(ids, num_aux, num_target_layers) if f.severity == "error"]
    return errs[0] if errs else None


# ----- the decision -------------------------------------------------------------------------------------------------
class Candidate(BaseModel):
    convention: Convention
    ids: list[int] = Field(..., description="in vLLM's convention, sorted")
    evidence: list[str] = Field(default_factory=list, description="what speaks for (or against) this reading")
    statistic: float | None = Field(None, description="measured: mean step-0 log-likelihood (nats) of the target's next token")
    agreement: float | None = Field(None, description="measured: step-0 top-1 agreement with the target's next token (reported, does not decide)")


Verdict = Literal["first", "second", "equivalent", "inconclusive", "no-evidence"]


class Measurement(BaseModel):
    """Two readings (aux-id conventions, or a flag's two values) compared on the same positions of the target
    (``eagle_migrate.aux_evidence``): the paired per-position difference of the step-0 log-likelihood of the
    target's next token, its standard error clustered by sequence, and the verdict of the sequential rule."""

    statistic: str = Field("step-0 log-likelihood of the target's next token (nats per position)")
    readings: list[str] = Field(..., description="the two readings compared, in order (difference = first - second)")
    positions: int
    sequences: int
    mean: dict[str, float] = Field(default_factory=dict, description="reading -> mean statistic over the positions")
    agreement: dict[str, float] = Field(default_factory=dict, description="reading -> step-0 top-1 agreement (reported, not deciding)")
    difference: float = Field(..., description="first minus second, mean over the paired positions")
    standard_error: float = Field(..., description="of the difference, clustered by sequence")
    equivalence_bound: float = Field(0.0, description="|difference| + t SE below this (t: Student's t, aux_evidence.critical): the readings are equivalent")
    verdict: Verdict = "inconclusive"
    looks: int = Field(0, description="sequential looks taken")
    excluded: int = Field(0, description="positions whose target token is outside the draft vocabulary (both readings -inf)")
    uniform: float | None = Field(None, description="the statistic of a uniform guess over the draft vocabulary, -ln(Vd)")
    clamped: dict[str, float] = Field(default_factory=dict, description="reading -> share of positions at the floor (aux_evidence.LOGP_FLOOR)")
    drafts: dict[str, bool] = Field(default_factory=dict, description="reading -> whether the drafter drafts under it (aux_evidence.drafts)")
    no_evidence: str = Field("", description="why the measurement is no evidence (verdict no-evidence)")
    seconds: float = 0.0
    rule: str = ""

    @property
    def winner(self) -> str | None:
        return self.readings[0] if self.verdict == "first" else self.readings[1] if self.verdict == "second" else None

    def summary(self) -> str:
        a, b = self.readings
        return (f"{self.statistic} on {self.positions} positions in {self.sequences} sequences: {a} "
                f"{self.mean.get(a, float('nan')):.3f}, {b} {self.mean.get(b, float('nan')):.3f}, difference "
                f"{self.difference:+.4f} +- {self.standard_error:.4f} (top-1 agreement {self.agreement.get(a, float('nan')):.3f} vs "
                f"{self.agreement.get(b, float('nan')):.3f})")

    def tried(self, names: dict[str, str] | None = None) -> str:
        """Each reading as tried: its top-1 agreement, mean statistic, share at the floor; and the uniform guess."""
        parts = [f"{(names or {}).get(r, r)}: top-1 agreement {self.agreement.get(r, float('nan')):.3f}, mean "
                 f"{self.mean.get(r, float('nan')):.3f} nats ({self.clamped.get(r, 0.0):.0%} of positions at the floor)"
                 for r in self.readings]
        base = f"; a uniform guess over the draft vocabulary scores {self.uniform:.3f}" if self.uniform is not None else ""
        return "; ".join(parts) + base + f"; {self.positions} positions in {self.sequences} sequences"


class AuxIds(BaseModel):
    """Stored aux ids and their convention, kept apart: what the checkpoint says, where, what each reading would be,
    what was decided and how."""

    stored: list[int] | None = Field(..., description="eagle_aux_hidden_state_layer_ids as written")
    where: str = Field("none", description="top-level, eagle_config or none")
    candidates: list[Candidate] = Field(default_factory=list)
    convention: Convention | None = Field(None, description="the decided convention (None: not decided)")
    decided_by: DecidedBy = "undecided"
    reason: str = ""
    measurement: Measurement | None = None
    producer_convention: Convention | None = Field(None, description="the convention the producer trains with, read in its code (used only when the readings are equivalent on the target)")
    producer_reason: str = ""

    @property
    def no_evidence(self) -> bool:
        """Measured, and the drafter drafts under no reading: nothing was decided by it."""
        return self.measurement is not None and self.measurement.verdict == "no-evidence"

    @property
    def decided(self) -> bool:
        return self.convention is not None

    @property
    def ids(self) -> list[int] | None:
        """vLLM ids of the decided convention (None when nothing is stored or nothing is decided)."""
        if self.stored is None or self.convention is None:
            return None
        return sorted(to_vllm(self.stored, self.convention))

    def candidate(self, convention: Convention) -> Candidate | None:
        return next((c for c in self.candidates if c.convention == convention), None)

    def decide(self, convention: Convention, by: DecidedBy, reason: str) -> AuxIds:
        return self.model_copy(update={"convention": convention, "decided_by": by, "reason": reason})


def from_stored(stored: list[int] | None, where: str, *, fingerprint: tuple[Convention, str] | None = None,
                notes: dict[str, list[str]] | None = None, producer: tuple[Convention, str] | None = None) -> AuxIds:
    """The reader's view: both readings of ``stored``; decided only by a writer-unique ``fingerprint``
    (convention, what was seen), or when nothing is stored (both conventions' defaults name the same tensors).
    ``producer``: (the convention the producer's training code captures, where that is read): kept for the case where
    a measurement shows both readings serve the same on the target (:func:`resolve`)."""
    if stored is None:
        return AuxIds(stored=None, where="none", convention="vllm", decided_by="unambiguous",
                      reason="no ids stored: vLLM uses its default (2, L//2, L-3); the output-of-layer trainers' default "
                             "(1, L//2-1, L-4) names the same states")
    cands = []
    for conv in CONVENTIONS:
        ev = list((notes or {}).get(conv, []))
        if fingerprint and fingerprint[0] == conv:
            ev.insert(0, fingerprint[1])
        cands.append(Candidate(convention=conv, ids=sorted(to_vllm(stored, conv)), evidence=ev))
    a = AuxIds(stored=list(stored), where=where, candidates=cands,
               producer_convention=producer[0] if producer else None, producer_reason=producer[1] if producer else "")
    if fingerprint:
        a = a.decide(fingerprint[0], "fingerprint", fingerprint[1])
    return a


def findings(a: AuxIds, producer: str) -> list[Finding]:
    """What inspect reports about the convention (without a target, or after resolving with one)."""
    if a.stored is None or (a.decided_by == "fingerprint" and a.convention == "vllm"):
        return []  # nothing to say: the ids are what vLLM reads (aux_ids_evidence still says why)
    v, o = a.candidate("vllm"), a.candidate("output-of-layer")
    both = f"vLLM ids {v.ids if v else '?'} if written in vLLM's convention, {o.ids if o else '?'} if output-of-layer"
    if a.decided_by == "undecided" and a.no_evidence:
        m = a.measurement
        return [finding("warning", "aux_evidence_none",
                        f"aux layer ids {a.stored} ({producer}): {both}. Measuring on the target decided nothing: the "
                        f"drafter drafts under neither reading ({m.no_evidence}; {m.tried(_reading_names(a))}); the stored "
                        f"ids are read literally, as vLLM reads them. {NO_EVIDENCE_CAUSES}")]
    if a.decided_by == "undecided":
        # the hint knows what was tried: after a measurement on a target, only the explicit convention is left
        ask = (f"measuring on the target did not decide ({a.measurement.summary()}, {a.measurement.verdict}): pass "
               "--aux-ids-convention vllm|output-of-layer" if a.measurement is not None else
               "pass --target to measure, or --aux-ids-convention vllm|output-of-layer")
        return [finding("warning", "aux_ids_convention_ambiguous",
                        f"aux layer ids {a.stored} ({producer}): {both}; vLLM reads them literally. Nothing in the checkpoint "
                        f"tells which one it was trained with: {ask}")]
    if a.decided_by == "measurement" and a.measurement is not None:
        return [finding("info", "aux_ids_measured",
                        f"aux layer ids {a.stored}: {a.convention} by measurement ({a.measurement.summary()}) -> vLLM ids {a.ids}")]
    if a.decided_by == "equivalent":
        m = a.measurement
        return [finding("warning", "aux_ids_equivalent",
                        f"aux layer ids {a.stored}: both readings ({both}) serve the same here"
                        + (f" ({m.summary()}, within +-{m.equivalence_bound:g})" if m is not None else "")
                        + "; the stored ids are kept as they are. On another target the readings may differ: "
                          "pass --aux-ids-convention there if you know it")]
    if a.decided_by == "producer":
        m = a.measurement
        return [finding("warning", "aux_ids_equivalent",
                        f"aux layer ids {a.stored}: both readings ({both}) serve the same on this target"
                        + (f" ({m.summary()}, within +-{m.equivalence_bound:g})" if m is not None else "")
                        + f"; written in the convention {producer} trains with ({a.convention}: {a.producer_reason}) -> "
                          f"vLLM ids {a.ids}, taken from the producer, not measured. Pass --aux-ids-convention if you know "
                          "these ids were written otherwise")]
    sev = "warning" if a.convention == "output-of-layer" and a.decided_by != "override" else "info"
    return [finding(sev, "aux_ids_convention",
                    f"aux layer ids {a.stored} are {a.convention} ({a.decided_by}: {a.reason}) -> vLLM ids {a.ids}"
                    + ("; written as is, vLLM would read them one layer off" if a.convention == "output-of-layer" else ""))]


def resolve(a: AuxIds, num_aux: int, num_target_layers: int, *, override: Convention | None = None,
            measure_fn: Any = None) -> AuxIds:
    """Decide with a target: ``override`` first, then an earlier decision, then the readings that are valid on an
    L-layer target (one left: unambiguous), then ``measure_fn(candidates) -> Measurement`` (a clear winner decides;
    otherwise undecided). Never guesses."""
    if override is not None:
        if a.stored is None:
            return a.model_copy(update={"reason": a.reason + f" (--aux-ids-convention {override} has nothing to apply to)"})
        return a.decide(override, "override", f"--aux-ids-convention {override}")
    if a.decided:
        return a
    valid = [c for c in a.candidates if pairing_error(c.ids, num_aux, num_target_layers) is None]
    if len(valid) == 1:
        bad = next(c for c in a.candidates if c is not valid[0])
        return a.decide(valid[0].convention, "unambiguous",
                        f"the {bad.convention} reading {bad.ids} is impossible on {a_an(num_target_layers)}-layer target "
                        f"({pairing_error(bad.ids, num_aux, num_target_layers)})")
    if not valid or measure_fn is None:
        return a
    m: Measurement = measure_fn([c.ids for c in a.candidates])
    cands = [c.model_copy(update={"statistic": m.mean.get(c.convention), "agreement": m.agreement.get(c.convention)})
             for c in a.candidates]
    a = a.model_copy(update={"candidates": cands, "measurement": m})
    if m.winner is not None:
        return a.decide(m.winner, "measurement", m.rule)  # type: ignore[arg-type]
    if m.verdict == "equivalent":
        if a.producer_convention is not None:
            return a.decide(a.producer_convention, "producer",
                            f"both readings serve the same on this target ({m.rule}); the producer's training convention "
                            f"is written ({a.producer_reason}), taken from the producer, not measured")
        return a.decide("vllm", "equivalent", "both readings serve the same on this target (" + m.rule + "): the stored "
                        "ids are kept as they are, read literally as vLLM reads them")
    if m.verdict == "no-evidence":
        return a.model_copy(update={"reason": f"measurement is no evidence ({m.no_evidence}): {m.rule}"})
    return a.model_copy(update={"reason": f"measurement inconclusive: {m.rule}"})


# what a measurement in which the drafter drafts under no reading most likely means (convert's refusal, inspect's warning)
NO_EVIDENCE_CAUSES = ("Likely causes: the draft-vocabulary mapping (d2t / t2d, draft_vocab_size), a target that is not "
                      "the one the drafter was trained for, or flags the producer's layout implies (norm_before_residual, "
                      "norm_output, fc_norm)")
NO_EVIDENCE_HINT = ("check that --target is the drafter's own target (inspect CKPT --target T shows what was measured); "
                    "if you know the convention the ids were written in, --aux-ids-convention vllm|output-of-layer")


def _reading_names(a: AuxIds) -> dict[str, str]:
    return {c.convention: f"{c.convention} reading (vLLM ids {c.ids})" for c in a.candidates}


def undecided_message(a: AuxIds, num_target_layers: int, num_aux: int = 3) -> str:
    if a.no_evidence:
        m = a.measurement
        return (f"the drafter predicts none of the target's tokens under either reading of its aux layer ids {a.stored} "
                f"({m.no_evidence}), so the measurement decides nothing. Tried: {m.tried(_reading_names(a))}. "
                f"{NO_EVIDENCE_CAUSES}")
    v, o = a.candidate("vllm"), a.candidate("output-of-layer")
    if a.measurement is None and v is not None and o is not None:
        ev, eo = pairing_error(v.ids, num_aux, num_target_layers), pairing_error(o.ids, num_aux, num_target_layers)
        if ev and eo:
            return f"aux layer ids {a.stored} fit neither reading on this {num_target_layers}-layer target: as vLLM ids, {ev}; as output-of-layer ids, {eo}"
    msg = (f"aux layer ids {a.stored} can be read two ways: vLLM ids {v.ids} (vLLM's convention) or {o.ids} "
           f"(output-of-layer, SpecForge/ModelOpt training) on this {num_target_layers}-layer target")
    if a.measurement is not None:
        m = a.measurement
        msg += f", and measuring neither told them apart nor showed them equivalent ({m.summary()}; {m.rule})"
    return msg


UNDECIDED_HINT = "pass --aux-ids-convention vllm|output-of-layer (the convention the drafter was trained with)"


# ----- recording the decision -----------------------------------------------------------------------------------
def apply(ck: Checkpoint, a: AuxIds) -> None:
    """Record the decision on ``ck``: ``ck.aux`` and, when decided, ``ck.config.aux_layer_ids``."""
    ck.aux = a
    if a.decided and a.ids is not None and len(a.ids) == ck.config.num_aux:
        ck.config = ck.config.model_copy(update={"aux_layer_ids": a.ids})
