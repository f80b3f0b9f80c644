"""The held-out judge's statistics: how well a drafter drafts on held-out sequences, with standard errors.

* :class:`HeldoutSequence` -- a prompt followed by the target's own greedy continuation
  (:func:`greedy_continuations` makes them with transformers' ``generate``).
* :func:`simulated_acceptance` -- the drafter unrolled over k steps on those sequences (the forward of
  :mod:`eagle_migrate.train`), scored at every draftable position (:func:`chain_lengths`) and walked as vLLM's
  greedy generation walks (:func:`walk_chains`): :class:`SimulatedAcceptance`, the AL with its standard error.
* :func:`paired_difference` -- two drafters on the same positions, ``a - b`` with a block-clustered standard error
  (:class:`PairedDifference`); :class:`Comparison` pools it over the held-out suites, and :data:`JUDGE_Z` /
  :func:`judge_block` are the judge's settings (docs/calibration.md "The judge").
* :func:`futility` -- whether any candidate can still beat the initial drafter within the steps left; the fit stops
  when none can (``train.fit(give_up=...)``; docs/calibration.md "When calibration stops").

Calibration (:mod:`eagle_migrate.calibrate`) uses these to keep the best checkpoint and to compare the result with
the source drafter; the trainer (:mod:`eagle_migrate.train`) knows nothing of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, Field, PrivateAttr

from .drafter.model import EagleDrafter
from .train import _autocast, unrolled_forward


# ----- simulated acceptance ------------------------------------------------------------------------------------------
class SimulatedAcceptance(BaseModel):
    """Greedy acceptance of k-token chains, walked as vLLM walks a greedy generation (AL = 1 + accepted / drafts).

    Besides the walk, the accepted-chain length at *every* draftable position is kept (``chains``, not dumped):
    two drafters evaluated on the same held-out sequences are compared position by position with
    :func:`paired_difference` (docs/calibration.md "The judge")."""

    acceptance_length: float
    acceptance_length_se: float | None = Field(None, description="standard error of the AL: sd of the per-draft "
                                               "accepted counts / sqrt(drafts)")
    per_position_rate: list[float] = Field(description="accepted at draft position j / drafts")
    num_drafts: int
    num_accepted: int
    num_sequences: int
    num_positions: int = Field(0, description="draftable held-out positions (every one is scored for the paired "
                               "comparison)")
    _chains: list[list[int]] = PrivateAttr(default_factory=list)

    @property
    def chains(self) -> list[list[int]]:
        """Per sequence: the number of drafts accepted by a chain started at each draftable position."""
        return self._chains


def _beyond(x: float, se: float, z: float) -> bool:
    """x > 0 beyond z standard errors (an se of 0 with a walk not measured, x = 0, is never beyond)."""
    return x > 0 and x > z * se


class PairedDifference(BaseModel):
    """``a - b`` in acceptance per draft (AL units), over the same held-out positions (docs/calibration.md)."""

    diff: float = Field(description="mean over the positions of (accepted by a) - (accepted by b)")
    se: float = Field(description="standard error of diff (blocks of consecutive positions as independent units)")
    relative: float = Field(description="diff / (1 + mean accepted by b): the relative change of AL")
    base_al: float = Field(description="1 + mean accepted by b over every position")
    num_positions: int
    num_blocks: int
    walk_diff: float = Field(0.0, description="AL(a) - AL(b) by vLLM's walk over the same sequences (the ALs reported "
                             "and served; the walk visits only some positions, so it can disagree with diff)")
    walk_se: float = Field(0.0, description="standard error of walk_diff, each sequence a cluster (paired)")

    def z(self) -> float:
        return self.diff / self.se if self.se > 0 else (math.inf if self.diff > 0 else -math.inf if self.diff < 0 else 0.0)

    def below_everywhere(self, z: float) -> bool:
        """a below b beyond ``z`` standard errors at every position."""
        return _beyond(-self.diff, self.se, z)

    def below_in_walk(self, z: float) -> bool:
        """a below b beyond ``z`` standard errors in vLLM's walk."""
        return _beyond(-self.walk_diff, self.walk_se, z)


