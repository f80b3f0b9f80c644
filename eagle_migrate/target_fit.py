"""Whether a drafter fits the target it is served with (issue 50): a drafter trained for target A, served with B (a
fine-tune, an RL run, a quantized or abliterated A), drafts what A would write. Two kinds of evidence:

* the config: the target the drafter's producer recorded (:func:`trained_for`: speculators'
  ``speculators_config.verifier.name_or_path``, a SpecForge / SafeAILab / ModelOpt config's target or base-model
  key, this project's ``provenance.json``) against the served target's name (:func:`eagle_migrate.fingerprints.
  target_name`). A fine-tune saved with ``save_pretrained`` keeps A's ``_name_or_path``, so equal names prove
  nothing: the config can only say "another model";
* a measurement on B's own text: the drafter's step-0 top-1 agreement with B's greedy next token where vLLM drafts
  (prompts from the data, each continued greedily by B: :mod:`eagle_migrate.own_text`), from at most
  :data:`MAX_SEQUENCES` sequences (0.5-3.5 s on the toy; on SmolLM2-135M the whole ``inspect --target`` took 26-30 s
  of CPU, 69-157 s wall on a loaded 2-core box: docs/calibration.md "Retargeting"). With the target the
  drafter was trained for (``trained_for``: a local path), the same measurement on A's own text is the reference,
  and B's agreement below it beyond noise says the drafter is stale; without it, B's agreement is compared with
  :data:`THRESHOLD` (what drafters agree with their own target, measured here), which says less, and the message
  says which was measured.

With the reference there is a second measurement on the same text, which does not mix in how predictable each
text is (:func:`follows`): at the drafted positions of B's own text where A's greedy next token differs from B's,
which of the two the drafter's step 0 proposes. A drafter that proposes A's token more often than B's there, beyond
noise, drafts what A would write: stale, although its agreement on B's (more predictable) text may not have fallen.
Measured on SmolLM2 (docs/benchmarks.md "Which target does the drafter follow", ``benchmarks/retarget/
fit_probe.py``): a chat fine-tune that costs the source 4 % served AL agrees with it as well as A does (0.44 against
0.44), while the source proposes A's token at 0.55 +- 0.015 of the 977 such positions where it proposes either (160
sequences); a drafter trained for B at 0.27, and each recalibration lowers the share about as much as it recovers
of the served AL.

The verdict (:class:`TargetFit`): ``stale`` (recalibration recommended: convert fine-tunes by default),
``undecided`` (with the reference: the two targets write other tokens at enough drafted positions, and which one
the drafter follows is within noise of even; convert fine-tunes by default too, judged), ``fits``, ``no-evidence`` (the drafter drafts almost nothing on B: random weights or a wrong pairing, which a
recalibration does not fix) or ``not measured`` (no target weights, a quantized drafter: the config's evidence
alone, which decides nothing).

Layer: beside ``aux_evidence`` (runs a drafter's step 0 on a target): imports pydantic, torch, aux_evidence (Step0,
the target's states), fingerprints (target_name), loader (load_drafter), own_text (the measured sequences, the drafted
positions), target (LazyTarget: the reference target), engines.metrics (ratio_se: the clustered SE).
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import BaseModel, Field

from .aux_evidence import Step0, batched_states, target_states
from .engines.metrics import ratio_se
from .fingerprints import target_name
from .loader import load_drafter
from .own_text import drafted_positions, measurement_sequences
from .target import LazyTarget

if TYPE_CHECKING:  # pragma: no cover
    from .formats.base import Checkpoint

# the measured sequences (each a data prompt and the target's own greedy continuation of 40 tokens: own_text.py)
MAX_SEQUENCES = 16
# below this step-0 agreement on the served target the drafter drafts almost nothing there: random weights, a wrong
# pairing, or a target changed beyond what a recalibration of the norms and fc can follow (a random toy drafter agrees
# 1 / 64; a real one trained for SmolLM2-135M agrees 0.545 on its own target's text, 0.18 with a wrong flag:
# docs/benchmarks.md, aux-id evidence)
FLOOR = 0.05
# without the reference target, an agreement below this on the served target's own text says the drafter does not
# fit it: about 3 standard errors below what the SmolLM2-135M drafters trained for their target agree with it on its
# own text (0.437 +/- 0.040 and 0.423 +/- 0.037, 16 sequences of built-in chat prompts; the toy's exact drafters 1.0;
# docs/calibration.md "Retargeting"). A weaker drafter on its own target can fall below it: pass the reference
THRESHOLD = 0.30
# with the reference: B's agreement below A's by more than 3 standard errors of the difference and this much
REFERENCE_MARGIN = 0.03
# the follows measurement (with the reference): B's own sequences it reads at most (the first MAX_SEQUENCES are the
# agreement's, replayed; the rest are made as those were), the positions it needs before it says anything, and how
# far from even the share must be: 3 standard errors (each sequence a cluster). 256: on SmolLM2's chat-format
# fine-tune the source's share is 0.552 +- 0.015 at 160 sequences (3.6 SE); 256 puts an effect of that size about 4
# SE from even. It stops early once decided, or when the two targets' greedy tokens have not differed once (the same
# model in another folder), looking after 64 sequences and every 32 after that: an even share crosses 3 SE at one of
# those 7 looks about 1 % of the time (0.5 % towards "stale"; benchmarks/retarget/fit_probe.py --simulate-looks),
# against 0.27 % at one look; a false "stale" costs a fine-tune, which the judge still returns only when it beats the
# conversion. Each sequence is a generation and two target forwards, its prompt from the data (own_text's ``want``):
# for SmolLM2-135M on the quiet 2-core box convert's format B decided at 128 sequences, the whole fit measurement in
# 98-122 s (with perturbed prompts after the first 64 it read 192 in 242 s; docs/benchmarks.md "The fixed part of
# convert")
FOLLOW_SEQUENCES = 256
FOLLOW_FIRST_LOOK = 64
FOLLOW_LOOK_EVERY = 32
FOLLOW_MIN_POSITIONS = 100
# the sequences each target runs in one forward (a divisor of the looks above), and those B continues in one
# generate call (the agreement's first 16 are replayed; a decode step costs little more for 32 than for 16)
FOLLOW_BATCH = 16
FOLLOW_GENERATE_BATCH = 32
# where a producer records the target it trained for (dotted paths in config.json)
CONFIG_KEYS = ("speculators_config.verifier.name_or_path", "verifier.name_or_path", "target_model",
               "target_model_path", "target_model_name_or_path", "base_model", "base_model_name_or_path",
               "eagle_config.target_model", "eagle_migrate.target")
PROVENANCE_KEYS = ("target_hub_id", "target_name")

Verdict = Literal["fits", "stale", "undecided", "no-evidence", "not measured"]
Until = Literal["verdict", "action"]  # follows: read until the verdict is decided, or until convert's action is


class Agreement(BaseModel):
    """Step-0 top-1 agreement of the drafter with one target's greedy next token on that target's own text."""

    target: str
    agreement: float
    standard_error: float = Field(..., description="clustered by sequence")
    positions: int
    sequences: int
    seconds: float

    def text(self) -> str:
        return f"{self.agreement:.2f} +/- {self.standard_error:.2f} ({self.positions} positions, {self.sequences} sequences)"


class Follows(BaseModel):
    """On the served target's own text, where its greedy next token and the reference's differ and the drafter's step
    0 proposes one of the two: the share of those positions at which it proposes the reference's."""

    positions: int = Field(..., description="of ``differ``, those where step 0 proposes one of the two tokens")
    differ: int = Field(..., description="drafted positions where the two targets' greedy next tokens differ")
    drafted: int = Field(..., description="drafted positions measured")
    prefers_trained_for: int = Field(..., description="of ``positions``, those where it proposes the reference's")
    share: float
    standard_error: float = Field(..., description="clustered by sequence")
    sequences: int
    seconds: float
    stopped: str = Field("", description="why it stopped before reading all it could: decided, same text, action "
                         "(convert: at or above even, where more sequences cannot change what convert does)")

    @property
    def decided(self) -> bool:
        """Whether the share is away from even by 3 standard errors, on enough positions."""
        return self.positions >= FOLLOW_MIN_POSITIONS and abs(self.share - 0.5) > 3 * self.standard_error

    def text(self) -> str:
        return (f"{self.share:.2f} +/- {self.standard_error:.2f} of the {self.positions} drafted positions where the "
                f"two targets' greedy tokens differ and it proposes one of them ({self.differ} differ of "
                f"{self.drafted}, {self.sequences} sequences)")


