"""Drift diagnostics: what happens inside the drafter at each speculation step (source vs converted).

EAGLE-3.1 addresses two mechanisms of attention drift:
* the hidden state fed back to the next draft step grows (or shrinks) step after step when it is the pre-norm
  residual (EAGLE-3); ``norm_output`` feeds the normalised state instead -> ``fed_rms`` per step;
* the drafter's attention collapses onto the first tokens (attention sinks) or onto its own freshly drafted tokens
  instead of the verified context -> ``sink_mass`` (attention on the first ``sink_tokens`` positions) and
  ``draft_mass`` (attention on the chain-step entries, positions >= n), averaged over heads and layers.

Measured teacher-forced on finished sequences (prompt + the engine's output): one target forward per sequence gives
the aux states; at ``positions_per_sequence`` evenly spaced points n in the output the drafter drafts k tokens exactly
as in serving (cache filled by step 0, then k - 1 chain steps), with attention probabilities for the query at each
step. ``match_rate`` is the share of steps whose draft equals the sequence's next token given all earlier drafts were
right (a greedy acceptance estimate per position).
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import BaseModel, Field

from ..drafter import EagleDrafter, KVCache
from ..formats.aux_ids import vllm_default_aux_ids


class StepDiagnostics(BaseModel):
    step: int = Field(..., description="speculation step j (0 = the draft made from the target's states)")
    count: int = Field(0, description="draft steps measured")
    fed_rms: float = Field(0.0, description="RMS of the hidden state the drafter received at this step (g at step 0)")
    out_rms: float = Field(0.0, description="RMS of the state the step feeds to the next one (h_pre, or h_post with norm_output)")
    sink_mass: float = Field(0.0, description="attention mass on the first sink_tokens positions")
    draft_mass: float = Field(0.0, description="attention mass on the drafter's own chain-step tokens")
    match_rate: float = Field(0.0, description="share of steps whose draft matched the sequence (all earlier matched)")


class DriftDiagnostics(BaseModel):
    sink_tokens: int
    num_sequences: int
    num_positions: int
    steps: list[StepDiagnostics]

    def row(self, step: int) -> StepDiagnostics:
        return self.steps[step]


def _crop(cache: KVCache, n: int) -> None:
    for i, k in enumerate(cache.keys):
        if k is not None:
            cache.keys[i] = k[:, :, :n]
            cache.values[i] = cache.values[i][:, :, :n]


def _attn(o: Any, n: int, sink_tokens: int) -> tuple[float, float]:
    ps = torch.stack([p[0, :, -1].float() for p in o.attn_probs]).mean(dim=(0, 1))  # [S]
    sink = float(ps[:sink_tokens].sum())
    draft = float(ps[n:].sum()) if ps.shape[-1] > n else 0.0
    return sink, draft


def _rms(x: torch.Tensor) -> float:
    return float(x.float().pow(2).mean().sqrt())


@torch.no_grad()
def drift_diagnostics(
    target: Any,
    drafter: EagleDrafter,
    sequences: list[list[int]],
    prompt_lens: list[int],
    num_speculative_tokens: int = 3,
    positions_per_sequence: int = 4,
    sink_tokens: int = 4,
    max_len: int | None = None,
) -> DriftDiagnostics:
    """Per-step drift statistics of ``drafter`` over ``sequences`` (see the module docstring)."""
    k = num_speculative_tokens
    cfg = drafter.cfg
    ids = sorted(cfg.aux_layer_ids or vllm_default_aux_ids(target.info.num_layers))
    dev = next(drafter.parameters()).device
    dtype = next(drafter.parameters()).dtype
    acc = [{"count": 0, "fed_rms": 0.0, "out_rms": 0.0, "sink_mass": 0.0, "draft_mass": 0.0, "match": 0} for _ in range(k)]
    n_pos = n_seq = 0
    for seq, plen in zip(sequences, prompt_lens):
        if max_len is not None:
            seq = seq[:max_len]
        lo, hi = max(plen, 1), len(seq) - 1 - k  # n = index of the verified token; need k tokens after it
        if hi < lo:
            continue
        n_seq += 1
        m = min(positions_per_sequence, hi - lo + 1)
        points = sorted({lo + round(i * (hi - lo) / max(1, m - 1)) for i in range(m)}) if m > 1 else [lo]
        aux, _ = target.forward(torch.tensor([seq[: points[-1]]]), ids, logits_to_keep=1)  # full logits of a long sequence may not fit
        g_all = drafter.combine(aux.to(device=dev, dtype=dtype))
        cache = KVCache()
        done = 0  # step-0 entries in the cache cover positions 0..done-1
        for n in points:
            # fill step-0 entries up to n-2 without probabilities, then the query at n-1 with them
            if n - 1 > done:
                pos = torch.arange(done, n - 1, device=dev).unsqueeze(0)
                drafter.forward_step(torch.tensor([seq[done + 1: n]], device=dev), g_all[:, done: n - 1], pos, cache=cache)
            o = drafter.forward_step(torch.tensor([[seq[n]]], device=dev), g_all[:, n - 1: n],
                                     torch.tensor([[n - 1]], device=dev), cache=cache, want_probs=True)
            done = n
            fed = g_all[:, n - 1]
            ok = True
            for j in range(k):
                sink, draft = _attn(o, n, sink_tokens)
                a = acc[j]
                a["count"] += 1
                a["fed_rms"] += _rms(fed)
                a["out_rms"] += _rms(o.h_feed[:, -1])
                a["sink_mass"] += sink
                a["draft_mass"] += draft
                d = int(drafter.to_target_ids(drafter.logits(o.h_post[:, -1:]).argmax(-1))[0, 0])
                ok = ok and d == seq[n + 1 + j]
                a["match"] += int(ok)
                if j == k - 1:
                    break
                fed = o.h_feed[:, -1]
                o = drafter.forward_step(torch.tensor([[d]], device=dev), o.h_feed[:, -1:],
                                         torch.tensor([[n + j]], device=dev), cache=cache, want_probs=True)
            _crop(cache, n)
            n_pos += 1
    steps = []
    for j, a in enumerate(acc):
        c = max(a["count"], 1)
        steps.append(StepDiagnostics(step=j, count=a["count"], fed_rms=a["fed_rms"] / c, out_rms=a["out_rms"] / c,
                                     sink_mass=a["sink_mass"] / c, draft_mass=a["draft_mass"] / c,
                                     match_rate=a["match"] / c))
    return DriftDiagnostics(sink_tokens=sink_tokens, num_sequences=n_seq, num_positions=n_pos, steps=steps)
