"""Training that matches inference: the drafter unrolled over k speculation steps exactly as vLLM drafts.

EAGLE-3's *training-time test*, for a sequence t_0..t_{T-1} with target aux states a_0..a_{T-1}:

* step 0, all positions in parallel: position i takes token t_{i+1} and g_i = fc(fc_norm(a_i)), attends causally
  to the step-0 keys at positions <= i, and predicts t_{i+2} (this is vLLM's step 0 over the verified context);
* step j >= 1: position i takes token t_{i+1+j} and, in place of g, the state the drafter fed back from step j-1
  at the same position (``h_post`` under ``norm_output``, ``h_pre`` otherwise); its RoPE position is i+j; it attends
  to the step-0 keys at positions <= i and to its own chain's keys from steps 1..j (all at column i), and predicts
  t_{i+2+j}. This is what vLLM computes for the j-th draft token when the context ends at t_{i+1}.

Feeding the true token t_{i+1+j} (not the drafter's own guess) is exact for acceptance: draft j only counts when
drafts 0..j-1 were accepted, i.e. equal to the true tokens. ``tests/unit/test_train.py`` proves that the unrolled
forward equals :meth:`EagleDrafter.draft_with_cache` (the multi-step drafting forward) on the same inputs.

Loss: cross-entropy of the drafter's distribution over the draft vocabulary against the target's distribution
restricted to the draft-vocabulary ids (target id = draft id + d2t[draft id]), at every step, weighted 0.8^j; the
features (aux states, the target's post-norm last state for the labels) come from :mod:`eagle_migrate.features`.

:func:`fit` is the optimisation loop shared by plain EAGLE-3 training (``benchmarks/train_smollm2_eagle3.py``) and
calibration (``eagle_migrate/calibrate/``): AdamW (fused on CUDA), warm-up + cosine/linear/constant schedule,
gradient clipping, bf16 autocast on CUDA and fp32 on CPU, a deterministic data order from the seed, held-out
evaluation with best-checkpoint keeping and early stopping, and exact resume from ``resume_dir``.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .drafter.model import EagleDrafter, StepOutput
from .features import FeatureBatch, Progress, TargetHead
from .fit_config import STEP_DECAY, FitConfig, Schedule, lr_at  # noqa: F401  (re-exported: train.FitConfig)
from .formats.output import atomic_file


# ----- the unrolled forward ------------------------------------------------------------------------------------------
def chain_mask(t: int, j: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[1, 1, T, (j+1)*T] bool (True = attend) for step j >= 1.

    Keys are laid out as [step-0 keys (T) | step-1 keys (T) | ... | step-j keys (T)]: the query of step j at
    position i sees step-0 keys at positions <= i and, in every later block, only column i (its own chain).
    """
    return _chunk_mask(0, t, j, device)


def shift_tokens(ids: torch.Tensor, by: int, fill: int = 0) -> torch.Tensor:
    """[B, T] -> out[:, i] = ids[:, i + by] (``fill`` past the end)."""
    out = torch.full_like(ids, fill)
    t = ids.shape[1]
    if by < t:
        out[:, : t - by] = ids[:, by:]
    return out


def _chunk_mask(a: int, b: int, j: int, device: torch.device | str) -> torch.Tensor:
    """Mask of step j >= 1 for the query block [a, b): keys = [step-0 keys 0..b-1 | steps 1..j keys a..b-1]."""
    q = torch.arange(a, b, device=device)
    causal = torch.arange(b, device=device)[None, :] <= q[:, None]
    eye = torch.eye(b - a, dtype=torch.bool, device=device)
    return torch.cat([causal] + [eye] * j, dim=1)[None, None]