class TargetFit(BaseModel):
    """Whether the drafter fits the served target (module docstring)."""

    trained_for: str | None = Field(None, description="the target the drafter's config names, as recorded")
    trained_for_key: str | None = Field(None, description="where it is recorded (config key or provenance.json)")
    served_with: str | None = Field(None, description="the served target's name (Hub id, else its folder's name)")
    config: Literal["same", "other", "unknown"] = "unknown"
    on_target: Agreement | None = Field(None, description="step-0 agreement on the served target's own text")
    on_trained_for: Agreement | None = Field(None, description="the same on the target it was trained for (given)")
    follows: Follows | None = Field(None, description="with the reference: where the two targets differ on the served "
                                    "target's text, how often step 0 proposes the reference's token")
    threshold: float = THRESHOLD
    verdict: Verdict = "not measured"
    message: str = ""

    @property
    def stale(self) -> bool:
        return self.verdict == "stale"

    @property
    def recalibrate(self) -> bool:
        """Whether convert recalibrates by default: stale, or trained for another model that the measurement cannot
        tell it fits (``undecided``; the judge keeps the fine-tune only when it beats the source beyond noise)."""
        return self.verdict in ("stale", "undecided")


def _dig(d: Any, dotted: str) -> Any:
    for k in dotted.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def trained_for(ck: Checkpoint) -> tuple[str | None, str | None]:
    """(the target the drafter's producer recorded, where): speculators' verifier, a config key of
    :data:`CONFIG_KEYS`, else this project's provenance.json beside the weights; (None, None) when none says."""
    v = ck.meta.get("verifier")
    if isinstance(v, dict) and isinstance(v.get("name_or_path"), str) and v["name_or_path"].strip():
        return v["name_or_path"], "speculators_config.verifier.name_or_path"
    raw = ck.raw_config or {}
    for key in CONFIG_KEYS:
        got = _dig(raw, key)
        if isinstance(got, str) and got.strip():
            return got, key
    prov = Path(ck.path) / "provenance.json"
    if prov.is_file():
        try:
            p = json.loads(prov.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            p = {}
        for key in PROVENANCE_KEYS:
            if isinstance(p.get(key), str) and p[key].strip():
                return p[key], f"provenance.json {key}"
    return None, None


def _short(name: str) -> str:
    return name.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1].lower()