def chain_lengths(preds: torch.Tensor, ids: torch.Tensor, prompt_len: int, length: int, k: int) -> list[int]:
    """For every draftable position i (prompt_len-1 .. length-3): how many of the k drafts made there match the
    sequence (the chain stops at the first miss, and at the end of the sequence). ``preds`` [k, T] target ids."""
    start, stop = prompt_len - 1, length - 2  # a chain at i drafts t_{i+2}..; needs i + 2 <= length - 1
    if stop <= start:
        return []
    n = stop - start
    ids = ids[:length]
    ok = torch.zeros(k, n, dtype=torch.bool)
    for j in range(k):
        m = max(0, min(n, length - 2 - j - start))  # positions whose target t_{i+2+j} exists
        if m:
            ok[j, :m] = preds[j, start : start + m] == ids[start + 2 + j : start + 2 + j + m]
    return ok.int().cumprod(0).sum(0).tolist()


def walk_chains(chains: Sequence[int]) -> list[int]:
    """The accepted count of every draft of vLLM's greedy walk, from the chain lengths at each position (the first
    draft at the first draftable position; a draft with a accepted moves a + 1 positions)."""
    out, i = [], 0
    while i < len(chains):
        out.append(chains[i])
        i += chains[i] + 1
    return out


def _mean_se(xs: Sequence[float]) -> float:
    n = len(xs)
    if n < 2:
        return 0.0
    m = sum(xs) / n
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1) / n)


def paired_difference(a: SimulatedAcceptance, b: SimulatedAcceptance, block: int = 16) -> PairedDifference:
    """``a`` minus ``b``, position by position over the same held-out sequences.

    d_i = c_i(a) - c_i(b) at every draftable position i (c = accepted-chain length). Neighbouring positions share
    tokens, so they are not independent: positions are grouped into blocks of ``block`` consecutive positions
    within a sequence and the blocks are the independent units (a cluster-robust standard error of the mean):
    se^2 = G / (G - 1) * sum_g (S_g - mean * n_g)^2 / N^2 (S_g, n_g: the block's sum of d and its size)."""
    if len(a.chains) != len(b.chains) or any(len(x) != len(y) for x, y in zip(a.chains, b.chains)):
        raise ValueError("paired_difference needs two evaluations of the same held-out sequences")
    sums, sizes, base = [], [], 0
    for ca, cb in zip(a.chains, b.chains):
        for s in range(0, len(ca), block):
            da = ca[s : s + block]
            db = cb[s : s + block]
            sums.append(sum(da) - sum(db))
            sizes.append(len(da))
            base += sum(db)
    n, g = sum(sizes), len(sizes)
    if n == 0:
        return PairedDifference(diff=0.0, se=0.0, relative=0.0, base_al=1.0, num_positions=0, num_blocks=0)
    mean = sum(sums) / n
    var = g / (g - 1) * sum((sg - mean * ng) ** 2 for sg, ng in zip(sums, sizes)) / n**2 if g > 1 else 0.0
    base_al = 1.0 + base / n
    walk_diff, walk_se = _walk_difference(a.chains, b.chains)
    return PairedDifference(diff=mean, se=math.sqrt(var), relative=mean / base_al, base_al=base_al, num_positions=n,
                            num_blocks=g, walk_diff=walk_diff, walk_se=walk_se)


def _walk_difference(ca: Sequence[Sequence[int]], cb: Sequence[Sequence[int]]) -> tuple[float, float]:
    """AL(a) - AL(b) of vLLM's walk (:func:`walk_chains`) over the same sequences, and its standard error with each
    sequence a cluster: the two ratios' delta-method residuals (accepted - r * drafts) / drafts, differenced per
    sequence (pairing keeps what the sequences share)."""
    wa, wb = [walk_chains(c) for c in ca], [walk_chains(c) for c in cb]
    na, nb = sum(len(w) for w in wa), sum(len(w) for w in wb)
    if not na or not nb:
        return 0.0, 0.0
    ra, rb = sum(map(sum, wa)) / na, sum(map(sum, wb)) / nb
    e = [(sum(x) - ra * len(x)) / na - (sum(y) - rb * len(y)) / nb for x, y in zip(wa, wb)]
    g = len(e)
    return ra - rb, math.sqrt(g / (g - 1) * sum(v * v for v in e)) if g > 1 else 0.0


