"""Agreement between two drafters on the target's positions: both draft from the same held-out records (step 0
over the whole context from the target's aux states, then chains of ``k`` steps cut at a few positions, each drafter
on its own drafts), and the counter reports top-1 agreement per step. A :class:`Runner` says how one drafter is run
(EAGLE-3 / 3.1 through :class:`~eagle_migrate.drafter.model.EagleDrafter`, EAGLE-2 through
:class:`~eagle_migrate.drafter.eagle2.Eagle2Reference`) and what it feeds back. Imports: torch, drafter, hidden_states,
errors, convert.result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..drafter.eagle2 import Eagle2Reference
from ..drafter.model import EagleDrafter, KVCache
from ..errors import DataError
from ..hidden_states import HiddenRecord
from .result import Agreement


@dataclass
class Prefill:
    top1: torch.Tensor  # [T-1] target ids drafted at step 0
    h_pre: torch.Tensor  # [T-1, H]
    h_post: torch.Tensor  # [T-1, H]
    cache: KVCache


@dataclass
class Runner:
    """One drafter as evaluated: how step 0's input g is made, how steps run, what is fed back."""

    prefill: Callable[[HiddenRecord], Prefill]
    step: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, KVCache], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    feed: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (h_pre, h_post) -> fed-back state


def eagle3_runner(m: EagleDrafter, gfn: Callable[[torch.Tensor], torch.Tensor], feed: Callable, device: str, dtype: torch.dtype) -> Runner:
    def prefill(rec: HiddenRecord) -> Prefill:
        ids = rec.input_ids.to(device)
        t = ids.shape[0]
        aux = rec.aux[: t - 1].to(device=device, dtype=dtype)
        g = gfn(aux).unsqueeze(0)
        cache = KVCache()
        pos = torch.arange(t - 1, device=device).unsqueeze(0)
        o = m.forward_step(ids[1:].unsqueeze(0), g, pos, cache=cache)
        top1 = m.to_target_ids(m.logits(o.h_post).argmax(-1))[0]
        return Prefill(top1, o.h_feed[0], o.h_post[0], cache)

    def step(tok: torch.Tensor, fed: torch.Tensor, pos: torch.Tensor, cache: KVCache):
        o = m.forward_step(tok.view(1, 1), fed.view(1, 1, -1), pos.view(1, 1), cache=cache)
        top1 = m.to_target_ids(m.logits(o.h_post).argmax(-1)).view(())
        return top1, o.h_feed.view(-1), o.h_post.view(-1)

    return Runner(prefill, step, feed)


def eagle2_runner(ref: Eagle2Reference, device: str, dtype: torch.dtype) -> Runner:
    def prefill(rec: HiddenRecord) -> Prefill:
        if rec.last is None:
            raise DataError("EAGLE-2 agreement needs the target's post-norm last hidden state (hidden-states layouts with 'last' / 'hidden_state')")
        ids = rec.input_ids.to(device)
        t = ids.shape[0]
        f = rec.last[: t - 1].to(device=device, dtype=dtype).unsqueeze(0)
        cache = KVCache()
        pos = torch.arange(t - 1, device=device).unsqueeze(0)
        h = ref.forward_step(ids[1:].unsqueeze(0), f, pos, cache)
        top1 = ref.logits(h).argmax(-1)[0]
        return Prefill(top1, h[0], h[0], cache)

    def step(tok, fed, pos, cache):
        h = ref.forward_step(tok.view(1, 1), fed.view(1, 1, -1), pos.view(1, 1), cache)
        return ref.logits(h).argmax(-1).view(()), h.view(-1), h.view(-1)

    return Runner(prefill, step, lambda h_pre, h_post: h_pre)


def truncate(cache: KVCache, n: int) -> KVCache:
    return KVCache(keys=[k[:, :, :n] for k in cache.keys], values=[v[:, :, :n] for v in cache.values])


def cuts(t: int, max_cuts: int, k: int) -> list[int]:
    lo, hi = 1, t - 2
    if hi < lo:
        return []
    n = min(max_cuts, hi - lo + 1)
    return sorted({lo + round(i * (hi - lo) / max(n - 1, 1)) for i in range(n)})


def chains(r: Runner, pf: Prefill, cuts: list[int], k: int, device: str) -> list[list[int]]:
    out = []
    for p in cuts:
        cache = truncate(pf.cache, p + 1)
        tok = pf.top1[p]
        fed = r.feed(pf.h_pre[p], pf.h_post[p])
        chain = [int(tok)]
        for j in range(1, k + 1):
            tok, h_pre, h_post = r.step(tok, fed, torch.tensor(p + j, device=device), cache)
            fed = r.feed(h_pre, h_post)
            chain.append(int(tok))
        out.append(chain)
    return out


class AgreementCounter:
    def __init__(self, k: int):
        self.pos = 0
        self.agree0 = 0
        self.chains = 0
        self.agree = [0] * k

    def add_step0(self, a: torch.Tensor, b: torch.Tensor) -> None:
        a, b = a[1:], b[1:]  # position 0 (first token's state) excluded
        self.pos += a.numel()
        self.agree0 += int((a == b).sum())

    def add_chains(self, src: list[list[int]], cand: list[list[int]]) -> None:
        for s, c in zip(src, cand):
            self.chains += 1
            for j in range(1, len(s)):
                self.agree[j - 1] += int(s[j] == c[j])

    def result(self, held: int) -> Agreement:
        return Agreement(
            step0=self.agree0 / self.pos if self.pos else None,
            steps=[a / self.chains for a in self.agree] if self.chains else [],
            num_positions=self.pos, num_chains=self.chains, held_out_sequences=held,
        )


@torch.no_grad()
def measure_agreement(src: Runner, cand: Runner, records: list[HiddenRecord], k: int, max_cuts: int, device: str,
                      tick: Callable[[int], None] | None = None) -> Agreement:
    """Step-0 and chain agreement of ``cand`` with ``src`` on ``records`` (``tick(i)`` after the i-th record)."""
    cnt = AgreementCounter(k)
    for i, rec in enumerate(records):
        s = src.prefill(rec)
        c = cand.prefill(rec)
        cnt.add_step0(s.top1, c.top1)
        at = cuts(rec.input_ids.shape[0], max_cuts, k)
        cnt.add_chains(chains(src, s, at, k, device), chains(cand, c, at, k, device))
        if tick is not None:
            tick(i + 1)
    return cnt.result(len(records))