def same_model(recorded: str, served: str | None, served_spec: str) -> bool:
    """Whether the recorded target names the served one: the same Hub id, path, or final name component."""
    cands = {_short(x) for x in (served, served_spec) if x}
    return recorded == served or recorded == served_spec or _short(recorded) in cands


def step0_agreement(ck: Checkpoint, target: LazyTarget, ids: list[int], *, seed: int = 0, data: Any = None,
                    sequences: list[list[int]] | None = None, max_length: int = 512,
                    max_sequences: int = MAX_SEQUENCES, progress: Callable[[int, int], None] | None = None,
                    step: Step0 | None = None, want: int | None = None) -> Agreement:
    """The drafter's step-0 top-1 agreement with ``target``'s greedy next token where vLLM drafts, on at most
    ``max_sequences`` of the target's own sequences (:func:`eagle_migrate.own_text.measurement_sequences`: the same
    ones the aux-id measurement made, replayed), aux states at ``ids`` (vLLM ids); ``step``: the drafter's step 0 on
    ``target`` when the caller has it (:func:`_step0`); ``want``: the sequences a later measurement on the same text
    reads (:func:`follows`), made with these where that is cheaper (in vLLM: own_text.in_vllm)."""
    t0 = time.perf_counter()
    step = step if step is not None else _step0(ck, target)
    hits: list[int] = []
    sizes: list[int] = []
    for h in measurement_sequences(target, data, seed, sequences, max_length, want=want or max_sequences):
        states, nxt = target_states(target, h.ids, ids)
        aux = torch.cat([states[i] for i in sorted(ids)], dim=-1)[: len(h.ids) - 1]
        _, hit, _ = step(aux, h.ids, nxt[1:], drafted_positions(h, nxt))
        if hit.numel():
            hits.append(int(hit.sum()))
            sizes.append(int(hit.numel()))
        if progress is not None:
            progress(len(sizes), max_sequences)
        if len(sizes) >= max_sequences:  # before the next one is asked for: it would generate a whole new batch
            break
    n, g = sum(sizes), len(sizes)
    p = sum(hits) / n if n else 0.0
    return Agreement(target=str(target.spec), agreement=p, standard_error=_clustered_se(hits, sizes), positions=n,
                     sequences=g,
                     seconds=round(time.perf_counter() - t0, 2))