def unrolled_forward(
    model: EagleDrafter,
    input_ids: torch.Tensor,
    aux: torch.Tensor,
    k: int,
    positions: torch.Tensor | None = None,
    chunk: int | None = None,
    start: int = 0,
) -> list[StepOutput]:
    """k drafter steps over every position at once (see the module docstring). ``outs[j].h_post[:, i - start]`` is
    the state from which the drafter predicts t_{i+2+j}; ``input_ids`` [B, T], ``aux`` [B, T, K*Ht].

    ``chunk``: run steps >= 1 in query blocks of this many positions (same result; attention work and mask memory
    drop from T x (j+1)T to about T x (T/2 + j*chunk), which matters for long held-out sequences).
    ``start``: the positions wanted (the judge reads drafts in the continuation, not in a long prompt): step 0 runs
    everywhere (its keys), steps >= 1 from ``start`` on (exact: step j at i reads step-0 keys at <= i and its own
    chain at i alone); every output covers positions ``start``..T-1."""
    b, t = input_ids.shape
    if aux.shape[:2] != (b, t):
        raise ValueError(f"aux covers {tuple(aux.shape[:2])}, input_ids {(b, t)}")
    start = max(0, min(int(start), t))
    pos = positions if positions is not None else torch.arange(t, device=input_ids.device).expand(b, t)
    hidden = model.combine(aux)
    outs: list[StepOutput] = []
    kv0: list[tuple[torch.Tensor, torch.Tensor]] = []
    chain: list[list[tuple[torch.Tensor, torch.Tensor]]] = []  # steps 1..j-1, per layer (K, V) over start..T-1
    for j in range(k):
        toks = shift_tokens(input_ids, 1 + j)
        if j == 0:
            o = model.forward_step(toks, hidden, pos)
            kv0 = list(o.new_kv)
            if start:
                o = StepOutput(h_post=o.h_post[:, start:], h_feed=o.h_feed[:, start:], new_kv=o.new_kv)
        else:  # one query block [start, T) unless chunked: its mask is chain_mask's rows from start
            o = _chunked_step(model, toks, hidden, pos, kv0, chain, j, start, chunk or t)
            chain.append(list(o.new_kv))
        outs.append(o)
        hidden = o.h_feed
    return outs


def _chunked_step(model: EagleDrafter, toks: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor,
                  kv0: list[tuple[torch.Tensor, torch.Tensor]], chain: list[list[tuple[torch.Tensor, torch.Tensor]]],
                  j: int, start: int, chunk: int) -> StepOutput:
    """Step j >= 1 of :func:`unrolled_forward` in query blocks of ``chunk`` from ``start`` on (``hidden``, the chain's
    keys: positions start..T-1; ``toks``, ``pos``, the step-0 keys: all)."""
    t = toks.shape[1]
    parts: list[StepOutput] = []
    for a in range(start, t, chunk):
        e = min(t, a + chunk)
        extra = [tuple(torch.cat([x0[:, :, :e]] + [c[li][w][:, :, a - start:e - start] for c in chain], 2)
                       for w, x0 in enumerate(kv)) for li, kv in enumerate(kv0)]
        parts.append(model.forward_step(toks[:, a:e], hidden[:, a - start:e - start], pos[:, a:e] + j,
                                        mask=_chunk_mask(a, e, j, toks.device), extra_kv=extra))
    return StepOutput(
        h_post=torch.cat([p.h_post for p in parts], 1), h_feed=torch.cat([p.h_feed for p in parts], 1),
        new_kv=[(torch.cat([p.new_kv[li][0] for p in parts], 2), torch.cat([p.new_kv[li][1] for p in parts], 2))
                for li in range(len(kv0))],
    )


def step_weights(k: int, decay: float = STEP_DECAY) -> list[float]:
    return [decay**j for j in range(k)]


# ----- target side ---------------------------------------------------------------------------------------------------
def draft_to_target_ids(model: EagleDrafter) -> torch.Tensor:
    """[Vd] target token id of every draft id."""
    ar = torch.arange(model.cfg.draft_vocab_size, device=model.lm_head.weight.device)
    return model.to_target_ids(ar)


@dataclass
class LossOutput:
    loss: torch.Tensor
    step_loss: list[float]
    step_acc: list[float]  # top-1 agreement with the target's argmax inside the draft vocabulary
    tokens: int


TRAIN_CHUNK, TRAIN_CHUNK_OVER = 512, 1024  # --data drift's 1k-4k contexts: a third of the attention work at k = 3