@dataclass
class HeldoutSequence:
    """A prompt followed by the target's own greedy continuation (the draft at step j is accepted iff it equals
    the sequence's next tokens). ``prompt_len`` = number of prompt tokens."""

    ids: list[int]
    prompt_len: int


def walk_acceptance(preds: torch.Tensor, ids: torch.Tensor, prompt_len: int, length: int, k: int) -> tuple[int, list[int]]:
    """(drafts, accepted per position) for one sequence. ``preds`` [k, T]: step-j draft (target id) at position i."""
    w = walk_chains(chain_lengths(preds, ids, prompt_len, length, k))
    return len(w), [sum(1 for a in w if a > j) for j in range(k)]


@torch.no_grad()
def simulated_acceptance(
    model: EagleDrafter,
    store: Any,
    prompt_lens: Sequence[int],
    k: int,
    device: torch.device | str = "cpu",
    autocast: bool = False,
    chunk: int | None = 512,
) -> SimulatedAcceptance:
    """Simulated AL over a :class:`FeatureStore` of held-out sequences (target greedy continuations)."""
    was = model.training
    model.eval()
    drafts, acc, nseq, row = 0, [0] * k, 0, 0
    chains: list[list[int]] = []
    per_draft: list[int] = []
    for bi in range(len(store)):
        fb = store[bi].to(device, None)
        b, t = fb.input_ids.shape
        # the drafts are read from the first draftable position on (chain_lengths): the prompt's positions run step 0
        # alone (their keys), not the later steps nor the head
        start = max(0, min(prompt_lens[row:row + b]) - 1)
        with _autocast(device, autocast):  # the head too: under autocast h_post is bf16 and lm_head fp32
            outs = unrolled_forward(model, fb.input_ids, fb.aux.to(model.fc.weight.dtype), k, chunk=chunk, start=start)
            preds = torch.full((b, k, t), -1, dtype=torch.long)  # [B,k,T], -1 where nothing is read
            preds[:, :, start:] = torch.stack([model.to_target_ids(model.logits(o.h_post).argmax(-1))
                                               for o in outs], 1).cpu()
        lengths = fb.lengths.tolist() if fb.lengths is not None else [t] * b
        for r in range(b):
            ref = fb.input_ids if getattr(fb, "reference", None) is None else fb.reference  # HeldoutFromFiles
            c = chain_lengths(preds[r], ref[r].cpu(), prompt_lens[row], int(lengths[r]), k)
            w = walk_chains(c)
            chains.append(c)
            per_draft += w
            drafts += len(w)
            acc = [x + sum(1 for a in w if a > j) for j, x in enumerate(acc)]
            nseq += 1
            row += 1
    model.train(was)
    n = sum(acc)
    out = SimulatedAcceptance(
        acceptance_length=1.0 + n / drafts if drafts else 1.0, acceptance_length_se=_mean_se(per_draft),
        per_position_rate=[a / drafts if drafts else 0.0 for a in acc],
        num_drafts=drafts, num_accepted=n, num_sequences=nseq, num_positions=sum(len(c) for c in chains),
    )
    out._chains = chains
    return out


# ----- greedy continuations ------------------------------------------------------------------------------------------
# tokens (prompt + continuation, padded) per generate() batch: prompts of similar length go together, up to this
# many tokens or GENERATE_MAX_BATCH sequences (the KV cache of SmolLM2-135M in fp32 at 8,192 tokens: about 0.7 GB)
GENERATE_TOKEN_BUDGET = 8192
GENERATE_MAX_BATCH = 32