def follows(ck: Checkpoint, target: LazyTarget, ref: LazyTarget, ids: list[int], *, seed: int = 0, data: Any = None,
            sequences: list[list[int]] | None = None, max_length: int = 512, max_sequences: int = FOLLOW_SEQUENCES,
            progress: Callable[[int, int], None] | None = None, step: Step0 | None = None,
            until: Until = "verdict") -> Follows:
    """On ``target``'s own sequences (those :func:`step0_agreement` measured, then more), at the drafted positions where
    ``ref``'s greedy next token differs from ``target``'s and the drafter's step 0 proposes one of the two (what vLLM
    drafts first): the share of them where it proposes ``ref``'s. ``step`` as in :func:`step0_agreement`; ``until``:
    when it stops (:func:`_stop`)."""
    t0 = time.perf_counter()
    step = step if step is not None else _step0(ck, target)
    pref: list[int] = []
    sizes: list[int] = []
    drafted = differ = 0
    why = ""  # why it stopped early (_stop)
    seqs = measurement_sequences(target, data, seed, sequences, max_length, batch=FOLLOW_GENERATE_BATCH,
                                 want=max_sequences)
    while len(sizes) < max_sequences:
        # FOLLOW_BATCH sequences at a time: the two targets each run them in one forward; the looks fall between groups
        group = list(itertools.islice(seqs, min(FOLLOW_BATCH, max_sequences - len(sizes))))
        if not group:
            break
        ids_ = [h.ids for h in group]
        for h, (states, nb), (_, na) in zip(group, batched_states(target, ids_, ids), batched_states(ref, ids_, ids)):
            aux = torch.cat([states[i] for i in sorted(ids)], dim=-1)[: len(h.ids) - 1]
            top = step.top1(aux, h.ids)  # [T-1]
            d = drafted_positions(h, nb)[: len(top)]
            wb, wa = nb[1:][: len(top)], na[1:][: len(top)]
            diff = d & (wa != wb)
            drafted += int(d.sum())
            differ += int(diff.sum())
            pref.append(int((top == wa)[diff].sum()))
            sizes.append(pref[-1] + int((top == wb)[diff].sum()))
        if progress is not None:
            progress(len(sizes), max_sequences)
        g = len(sizes)
        looks = g >= FOLLOW_FIRST_LOOK and (g - FOLLOW_FIRST_LOOK) % FOLLOW_LOOK_EVERY == 0
        if looks and (why := _stop(_follows(pref, sizes), differ, until)):
            break
    fo = _follows(pref, sizes)
    return fo.model_copy(update={"differ": differ, "drafted": drafted, "seconds": round(time.perf_counter() - t0, 2),
                                 "stopped": why})


def _stop(fo: Follows, differ: int, until: Until) -> str:
    """Why the follows measurement stops at a look ("" to go on): ``decided`` (3 SE from even), ``same text`` (the two
    targets' greedy tokens have not differed once: the same model in another folder), and with ``until="action"``
    (convert) ``action``: the share at or above even on enough positions, where the verdict is ``stale`` or
    ``undecided`` whatever more sequences would say (only ``fits``, a share below even beyond noise, changes what
    convert does, and that is out of reach from there): convert's fine-tune gets the time instead (on a coding
    assistant's prompts the measurement read 256 sequences in 352 s of convert's 15 minutes)."""
    if fo.decided:
        return "decided"
    if differ == 0:
        return "same text"
    if until == "action" and fo.positions >= FOLLOW_MIN_POSITIONS and fo.share >= 0.5:
        return "action"
    return ""


