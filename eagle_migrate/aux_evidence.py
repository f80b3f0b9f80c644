"""The evidence that decides what a checkpoint does not say: which convention its aux-layer ids were written in, and
(when the config does not state it) ``norm_before_residual`` -- by running the drafter's step 0 on the target
(docs/formats.md section 4, "The measurement").

Two readings (the two conventions; the flag's two values) are compared on the *same* positions, and only where vLLM
drafts: after text the target itself wrote. Each measured sequence is a prompt (from the data) followed by the target's
own greedy continuation (:class:`~eagle_migrate.judge.HeldoutSequence`), and step 0 is scored at the continuation's
positions alone, where the token it is fed is the target's own greedy token, as in serving; never at the prompt's
positions (a drafter whose first draft comes from the aux states is right on the target's text and can be confidently
wrong on anybody else's: scored there, it looked dead under every reading). At each scored position i, the
log-likelihood of the target's own next token under the drafter's step-0 distribution (draft logits through
``d2t``), ``d_i = log p_first(t_i) - log p_second(t_i)``. The whole distribution
enters, not only its top-1, so a weak drafter on a target with similar adjacent layers still separates them.
Positions within a sequence are not independent: the standard error is clustered by sequence. Sampling is
sequential: sequences are added until, at one of the fixed looks (:data:`LOOKS`), the readings are shown equivalent
(``|d| + t * SE <= EQUIVALENCE_NATS``, checked first: a difference too small to matter decides nothing however
sure it is), or one reading wins by more than t standard errors (:func:`critical`: Student's t with sequences - 1
degrees of freedom), or the budget is spent (inconclusive).

A measurement decides only where the drafter drafts (:func:`drafts`): under some reading its top-1 agreement with the
target's next token is above :data:`MIN_AGREEMENT`, its mean beats a uniform guess over the draft vocabulary
(``-ln Vd``), and most of its positions are off the floor. Where no reading drafts, or the winner does not, or the
standard error is zero while the difference is not, the verdict is ``no-evidence``: the numbers then say nothing
about the readings (a dead drafter is equally wrong under both, and a saturated one differs by the same amount at
every position), and the caller must not decide from them. The target generates the continuations in batches with
its KV cache, then runs once per sequence for both readings; the states it captured are kept on the
:class:`~eagle_migrate.target.LazyTarget`, so the ``norm_before_residual`` measurement on the same sequences does not
run it again.

Layer: beside ``judge`` (may run a drafter on a target): imports aux_ids, corpora, drafter, judge (the held-out
sequence and its greedy continuations), target. ``aux_ids``
keeps vLLM's rule, the fingerprints and the convention type, and imports none of these.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from .formats.aux_ids import CONVENTIONS, AuxIds, Convention, Measurement, from_stored, resolve
from .judge import HeldoutSequence
from .loader import load_drafter
from .own_text import (  # noqa: F401  (re-exported: the measured sequences are the measurement's)
    CONTINUATION_TOKENS,
    MIN_CONTINUATION,
    PROMPT_TOKENS,
    drafted_positions,
    measurement_sequences,
)

if TYPE_CHECKING:  # pragma: no cover
    from .formats.base import Checkpoint
    from .target import LazyTarget

# A wrong winner's chance per look (one-sided): the normal tail beyond 3 sigma. The threshold is Student's t with
# (sequences - 1) degrees of freedom at this level (:func:`critical`), not a fixed 3: the standard error is clustered
# by sequence, so after 8 sequences it rests on 7 degrees of freedom and 3 SE would be crossed ~1 % of the time.
ALPHA_PER_LOOK = 0.00135
# Equivalence bound (nats per position). exp(difference) is the ratio of the two readings' geometric-mean
# probabilities of the target's token, so |d| <= 0.01 bounds that ratio within 1 %: half the 2 % the project
# accepts as "the same AL" (quantize's gate, docs/quantize.md). Measured adjacent-layer readings of a real drafter
# differ by far more (docs/benchmarks.md, aux-id evidence); identical states give d = 0 exactly.
EQUIVALENCE_NATS = 0.01
# Sequential looks (after this many sequences); at most 7 looks at ALPHA_PER_LOOK each keep the chance of a wrong
# winner under 7 x 0.00135 = 1 % (Bonferroni, one-sided) when the readings are truly equal.
LOOKS = (8, 12, 16, 24, 32, 48, 64)
BUDGET_SEQUENCES = LOOKS[-1]
BUDGET_POSITIONS = 16384
# the measured sequences: a data prompt and the target's own greedy continuation (own_text.py); the statistics pass's
# sequences are cut to MAX_LENGTH
MAX_LENGTH = 512
LOGP_FLOOR = -50.0  # a draft probability that underflows counts as e^-50, never -inf
# A reading drafts (:func:`drafts`) when its top-1 agreement with the target's next token is at least MIN_AGREEMENT
# over at least MIN_HITS hits, its mean beats a uniform guess over the draft vocabulary by UNIFORM_MARGIN nats, and
# under MAX_CLAMPED of its positions sit at the floor. The weakest real drafter measured here (SmolLM2, docs/
# benchmarks.md) agrees 0.35 and scores about 5 nats above -ln(8192); a drafter vLLM accepts nothing from agrees 0.
MIN_AGREEMENT = 0.02
MIN_HITS = 5
UNIFORM_MARGIN = 0.1
MAX_CLAMPED = 0.5
# "no reading drafts" is said at a look only once this many positions are in (else at the budget's end)
DEAD_AFTER_POSITIONS = 256


@functools.lru_cache(maxsize=None)
def critical(df: int, alpha: float = ALPHA_PER_LOOK) -> float:
    """Student's t quantile: P(T_df > x) = alpha (bisection on the tail, Simpson's rule on the density; 3.0075 at
    1,000 df, 4.530 at 7). No SciPy dependency for one number per look."""

    def tail(x: float) -> float:
        n = 2 * max(1000, int(50 * x))
        c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
        h = x / n
        f = [math.exp(c - (df + 1) / 2 * math.log1p((i * h) ** 2 / df)) for i in range(n + 1)]
        return 0.5 - h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))

    hi = 4.0
    while tail(hi) > alpha:
        hi *= 2
    lo = hi / 2 if hi > 4.0 else 0.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tail(mid) > alpha else (lo, mid)
    return hi


# ----- the statistic -------------------------------------------------------------------------------------------------
def drafts(hits: int, positions: int, mean: float, clamped: float, uniform: float | None) -> str | None:
    """None when a reading with these numbers drafts, else why it does not (module docstring)."""
    if positions == 0:
        return "no positions"
    if hits < MIN_HITS or hits / positions < MIN_AGREEMENT:
        return f"top-1 agreement {hits / positions:.3f} ({hits} of {positions})"
    if uniform is not None and mean <= uniform + UNIFORM_MARGIN:
        return f"mean {mean:.3f} nats, no better than a uniform guess ({uniform:.3f})"
    if clamped >= MAX_CLAMPED:
        return f"{clamped:.0%} of positions at the floor ({LOGP_FLOOR:g} nats)"
    return None


class Paired:
    """Per-sequence sums of the paired difference and of each reading's statistic, top-1 hits and floor hits.
    ``uniform``: the statistic of a uniform guess over the draft vocabulary (-ln Vd)."""

    def __init__(self, readings: list[str], uniform: float | None = None):
        self.readings = readings
        self.uniform = uniform
        self.d_sums: list[float] = []
        self.sizes: list[int] = []
        self.sums = {r: 0.0 for r in readings}
        self.hits = {r: 0 for r in readings}
        self.floor = {r: 0 for r in readings}
        self.excluded = 0

    def add(self, logp: dict[str, torch.Tensor], hit: dict[str, torch.Tensor], excluded: int = 0) -> None:
        a, b = self.readings
        n = int(logp[a].numel())
        self.excluded += excluded
        if n == 0:
            return
        self.d_sums.append(float((logp[a].double() - logp[b].double()).sum()))
        self.sizes.append(n)
        for r in self.readings:
            self.sums[r] += float(logp[r].double().sum())
            self.hits[r] += int(hit[r].sum())
            self.floor[r] += int((logp[r] <= LOGP_FLOOR).sum())

    @property
    def positions(self) -> int:
        return sum(self.sizes)

    def difference(self) -> tuple[float, float]:
        """(mean paired difference, its standard error clustered by sequence: G/(G-1) sum_g (S_g - d n_g)^2 / N^2)."""
        n, g = self.positions, len(self.sizes)
        if n == 0:
            return 0.0, math.inf
        d = sum(self.d_sums) / n
        if g < 2:
            return d, math.inf
        var = g / (g - 1) * sum((s - d * k) ** 2 for s, k in zip(self.d_sums, self.sizes)) / n**2
        return d, math.sqrt(var)

    def why_not(self, r: str) -> str | None:
        """None when the drafter drafts under reading ``r``, else why not (:func:`drafts`)."""
        n = self.positions
        return drafts(self.hits[r], n, self.sums[r] / n if n else float("nan"), self.floor[r] / n if n else 0.0,
                      self.uniform)

    def no_evidence(self, final: bool = False) -> str:
        """Why these numbers are no evidence ('' when they are); ``final``: the last look, when a dead drafter is
        said whatever the number of positions."""
        d, se = self.difference()
        dead = {r: self.why_not(r) for r in self.readings}
        if all(dead.values()) and (final or self.positions >= DEAD_AFTER_POSITIONS):
            return "the drafter drafts under no reading: " + "; ".join(f"{r}: {w}" for r, w in dead.items())
        if math.isfinite(se) and len(self.sizes) >= 2 and se <= 1e-9 * max(1.0, abs(d)) and abs(d) > EQUIVALENCE_NATS:
            win, lose = (self.readings[0], self.readings[1]) if d > 0 else (self.readings[1], self.readings[0])
            if self.why_not(win) is None and self.why_not(lose) is not None:
                return ""  # one reading drafts and the other does not: evidence whatever the SE (an exact toy drafter)
            return (f"a zero standard error with a difference of {d:+.4f} nats: every sequence differs by the same "
                    "amount, which a working drafter does not do (saturated or degenerate outputs)")
        return ""

    def verdict(self, final: bool = False) -> str:
        d, se = self.difference()
        if not math.isfinite(se):
            return "no-evidence" if final and self.no_evidence(final) else "inconclusive"
        if self.no_evidence(final):
            return "no-evidence"
        t = critical(len(self.sizes) - 1)
        if abs(d) + t * se <= EQUIVALENCE_NATS:  # first: a difference too small to matter decides nothing
            return "equivalent" if not all(self.why_not(r) for r in self.readings) else "no-evidence"
        if abs(d) > t * se:
            win = self.readings[0] if d > 0 else self.readings[1]
            if self.why_not(win):  # a winner the drafter does not draft under is no evidence
                return "no-evidence"
            return "first" if d > 0 else "second"
        return "inconclusive"

    def measurement(self, verdict: str, looks: int, seconds: float) -> Measurement:
        d, se = self.difference()
        n = self.positions
        a, b = self.readings
        g = len(self.sizes)
        t = f"{critical(g - 1):.2f}" if g >= 2 else "inf"
        rule = (f"a winner = the paired difference beyond t standard errors (clustered by sequence; t = Student's t at "
                f"one-sided {ALPHA_PER_LOOK:g} with sequences - 1 degrees of freedom); equivalent = |difference| + t SE "
                f"<= {EQUIVALENCE_NATS:g} nats; looks after {', '.join(map(str, LOOKS))} sequences, at most "
                f"{BUDGET_POSITIONS} positions; no evidence where the drafter drafts under no reading or not under the "
                f"winner. Measured {a} - {b} = {d:+.4f} +- {se:.4f} nats over {n} positions in {g} sequences (t = {t}): "
                + {"first": f"{a} wins", "second": f"{b} wins", "equivalent": "equivalent",
                   "inconclusive": "inconclusive", "no-evidence": "no evidence"}[verdict])
        why = ""
        if verdict == "no-evidence":
            why = self.no_evidence(final=True) or (
                f"the winner by {d:+.4f} nats is a reading the drafter does not draft under: "
                + (self.why_not(a if d > 0 else b) or ""))
        return Measurement(readings=[a, b], positions=n, sequences=len(self.sizes),
                           mean={r: self.sums[r] / n if n else float("nan") for r in self.readings},
                           agreement={r: self.hits[r] / n if n else float("nan") for r in self.readings},
                           difference=d, standard_error=se if math.isfinite(se) else 1e9, equivalence_bound=EQUIVALENCE_NATS,
                           verdict=verdict, looks=looks, excluded=self.excluded, uniform=self.uniform,
                           clamped={r: self.floor[r] / n if n else 0.0 for r in self.readings},
                           drafts={r: self.why_not(r) is None for r in self.readings}, no_evidence=why,
                           seconds=round(seconds, 2), rule=rule)


def sequential(readings: list[str], sequences: Iterable[list[int]],
               score: Callable[[list[int]], tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int] | None],
               *, budget_sequences: int = BUDGET_SEQUENCES, budget_positions: int = BUDGET_POSITIONS,
               progress: Callable[[int, int], None] | None = None, uniform: float | None = None) -> Measurement:
    """Score sequences one at a time (``score(seq) -> ({reading: logp [n]}, {reading: top-1 hit [n]}, excluded)``)
    and stop at the first look with a verdict, or at the budget (inconclusive, or no-evidence)."""
    t0 = time.perf_counter()
    acc = Paired(readings, uniform)
    looks, done = 0, 0
    for seq in sequences:
        if done >= budget_sequences or acc.positions >= budget_positions:
            break
        r = score(seq)
        if r is None:
            continue
        acc.add(*r)
        done += 1
        if progress:
            progress(done, budget_sequences)
        if done in LOOKS or acc.positions >= budget_positions:
            looks += 1
            v = acc.verdict()
            if v != "inconclusive":
                return acc.measurement(v, looks, time.perf_counter() - t0)
    if done not in LOOKS:  # the data ran out between looks: one last look
        looks += 1
    return acc.measurement(acc.verdict(final=True), looks, time.perf_counter() - t0)


class Step0:
    """The drafter's step 0 on the target's states: log-probability of the target's next token and top-1 hit."""

    def __init__(self, m: Any, target_vocab: int, device: Any, dtype: torch.dtype):
        self.m, self.device, self.dtype = m, device, dtype
        vd = m.cfg.draft_vocab_size
        d2t = m.to_target_ids(torch.arange(vd, device=device)).cpu()
        self.t2d = torch.full((target_vocab,), -1, dtype=torch.long)
        self.t2d[d2t] = torch.arange(vd)

    @torch.no_grad()
    def logits(self, aux: torch.Tensor, ids: list[int]) -> torch.Tensor:
        """Step 0's draft logits [T-1, Vd] at positions 0..T-2 (aux [T-1, K*Ht] there, tokens ids[1:])."""
        m = self.m
        t = len(ids)
        x = torch.tensor(ids[1:], device=self.device).unsqueeze(0)
        pos = torch.arange(t - 1, device=self.device).unsqueeze(0)
        o = m.forward_step(x, m.combine(aux.to(device=self.device, dtype=self.dtype)).unsqueeze(0), pos)
        return m.logits(o.h_post)[0].float()

    def top1(self, aux: torch.Tensor, ids: list[int]) -> torch.Tensor:
        """The target id step 0 drafts at positions 0..T-2 [T-1] (what vLLM proposes first there)."""
        return self.m.to_target_ids(self.logits(aux, ids).argmax(-1)).cpu()

    def __call__(self, aux: torch.Tensor, ids: list[int], want: torch.Tensor,
                 scored: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """aux [T-1, K*Ht] at positions 0..T-2, tokens ids[1:], ``want`` [T-1] the target's next tokens ->
        (logp [n], hit [n], kept mask [T-1]) over the positions ``scored`` (bool [T-1]; default: all) whose target
        token is in the draft vocabulary."""
        logits = self.logits(aux, ids)
        lp = torch.log_softmax(logits, dim=-1).cpu()
        d = self.t2d[want]
        keep = d >= 0
        if scored is not None:
            keep = keep & scored
        logp = lp[keep].gather(1, d[keep].unsqueeze(1)).squeeze(1).clamp_min(LOGP_FLOOR)
        hit = self.m.to_target_ids(logits.argmax(-1)).cpu()[keep] == want[keep]
        return logp, hit, keep


def worse_than_literal(m: Measurement, literal: str) -> str:
    """'' unless the measurement's winner drafts worse than ``literal`` (the reading vLLM serves the checkpoint
    with as it is) by more than 3 binomial standard errors of top-1 agreement and 0.02: a likelihood winner with
    fewer hits than what is served now is never written silently."""
    w = m.winner
    if w is None or w == literal or m.positions == 0:
        return ""
    aw, al = m.agreement.get(w, 0.0), m.agreement.get(literal, 0.0)
    se = math.sqrt(max(aw * (1 - aw) + al * (1 - al), 1e-12) / m.positions)
    if al - aw > max(3 * se, 0.02):
        return (f"the measurement's winner {w} has a higher likelihood but drafts the target's next token less often "
                f"than {literal}, the reading vLLM serves now (top-1 agreement {aw:.3f} vs {al:.3f}, 3 SE = "
                f"{3 * se:.3f})")
    return ""


# ----- the states, once per sequence --------------------------------------------------------------------------------
def _states(target: LazyTarget, seq: list[int], ids: list[int]) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """{vLLM id: state [T, Ht]} and the target's greedy next token at every position [T]: the ones kept for ``seq``
    when they hold every id in ``ids``, else one forward (:func:`batched_states` of the one sequence)."""
    return batched_states(target, [seq], ids)[0]


target_states = _states  # the public name (target_fit measures step 0 on the same states)


def batched_states(target: LazyTarget, seqs: list[list[int]],
                   ids: list[int]) -> list[tuple[dict[int, torch.Tensor], torch.Tensor]]:
    """:func:`target_states` of each of ``seqs``: the ones kept for a sequence when they hold every id in ``ids`` (the
    aux-id measurement's), the rest in one right-padded forward (causal attention: a row's positions never see the
    padding after them, so each row reads as its own forward)."""
    out: list[Any] = [None] * len(seqs)
    todo = []
    for i, s in enumerate(seqs):
        kept = target.kept(s)
        if kept is not None and kept[1] is not None and all(j in kept[0] for j in ids):
            out[i] = (kept[0], kept[1])
        else:
            todo.append(i)
    if todo:
        union, ht = sorted(set(ids)), target.info.hidden_size
        x = torch.zeros(len(todo), max(len(seqs[i]) for i in todo), dtype=torch.long)
        for r, i in enumerate(todo):
            x[r, : len(seqs[i])] = torch.tensor(seqs[i])
        aux, logits = target.loaded.forward(x, union)
        for r, i in enumerate(todo):
            n = len(seqs[i])
            out[i] = ({v: aux[r, :n, j * ht:(j + 1) * ht].float().cpu() for j, v in enumerate(union)},
                      logits[r, :n].argmax(-1).cpu())
    return out


def _scorer(target: LazyTarget, step: Step0, readings: dict[str, tuple[list[int], Callable[[], None]]], keep: bool):
    """``score(h)`` for :func:`sequential`: step 0 under each reading (name -> (its vLLM aux ids, what sets it up on
    the drafter)) at the positions of ``h`` where vLLM drafts, from one target pass (kept on ``target``: ``keep``)."""
    union = sorted({i for ids, _ in readings.values() for i in ids})

    def score(h: HeldoutSequence):
        states, nxt = _states(target, h.ids, union)
        if keep:
            target.keep(h.ids, states, nxt)
        want, scored = nxt[1:], drafted_positions(h, nxt)
        logp, hit, excl = {}, {}, 0
        for name, (ids, setup) in readings.items():
            setup()
            aux = torch.cat([states[i] for i in sorted(ids)], dim=-1)[: len(h.ids) - 1]
            logp[name], hit[name], kept = step(aux, h.ids, want, scored)
            excl = int((scored & ~kept).sum())
        return logp, hit, excl

    return score


def measure(ck: Checkpoint, target: LazyTarget, candidates: list[list[int]], *, seed: int = 0, data: Any = None,
            sequences: list[list[int]] | None = None, max_length: int = MAX_LENGTH, keep_states: bool = True,
            progress: Callable[[int, int], None] | None = None) -> Measurement:
    """The aux-id measurement: ``candidates`` (vLLM ids of each reading, in the order of :data:`CONVENTIONS`)
    compared by :func:`sequential` where vLLM drafts (:func:`drafted_positions`). ``sequences``: the statistics
    pass's sequences, whose first tokens are the first prompts. The measured sequences' states are kept on
    ``target`` (``keep_states``) for the ``norm_before_residual`` measurement on the same sequences."""
    t0 = time.perf_counter()
    m = load_drafter(ck, target.loaded, device=target.device, dtype=target.dtype)
    step = Step0(m, target.info.vocab_size, target.device, target.dtype)
    score = _scorer(target, step, {c: (ids, lambda: None) for c, ids in zip(CONVENTIONS, candidates)}, keep_states)
    res = sequential(list(CONVENTIONS), measurement_sequences(target, data, seed, sequences, max_length), score,
                     progress=progress, uniform=-math.log(m.cfg.draft_vocab_size))
    return res.model_copy(update={"seconds": round(time.perf_counter() - t0, 2)})  # target and drafter load included


def measure_norm_before_residual(ck: Checkpoint, target: LazyTarget, ids: list[int], *, seed: int = 0, data: Any = None,
                                 sequences: list[list[int]] | None = None, max_length: int = MAX_LENGTH,
                                 progress: Callable[[int, int], None] | None = None) -> Measurement:
    """``norm_before_residual`` true vs false (step 0's layer 0 takes ``hidden_norm(g)`` or ``g`` as its residual),
    compared by :func:`sequential` where vLLM drafts, on the aux states at ``ids`` (vLLM ids, decided). The same
    sequences as the aux-id measurement: their kept states are reused."""
    m = load_drafter(ck, target.loaded, device=target.device, dtype=target.dtype)
    step = Step0(m, target.info.vocab_size, target.device, target.dtype)
    layer0 = m.layers[0]

    def flag(v: bool) -> Callable[[], None]:
        return lambda: setattr(layer0, "norm_before_residual", v)

    score = _scorer(target, step, {"true": (ids, flag(True)), "false": (ids, flag(False))}, keep=False)
    try:
        return sequential(["true", "false"], measurement_sequences(target, data, seed, sequences, max_length), score,
                          progress=progress, uniform=-math.log(m.cfg.draft_vocab_size))
    finally:
        layer0.norm_before_residual = ck.config.norm_before_residual


# ----- deciding ------------------------------------------------------------------------------------------------------
def resolve_for_target(ck: Checkpoint, target: LazyTarget, *, override: Convention | None = None, seed: int = 0,
                       data: Any = None, sequences: list[list[int]] | None = None,
                       progress: Callable[[int, int], None] | None = None) -> AuxIds:
    """:func:`eagle_migrate.formats.aux_ids.resolve` for a checkpoint and a target: measures only when nothing else decides."""
    a: AuxIds | None = getattr(ck, "aux", None)
    if a is None or ck.config.generation != "eagle3":
        return a if a is not None else from_stored(None, "none")
    return resolve(a, ck.config.num_aux, target.info.num_layers, override=override,
                   measure_fn=lambda cands: measure(ck, target, cands, seed=seed, data=data, sequences=sequences,
                                                    progress=progress))


def norm_before_residual_open(ck: Checkpoint) -> bool:
    """True when the config does not state ``norm_before_residual`` (the reader took its layout's default) and the
    drafter is one step 0 can run (EAGLE-3, unquantized)."""
    return (ck.config.generation == "eagle3" and not ck.meta.get("norm_before_residual_stated", True)
            and not ck.quantization)


def decide_norm_before_residual(ck: Checkpoint, target: LazyTarget, ids: list[int], *, seed: int = 0, data: Any = None,
                                sequences: list[list[int]] | None = None,
                                progress: Callable[[int, int], None] | None = None) -> Measurement | None:
    """When the config does not state ``norm_before_residual``: measure it, and on a winner set it on ``ck.config``
    (``ck.meta['norm_before_residual_measurement']`` keeps the evidence). None when nothing was measured."""
    if not norm_before_residual_open(ck):
        return None
    ck.meta.setdefault("norm_before_residual_layout_default", ck.config.norm_before_residual)  # what vLLM reads
    m = measure_norm_before_residual(ck, target, ids, seed=seed, data=data, sequences=sequences, progress=progress)
    ck.meta["norm_before_residual_measurement"] = m.model_dump()
    if m.winner is not None:
        ck.config = ck.config.model_copy(update={"norm_before_residual": m.winner == "true"})
        ck.meta["norm_before_residual_stated"] = True
        ck.meta["norm_before_residual_decided_by"] = "measurement"
    return m