def _length_batches(lengths: Sequence[int], new_tokens: int, batch: int, budget: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped shortest first into batches of similar length, each within ``budget`` padded
    tokens (prompt + ``new_tokens``) and ``batch`` sequences (one sequence at least)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out: list[list[int]] = []
    for i in order:
        cur = out[-1] if out else None
        if cur is not None and len(cur) < batch and (len(cur) + 1) * (lengths[i] + new_tokens) <= budget:
            cur.append(i)
        else:
            out.append([i])
    return out


@torch.no_grad()
def greedy_continuations(target: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                         batch: int = GENERATE_MAX_BATCH, eos_ids: Iterable[int] | None = None,
                         progress: Callable[[int, int], None] | None = None,
                         token_budget: int = GENERATE_TOKEN_BUDGET, ignore_eos: bool = False) -> list[HeldoutSequence]:
    """The target's own greedy continuations of ``prompts`` (transformers ``generate`` with its KV cache, left-padded
    batches of prompts of similar length, at most ``batch`` sequences and ``token_budget`` padded tokens each), in
    the order of ``prompts``; ``progress(done, total)`` after each batch (sequences). ``ignore_eos``: every
    continuation runs ``max_new_tokens`` (an end-of-sequence token is not written where it would end it, as vLLM's
    ``ignore_eos``)."""
    model = target.model
    gc = getattr(model, "generation_config", None)
    eos = set(eos_ids) if eos_ids is not None else set()
    if not eos and gc is not None and gc.eos_token_id is not None:
        eos = set(gc.eos_token_id if isinstance(gc.eos_token_id, list) else [gc.eos_token_id])
    pad = 0
    plain = [list(p) for p in prompts]
    out: list[HeldoutSequence | None] = [None] * len(plain)
    done = 0
    for idx in _length_batches([len(p) for p in plain], max_new_tokens, batch, token_budget):
        chunk = [plain[i] for i in idx]
        t = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), t), pad, dtype=torch.long)
        attn = torch.zeros((len(chunk), t), dtype=torch.long)
        for r, p in enumerate(chunk):
            ids[r, t - len(p):] = torch.tensor(p)
            attn[r, t - len(p):] = 1
        gen = model.generate(input_ids=ids.to(target.device), attention_mask=attn.to(target.device), do_sample=False,
                             max_new_tokens=max_new_tokens, pad_token_id=pad,
                             eos_token_id=sorted(eos) if eos else None, temperature=None, top_p=None, top_k=None,
                             **({"min_new_tokens": max_new_tokens} if ignore_eos else {}))
        for r, (i, p) in enumerate(zip(idx, chunk)):
            cont = gen[r, t:].tolist()
            for c, tok in enumerate(cont):
                if tok in eos and not ignore_eos:
                    cont = cont[: c + 1]
                    break
            out[i] = HeldoutSequence(p + cont, len(p))
        done += len(idx)
        if progress is not None:
            progress(done, len(plain))
    return [h for h in out if h is not None]


# ----- comparisons over suites ----------------------------------------------------------------------------------------
# the judge: a candidate replaces the best only when better by more than JUDGE_Z standard errors of the paired
# difference; a drafter is "worse than the source" on a suite when below it by more than JUDGE_Z standard errors
JUDGE_Z = 2.0


def judge_block(k: int) -> int:
    """Consecutive positions per independent unit of the paired standard error: chains started up to k positions
    apart share tokens; 4 (k + 1) positions leave the blocks' sums nearly uncorrelated (docs/calibration.md)."""
    return 4 * (k + 1)