def _follows(pref: list[int], sizes: list[int]) -> Follows:
    """The share of proposals of the reference's token over the sequences so far, its SE clustered by sequence."""
    n, g = sum(sizes), len(sizes)
    return Follows(positions=n, differ=0, drafted=0, prefers_trained_for=sum(pref), share=sum(pref) / n if n else 0.5,
                   standard_error=_clustered_se(pref, sizes), sequences=g, seconds=0.0)


def _step0(ck: Checkpoint, target: LazyTarget) -> Step0:
    """The drafter loaded against ``target`` (its embeddings / lm_head where the drafter shares them) and its step 0."""
    m = load_drafter(ck, target.loaded, device=target.device, dtype=target.dtype)
    return Step0(m, target.info.vocab_size, target.device, target.dtype)


def _clustered_se(counts: list[int], sizes: list[int]) -> float:
    """The SE of sum(counts) / sum(sizes) with each sequence a cluster (:func:`~eagle_migrate.engines.metrics.ratio_se`);
    1.0 (nothing known) with fewer than two sequences or no positions."""
    se = ratio_se([float(c) for c in counts], [float(k) for k in sizes])
    return 1.0 if se is None else se


def assess(ck: Checkpoint, target: LazyTarget | None, ids: list[int] | None, *, trained_for_path: str | None = None,
           seed: int = 0, data: Any = None, sequences: list[list[int]] | None = None, max_length: int = 512,
           measure: bool = True, progress: Callable[[str, int, int], None] | None = None,
           until: Until = "verdict") -> TargetFit:
    """The fit of the drafter ``ck`` to ``target`` (module docstring). ``ids``: the decided aux ids (vLLM's
    convention); ``trained_for_path``: the target it was trained for, measured the same way as the reference;
    ``measure`` False (or no target, no ids): the config's evidence alone. ``progress(which, done, total)``: after
    each measured sequence (``which``: ``target``, ``trained-for`` or ``follows``); ``until``: ``action`` (convert)
    stops the follows measurement once what convert does is known (:func:`_stop`), ``verdict`` (inspect) reads on
    until the verdict is decided."""
    rec, key = trained_for(ck)
    spec = str(target.spec) if target is not None else ""
    tn = target_name(spec) if spec else None
    served = tn.name if tn else None
    config = "unknown" if rec is None or not spec else "same" if same_model(rec, served, spec) else "other"
    fit = TargetFit(trained_for=rec, trained_for_key=key, served_with=served, config=config)
    found = trained_for_path is None and config == "other" and _local_model(rec) and not _same_folder(rec, spec)
    if found:  # the target its config names is here: measured as the reference, as --trained-for would
        trained_for_path = rec
    if measure and target is not None and ids and not ck.quantization and ck.config.generation == "eagle3":
        step = _step0(ck, target)  # once: the agreement and the follows measurement run it on the same target
        fit.on_target = step0_agreement(ck, target, ids, seed=seed, data=data, sequences=sequences, max_length=max_length,
                                        progress=(lambda d, t: progress("target", d, t)) if progress else None,
                                        step=step, want=FOLLOW_SEQUENCES if trained_for_path else None)
        if trained_for_path:
            ref = LazyTarget(trained_for_path, target.device, target.dtype)
            fit.on_trained_for = step0_agreement(ck, ref, ids, seed=seed, data=data, sequences=sequences,
                                                 max_length=max_length,
                                                 progress=(lambda d, t: progress("trained-for", d, t)) if progress else None)
            fit.follows = follows(ck, target, ref, ids, seed=seed, data=data, sequences=sequences,
                                  max_length=max_length,
                                  progress=(lambda d, t: progress("follows", d, t)) if progress else None, step=step,
                                  until=until)
    fit.verdict = _verdict(fit)
    fit.message = _message(fit, trained_for_path, found)
    return fit