def unrolled_loss(model: EagleDrafter, fb: FeatureBatch, head: TargetHead | None, k: int,
                  decay: float = STEP_DECAY) -> LossOutput:
    """Weighted (decay^j) soft cross-entropy of the k unrolled steps against the target's draft-vocab distribution;
    the output layers run at the trained positions only; past TRAIN_CHUNK_OVER tokens steps >= 1 run chunked (same loss)."""
    t = fb.input_ids.shape[1]
    outs = unrolled_forward(model, fb.input_ids, fb.aux, k, chunk=TRAIN_CHUNK if t > TRAIN_CHUNK_OVER else None)
    lm = fb.loss_mask.to(fb.aux.device)
    tl = fb.labels_where(head, lm)  # [M, Vd] at the trained positions, row-major
    row = torch.full(lm.shape, -1, dtype=torch.long, device=lm.device)
    row[lm] = torch.arange(tl.shape[0], device=lm.device)
    total = torch.zeros((), device=fb.aux.device)
    wsum = 0.0
    sl, sa = [], []
    tokens = 0
    for j, (o, w) in enumerate(zip(outs, step_weights(k, decay))):
        n = t - 1 - j
        if n <= 0:
            break
        m = lm[:, 1 + j : 1 + j + n]
        cnt = int(m.sum())
        dl = model.logits(o.h_post[:, :n][m]).float()  # [cnt, Vd]; empty (loss 0, graph kept) when nothing trains
        tj = tl[row[:, 1 + j : 1 + j + n][m]]
        lj = -(tj.softmax(-1) * dl.log_softmax(-1)).sum() / max(cnt, 1)
        acc = float((dl.argmax(-1) == tj.argmax(-1)).sum()) / max(cnt, 1)
        total = total + w * lj
        wsum += w
        sl.append(float(lj.detach()))
        sa.append(acc)
        if j == 0:
            tokens = cnt
    return LossOutput(total / max(wsum, 1e-9), sl, sa, tokens)


def _autocast(device: torch.device | str, enabled: bool):
    on = enabled and torch.device(device).type == "cuda"
    return torch.autocast("cuda", dtype=torch.bfloat16) if on else contextlib.nullcontext()


# ----- the optimisation loop -----------------------------------------------------------------------------------------
def batch_order(n: int, step: int, seed: int) -> int:
    """The batch index used at ``step``: a fresh seeded permutation each epoch (resume needs no RNG state)."""
    epoch, r = divmod(step, n)
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return int(torch.randperm(n, generator=g)[r])


@dataclass
class Evaluation:
    """What ``evaluate`` may return instead of a plain score: the score plus whatever ``better`` compares."""

    score: float
    detail: Any = None


Better = Callable[[Evaluation, Evaluation], "tuple[bool, dict[str, Any]]"]
GiveUp = Callable[[Sequence[dict[str, Any]], int], "str | None"]  # (evaluation history, steps left) -> why stop, or None


@dataclass
class FitResult:
    steps_run: int
    best_step: int
    best_score: float | None
    initial_score: float | None
    history: list[dict[str, Any]] = field(default_factory=list)
    tokens_seen: int = 0
    seconds: float = 0.0
    stopped_early: bool = False
    resumed_from: int | None = None
    stop_reason: str | None = None  # "patience" | "time limit" | "no reachable improvement" when stopped_early
    best_eval: Evaluation | None = None  # the evaluation of the returned weights, when this run made it


def _state_path(resume_dir: Path) -> Path:
    return resume_dir / "state.pt"