class Comparison(BaseModel):
    """Drafter a minus drafter b on the same held-out positions: per suite and pooled (mean over the suites, as
    the score is; se = sqrt(sum se_s^2) / S, the suites being independent)."""

    suites: dict[str, PairedDifference]
    diff: float
    se: float
    relative: float = Field(description="mean over the suites of diff_s / AL_s(b)")
    walk_diff: float = Field(0.0, description="mean over the suites of the walk's AL difference (the score's)")
    walk_se: float = Field(0.0, description="its standard error (sequences as clusters, suites independent)")

    def better(self, z: float = JUDGE_Z) -> bool:
        """Beyond ``z`` standard errors at every position, and the AL of vLLM's walk (the score, what is served)
        higher too: the two can disagree in sign (a drafter whose right drafts come in runs gains at every position
        and loses in the walk, which crosses a run in one draft), and "better" must not lower the AL it reports."""
        return self.diff > 0 and self.diff > z * self.se and self.walk_diff > 0

    def worst(self) -> tuple[str, PairedDifference]:
        return min(self.suites.items(), key=lambda kv: kv[1].relative)

    def below(self, z: float = JUDGE_Z) -> dict[str, PairedDifference]:
        """The suites where a is below b beyond noise: at every position, or in vLLM's walk (the AL served; the two
        can disagree in sign, see :meth:`better`)."""
        return {n: d for n, d in self.suites.items() if d.below_everywhere(z) or d.below_in_walk(z)}

    @classmethod
    def of(cls, a: Mapping[str, SimulatedAcceptance], b: Mapping[str, SimulatedAcceptance], block: int) -> Comparison:
        per = {n: paired_difference(a[n], b[n], block) for n in a if n in b}
        s = max(len(per), 1)
        return cls(suites=per, diff=sum(d.diff for d in per.values()) / s,
                   se=sum(d.se**2 for d in per.values()) ** 0.5 / s, relative=sum(d.relative for d in per.values()) / s,
                   walk_diff=sum(d.walk_diff for d in per.values()) / s,
                   walk_se=sum(d.walk_se**2 for d in per.values()) ** 0.5 / s)


# ----- when calibration stops: no reachable improvement ---------------------------------------------------------------
FUTILITY_UCB_Z = 1.0  # standard errors added to the projected improvement (an upper confidence bound, one-sided 84 %)
FUTILITY_TREND_EVALS = 3  # evaluations (with the initial weights at step 0, difference 0) the trend is read from


def futility(history: Sequence[Mapping[str, Any]], steps_left: int, z: float = JUDGE_Z,
             ucb_z: float = FUTILITY_UCB_Z) -> str | None:
    """Why no candidate can beat the initial weights (the structural conversion) within the remaining budget, or
    None while one still can (docs/calibration.md "When calibration stops").

    ``history``: the fit's evaluation records while the initial weights are the best, each with ``step``,
    ``diff_vs_best`` (the candidate minus the initial drafter, paired, in AL) and ``diff_se``. From the last
    evaluation (d, se) and the steepest rise per step between consecutive evaluations among the last
    :data:`FUTILITY_TREND_EVALS` (step 0 counts as difference 0; a falling trend counts as flat), the best
    reachable difference is bounded above by ``d + ucb_z * se + max(0, steepest) * steps_left``. A candidate is
    accepted only when it beats the best by more than ``z`` standard errors; when the bound is at or below ``z * se``
    none can be, and calibration stops. Linear growth at the steepest recent rate overstates what a decaying
    learning rate reaches, so the bound errs towards continuing. Needs two evaluations (a trend)."""
    pts = [(int(h["step"]), float(h["diff_vs_best"]), float(h.get("diff_se") or 0.0)) for h in history
           if "diff_vs_best" in h]
    if len(pts) < 2 or len(pts) != len(history):
        return None
    trend = [(0, 0.0)] + [(s, d) for s, d, _ in pts]
    trend = trend[-(FUTILITY_TREND_EVALS + 1):] if len(trend) > FUTILITY_TREND_EVALS + 1 else trend
    rises = [(d1 - d0) / (s1 - s0) for (s0, d0), (s1, d1) in zip(trend, trend[1:]) if s1 > s0]
    slope = max([0.0] + rises)
    step, d, se = pts[-1]
    bound = d + ucb_z * se + slope * max(0, steps_left)
    if bound > z * se and bound > 0:
        return None
    return (f"at step {step} the best reachable improvement over the structural conversion, {d:+.3f} + {ucb_z:g} x "
            f"{se:.3f} (se) + {slope:.2g}/step x {steps_left} steps left = {bound:+.3f} AL, is within the judge's "
            f"threshold {z:g} x {se:.3f} = {z * se:.3f}: no candidate can be accepted")