def _local_model(path: str | None) -> bool:
    """Whether ``path`` is a model folder on this machine (its config.json there)."""
    return bool(path) and (Path(path).expanduser() / "config.json").is_file()


def _same_folder(a: str, b: str) -> bool:
    try:
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    except OSError:
        return False


def _verdict(f: TargetFit) -> Verdict:
    b, a = f.on_target, f.on_trained_for
    if b is None or b.positions == 0:
        return "not measured"
    if a is not None:
        if a.agreement < FLOOR or a.positions == 0:
            return "no-evidence"
        se = math.hypot(a.standard_error, b.standard_error)
        if a.agreement - b.agreement > max(3 * se, REFERENCE_MARGIN):
            return "stale"
        fo = f.follows
        if fo is not None and fo.decided:
            return "stale" if fo.share > 0.5 else "fits"
        # the two targets write other tokens often enough to measure, and the share is within noise of even: the
        # measurement cannot tell, which is not evidence that it fits. Measured (docs/benchmarks.md "Your traffic on
        # the changed target"): on a coding assistant's prompts the SmolLM2 source's share on the format B was 0.518
        # +- 0.016 at 256 sequences, while a recalibration for B served +12.6 % +- 1.2 % on those prompts (and the
        # same fine-tune on its own target found nothing to gain)
        return "undecided" if fo is not None and fo.positions >= FOLLOW_MIN_POSITIONS else "fits"
    if b.agreement < FLOOR:
        return "no-evidence"
    # without the reference, the config naming another model is said, not acted on: the same model in another folder
    # (or under another name) must not be fine-tuned by default; the agreement on the target's own text decides
    return "stale" if b.agreement < f.threshold else "fits"


def _message(f: TargetFit, trained_for_path: str | None, found: bool = False) -> str:
    """One sentence: what the config says, what was measured, and the verdict."""
    served = f.served_with or "the served target"
    if f.config == "other":
        head = f"trained for {f.trained_for} (its {f.trained_for_key}), served with {served}"
    elif f.config == "same":
        head = (f"its config names {f.trained_for}, the served target's name (a fine-tune saved from it keeps that "
                "name, so the config alone cannot tell)")
    else:
        head = "its config names no target it was trained for"
    b, a = f.on_target, f.on_trained_for
    if b is None:
        return head + "; not measured on the target's text (no verdict from the config alone)"
    meas = f"step-0 agreement {b.agreement:.2f} on {served}'s own text"
    if a is not None:
        where = "named by its config, found here" if found else "--trained-for"
        ref = f"{meas} against {a.agreement:.2f} on its own target's ({trained_for_path}: {where})"
        fo = f.follows
        if fo is not None and fo.positions:
            said = ("it drafts what its own target would write" if fo.decided and fo.share > 0.5 else
                    "it drafts the served target's tokens" if fo.decided else
                    f"too few such positions to tell (under {FOLLOW_MIN_POSITIONS})"
                    if fo.positions < FOLLOW_MIN_POSITIONS else "within noise of even: cannot tell"
                    + (" (convert stopped reading there: at or above even, more sequences would not change what it "
                       "does)" if fo.stopped == "action" else ""))
            ref += f"; it proposes its own target's token at {fo.text()}: {said}"
    else:
        ref = (f"{meas} (its own target not measured: pass --trained-for PATH; threshold {f.threshold:.2f}, what "
               "drafters agree with their own target here)")
    tail = {"stale": "recalibration recommended",
            "fits": "it fits: no recalibration needed",
            "undecided": ("the measurement cannot tell whether it still fits a model it was not trained for: "
                          "recalibrating by default is judged (kept only when it beats the source beyond noise; "
                          "--no-calibrate skips it)"),
            "no-evidence": (f"it drafts almost nothing there (below {FLOOR:.2f}): random weights, a wrong pairing, or a "
                            "target changed beyond what recalibration follows; no verdict"),
            "not measured": "no verdict"}[f.verdict]
    return f"{head}: {ref}; {tail}"