class _FitLoop:
    """:func:`fit`'s state and its steps: setup (here), :meth:`resume`, :meth:`train_step`, :meth:`run_eval` (best
    tracking), :meth:`stop_reason` (patience, time limit, no reachable improvement), :meth:`save` and :meth:`finish`."""

    def __init__(self, model: EagleDrafter, trainable: Sequence[str], data: Any, head: TargetHead | None,
                 cfg: FitConfig, *, device: torch.device, evaluate: Callable[[], float | Evaluation] | None,
                 initial_score: float | Evaluation | None, resume_dir: str | os.PathLike | None,
                 progress: Progress | None, lr_scale: dict[str, float] | None, better: Better | None,
                 t0: float, give_up: GiveUp | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.model, self.trainable, self.data, self.head, self.cfg = model, list(trainable), data, head, cfg
        self.device, self.evaluate, self.better, self.progress, self.t0 = device, evaluate, better, progress, t0
        self.give_up, self.clock = give_up, clock
        self.initial_score = initial_score
        self.named = dict(model.named_parameters())
        unknown = [n for n in trainable if n not in self.named]
        if unknown:
            raise ValueError(f"no parameters named {unknown}")
        for n, p in self.named.items():
            p.requires_grad_(n in trainable)
        self.params = [self.named[n] for n in trainable]
        self.cuda = device.type == "cuda"
        self.opt = self._optimizer(lr_scale)
        torch.manual_seed(cfg.seed)
        self.n_batches = len(data)
        self.save_every = cfg.save_every or cfg.eval_every
        # the loop's state (what state.pt keeps)
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self.tokens = 0
        self.best_eval = initial_score if isinstance(initial_score, Evaluation) else None
        self.best_eval_step = 0  # the step best_eval scored (a resumed run's best was scored by the run before)
        self.best_score = initial_score.score if isinstance(initial_score, Evaluation) else initial_score
        self.best_step = 0
        self.best_state = self._snapshot()
        self.bad = 0
        self.evals_done = 1  # timed: the next evaluation is at this many time_evals-ths of max_seconds
        self.resumed_from: int | None = None
        self.rdir = Path(resume_dir) if resume_dir is not None else None

    def _optimizer(self, lr_scale: dict[str, float] | None) -> torch.optim.Optimizer:
        """AdamW (fused on CUDA), one parameter group per learning-rate scale."""
        opt_kw: dict[str, Any] = {"lr": self.cfg.lr, "betas": (0.9, 0.95), "weight_decay": self.cfg.weight_decay}
        if self.cuda:
            opt_kw["fused"] = True
        scales = [float((lr_scale or {}).get(n, 1.0)) for n in self.trainable]
        groups: dict[float, list[torch.nn.Parameter]] = {}
        for n, sc in zip(self.trainable, scales):
            groups.setdefault(sc, []).append(self.named[n])
        return torch.optim.AdamW([{"params": ps, "scale": sc} for sc, ps in groups.items()], **opt_kw)

    def _snapshot(self) -> dict[str, torch.Tensor]:
        return {n: self.named[n].detach().clone() for n in self.trainable}

    def _load(self, state: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for n in self.trainable:
                self.named[n].copy_(state[n])

    def resume(self) -> None:
        """Continue from ``resume_dir/state.pt`` when it is there (same trainable parameters only)."""
        rdir = self.rdir
        if rdir is None or not _state_path(rdir).exists():
            return
        st = torch.load(_state_path(rdir), map_location="cpu", weights_only=True)
        if list(st["trainable"]) != self.trainable:
            raise ValueError(f"{rdir}: the saved run trained other parameters; use a fresh --resume folder")
        self._load(st["params"])
        self.opt.load_state_dict(st["optim"])
        self.step = int(st["step"])
        self.history = list(st["history"])
        self.tokens = int(st["tokens"])
        self.best_score = st["best_score"]
        self.best_step = int(st["best_step"])
        self.best_state = {n: v.to(self.device) for n, v in st["best"].items()}
        self.bad = int(st["bad"])
        torch.set_rng_state(st["rng"])
        self.resumed_from = self.step
        if self.better is not None and self.evaluate is not None and self.best_step > 0:
            # the judge compares against the best's own evaluation: re-evaluate the saved best weights
            with torch.no_grad():
                now = self._snapshot()
                self._load(self.best_state)
                ev = self.evaluate()
                self.best_eval = ev if isinstance(ev, Evaluation) else Evaluation(float(ev))
                self.best_eval_step = self.best_step  # the saved best's own evaluation: finish() may return it
                self._load(now)
        if self.progress:
            self.progress({"phase": "resume", "step": self.step})

    def save(self) -> None:
        """Write the resume state atomically (nothing without ``resume_dir``)."""
        if self.rdir is None:
            return
        self.rdir.mkdir(parents=True, exist_ok=True)
        st = {
            "step": self.step, "trainable": list(self.trainable),
            "params": {n: self.named[n].detach().cpu().clone() for n in self.trainable},
            "optim": self.opt.state_dict(), "history": self.history, "tokens": self.tokens,
            "best_score": self.best_score, "best_step": self.best_step,
            "best": {n: v.detach().cpu().clone() for n, v in self.best_state.items()}, "bad": self.bad,
            "rng": torch.get_rng_state(),
        }
        with atomic_file(_state_path(self.rdir)) as tmp:
            torch.save(st, tmp)

    def train_step(self) -> None:
        """One optimiser step on the batch the seeded order picks for this step."""
        cfg, step = self.cfg, self.step
        lr = lr_at(step, cfg, self.horizon())
        for g_ in self.opt.param_groups:
            g_["lr"] = lr * g_.get("scale", 1.0)
        fb = self.data[batch_order(self.n_batches, step, cfg.seed)].to(self.device, self.model.fc.weight.dtype)
        with _autocast(self.device, self.cuda):
            out = unrolled_loss(self.model, fb, self.head, cfg.k, cfg.decay)
        self.opt.zero_grad(set_to_none=True)
        out.loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(self.params, cfg.clip)
        self.opt.step()
        self.tokens += out.tokens
        self.step += 1
        rec = {"phase": "train", "step": self.step, "steps": cfg.steps, "reach": self.reach(), "loss": float(out.loss.detach()), "lr": lr,
               "grad_norm": float(gnorm), "step_acc": out.step_acc, "tokens": self.tokens}
        if self.progress:
            self.progress(rec)

    def steps_left(self) -> int:
        """The configured steps left, under ``max_seconds`` at most those that fit at this run's pace (+ the one past it)."""
        left, done, spent = self.cfg.steps - self.step, self.step - (self.resumed_from or 0), self.clock() - self.t0
        if self.cfg.max_seconds is not None and done > 0 and spent > 0:
            left = min(left, max(0, math.floor((self.cfg.max_seconds - spent) / (spent / done))) + 1)
        return left

    @property
    def timed(self) -> bool:
        return self.cfg.horizon == "time" and self.cfg.max_seconds is not None

    def reach(self) -> int:
        """The steps this run will reach: ``steps``; with ``max_seconds``, those that fit in it at this run's pace."""
        return self.step + self.steps_left()

    def horizon(self) -> int:
        """The schedule's length: ``steps``; timed, :meth:`reach`."""
        return self.reach() if self.timed else self.cfg.steps

    def run_eval(self) -> str | None:
        """Evaluate; keep the best (``better`` decides when given, else a gain over ``min_delta``); "patience", "no
        reachable improvement" (``give_up``, asked while the initial weights are the best) or None."""
        if self.evaluate is None:
            return None
        ev = self.evaluate()
        ev = ev if isinstance(ev, Evaluation) else Evaluation(float(ev))
        score = ev.score
        info: dict[str, Any] = {}
        if self.better is not None and self.best_eval is not None:
            improved, info = self.better(ev, self.best_eval)
        else:
            improved = self.best_score is None or score > self.best_score + self.cfg.min_delta
        if improved:
            self.best_score, self.best_step, self.bad, self.best_eval = score, self.step, 0, ev
            self.best_eval_step = self.step
            self.best_state = self._snapshot()
        else:
            self.bad += 1
        rec = {"step": self.step, "score": score, "best_step": self.best_step, "best_score": self.best_score, **info}
        self.history.append(rec)
        why = "patience" if self.cfg.patience is not None and self.bad >= self.cfg.patience else None
        if why is None and self.give_up and self.cfg.patience and self.best_step == 0 and self.step < self.cfg.steps:
            rec["give_up"] = self.give_up(self.history, self.steps_left())
            why = "no reachable improvement" if rec["give_up"] else None
        if self.progress:
            self.progress({"phase": "eval", **rec})
        return why

    def stop_reason(self, clock: Callable[[], float]) -> str | None:
        """After a step: evaluate when due; "patience", "no reachable improvement" or "time limit" when the loop
        stops here (a step that ends past ``max_seconds`` is evaluated first), else None."""
        cfg, step = self.cfg, self.step
        if self.timed:  # at each time_evals-th of max_seconds
            period, elapsed = cfg.max_seconds / cfg.time_evals, clock() - self.t0  # type: ignore[operator]
            evaluated = step == cfg.steps or elapsed >= self.evals_done * period
            if evaluated:
                self.evals_done = int(elapsed // period) + 1
        else:
            evaluated = step % cfg.eval_every == 0 or step == cfg.steps
        if evaluated:
            why = self.run_eval()
            if why:
                return why
        if step < cfg.steps and cfg.max_seconds is not None and clock() - self.t0 >= cfg.max_seconds:
            if not evaluated:
                self.run_eval()
            return "time limit"
        return None

    def finish(self, stopped: bool, stop_reason: str | None, seconds: float) -> FitResult:
        """Load the best weights back (with an evaluator), freeze the model, report."""
        if self.evaluate is not None:
            self._load(self.best_state)
        for p in self.model.parameters():
            p.requires_grad_(False)
        return FitResult(
            steps_run=self.step, best_step=self.best_step if self.evaluate is not None else self.step,
            best_score=self.best_score, initial_score=self.initial_score, history=self.history,
            tokens_seen=self.tokens, seconds=seconds, stopped_early=stopped, resumed_from=self.resumed_from,
            stop_reason=stop_reason,
            best_eval=self.best_eval if self.evaluate is not None and self.best_eval_step == self.best_step else None,
        )


def fit(model: EagleDrafter, trainable: Sequence[str], data: Any, head: TargetHead | None, cfg: FitConfig, *,
        device: torch.device | str = "cpu", evaluate: Callable[[], float | Evaluation] | None = None,
        initial_score: float | Evaluation | None = None, resume_dir: str | os.PathLike | None = None,
        progress: Progress | None = None, lr_scale: dict[str, float] | None = None,
        clock: Callable[[], float] = time.perf_counter, better: Better | None = None,
        give_up: GiveUp | None = None) -> FitResult:
    """Train the parameters named in ``trainable`` (everything else frozen) on ``data`` (indexable FeatureBatches).

    ``evaluate()`` returns a score (higher is better; held-out simulated AL): it runs every ``eval_every`` steps and
    at the end; the parameters of the best evaluation (the initial weights included, scored ``initial_score``)
    are loaded back before returning. Without ``evaluate`` the final weights are kept. ``resume_dir``: every
    ``save_every`` steps ``state.pt`` (step, trainable tensors, optimiser state, best-so-far, history, RNG) is
    written atomically; a later call with the same folder continues from it and reaches the same weights.
    ``lr_scale``: per-parameter learning-rate multipliers (calibrate uses each norm's mean |weight| so that norm
    weights of very different sizes move by the same relative amount). ``clock``: seconds, for ``cfg.max_seconds``
    and the reported time (tests pass a fake one).

    ``better(new, best)``: the judge. Without it an evaluation replaces the best when its score is higher by
    ``cfg.min_delta``; with it, ``evaluate`` returns :class:`Evaluation` objects (``initial_score`` too) and a
    candidate replaces the best only when ``better`` says so (calibrate: better than the best by more than two
    standard errors of the paired difference); its dict goes into the evaluation's history record.

    ``give_up(history, steps_left)``: asked after each evaluation while the initial weights are still the best and
    early stopping is on (``cfg.patience``); a non-empty reason stops the loop there with stop_reason "no reachable
    improvement" (calibrate: :func:`eagle_migrate.judge.futility`, docs/calibration.md "When calibration stops").
    """
    loop = _FitLoop(model, trainable, data, head, cfg, device=torch.device(device), evaluate=evaluate,
                    initial_score=initial_score, resume_dir=resume_dir, progress=progress, lr_scale=lr_scale,
                    better=better, t0=clock(), give_up=give_up, clock=clock)
    loop.resume()
    model.train()
    stopped, stop_reason = False, None
    while loop.step < cfg.steps:
        loop.train_step()
        stop_reason = loop.stop_reason(clock)
        stopped = stop_reason is not None
        if loop.step % loop.save_every == 0 or stopped or loop.step == cfg.steps:
            loop.save()
        if stopped:
            break
    return loop.finish(stopped, stop_reason, clock() - loop.t0)
