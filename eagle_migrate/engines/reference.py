"""The reference engine: chain speculative decoding in plain PyTorch (transformers target + our EagleDrafter).

It is vLLM's algorithm, step for step, so both engines count the same things:
* the drafter's step 0 runs over every newly verified position (token x_{i+1} with the target's aux states at i),
  then k - 1 chain steps feed back ``h_feed`` (``h_pre``, or ``h_post`` with ``norm_output``);
* the target verifies [x_n, d_1..d_k] in one forward with its KV cache; greedy accepts while d_i equals the target's
  argmax (the output is exactly the target's greedy output); sampling uses the standard rejection rule
  (accept d with probability min(1, p(d) / q(d)), else resample from max(0, p - q)); with vLLM's default
  ``draft_sample_method="greedy"`` q is one-hot on the drafter's argmax;
* the counters are vLLM's: drafts (verification steps), draft tokens, accepted tokens, accepted per position
  (a fully accepted last step counts in full even when max_tokens cuts its output, as vLLM's does).
Both caches are kept: the target's (transformers ``DynamicCache``, cropped to the accepted prefix) and the drafter's
(step-0 entries only; chain-step entries are dropped after each round, as vLLM overwrites them).

Drafters come from :func:`eagle_migrate.loader.load_drafter` (every layout and quantized format we read,
the target's embedding / head shared where vLLM shares them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache

from ..drafter import EagleDrafter, KVCache
from ..errors import PairingError
from ..formats.aux_ids import vllm_default_aux_ids
from ..loader import load_drafter
from ..target import load_target
from .metrics import AcceptanceStats


# ----- the engine ----------------------------------------------------------------------------------------------------
def _crop(cache: KVCache, n: int) -> None:
    for i, k in enumerate(cache.keys):
        if k is not None:
            cache.keys[i] = k[:, :, :n]
            cache.values[i] = cache.values[i][:, :, :n]


def _crop_target(cache: Any, keep: int) -> None:
    """Drop the target cache entries past ``keep`` (negative crop: the positive form is deprecated in transformers 5)."""
    extra = cache.get_seq_length() - keep
    if extra > 0:
        cache.crop(-extra)


def _eos_ids(model: Any) -> set[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        e = getattr(src, "eos_token_id", None) if src is not None else None
        if isinstance(e, int):
            ids.add(e)
        elif isinstance(e, (list, tuple)):
            ids.update(int(x) for x in e)
    return ids


def _probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    p = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sp, idx = p.sort(dim=-1, descending=True)
        keep = sp.cumsum(-1) - sp < top_p
        sp = sp * keep
        p = torch.zeros_like(p).scatter(-1, idx, sp)
        p = p / p.sum(-1, keepdim=True)
    return p


@dataclass
class GenerationResult:
    output: list[int]
    stats: AcceptanceStats
    seconds: float


class ReferenceEngine:
    """Chain speculative decoding (or plain decoding when ``drafter`` is None) of one target, one prompt at a time."""

    def __init__(self, target: Any, drafter: EagleDrafter | None = None, num_speculative_tokens: int = 3,
                 temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, draft_sample_method: str = "greedy",
                 max_model_len: int | None = None):
        self.target = target
        self.model = target.model
        self.drafter = drafter
        self.k = num_speculative_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.seed = seed
        self.draft_sample_method = draft_sample_method
        self.max_model_len = max_model_len or getattr(target.info, "max_position_embeddings", None) or 1 << 30
        self.eos = _eos_ids(self.model)
        self.device = target.device
        if drafter is not None:
            cfg = drafter.cfg
            ids = cfg.aux_layer_ids or vllm_default_aux_ids(target.info.num_layers)
            if cfg.target_hidden_size != target.info.hidden_size or cfg.vocab_size != target.info.vocab_size:
                raise PairingError(
                    f"drafter (Ht={cfg.target_hidden_size}, V={cfg.vocab_size}) does not fit the target "
                    f"(hidden {target.info.hidden_size}, vocab {target.info.vocab_size})")
            bad = [i for i in ids if not 0 <= i < target.info.num_layers]
            if bad:
                raise PairingError(f"aux layer ids {bad} are outside the target's 0..{target.info.num_layers - 1}")
            self.aux_ids = sorted(ids)
            self.dtype = next(drafter.parameters()).dtype

    # -- target ------------------------------------------------------------------------------------------------------
    def _target(self, ids: list[int], cache: Any, keep: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits of the last ``keep`` positions (all when None) and the aux states of every position."""
        x = torch.tensor([ids], device=self.device)
        kw = {"logits_to_keep": keep} if keep else {}
        out = self.model(input_ids=x, past_key_values=cache, use_cache=True,
                         output_hidden_states=self.drafter is not None, **kw)
        aux = None
        if self.drafter is not None:
            hs = out.hidden_states
            aux = torch.cat([hs[i] for i in self.aux_ids], dim=-1)
        return out.logits[0].float(), aux

    def _pick(self, logits: torch.Tensor, gen: torch.Generator | None) -> int:
        if self.temperature <= 0:
            return int(logits.argmax(-1))
        return int(torch.multinomial(_probs(logits, self.temperature, self.top_p), 1, generator=gen))

    # -- one prompt ----------------------------------------------------------------------------------------------------
    def generate(self, prompt: list[int], max_tokens: int, ignore_eos: bool = False,
                 seed: int | None = None) -> GenerationResult:
        """Decode one prompt (sampling seeded by ``seed``, default the engine's). Tiny targets (hidden < 256) run on one CPU thread: their matmuls are too small to
        split, and on a busy machine OpenMP's spinning threads made them 50x slower."""
        tiny = self.device.type == "cpu" and self.target.info.hidden_size < 256
        before = torch.get_num_threads()
        if tiny:
            torch.set_num_threads(1)
        try:
            return self._generate(prompt, max_tokens, ignore_eos, self.seed if seed is None else seed)
        finally:
            if tiny:
                torch.set_num_threads(before)

    @torch.no_grad()
    def _generate(self, prompt: list[int], max_tokens: int, ignore_eos: bool, seed: int) -> GenerationResult:
        t0 = time.perf_counter()
        gen = torch.Generator(device="cpu").manual_seed(seed) if self.temperature > 0 else None
        stats = AcceptanceStats(accepted_per_position=[0] * self.k if self.drafter is not None else [], num_prompts=1)
        tcache = DynamicCache()
        limit = min(max_tokens, self.max_model_len - len(prompt))
        logits, aux = self._target(list(prompt), tcache, keep=1)  # a long prompt's full logits would not fit
        ctx = list(prompt)
        out = [self._pick(logits[-1].cpu(), gen)]
        ctx.append(out[-1])
        if self.drafter is None:
            while len(out) < limit and (ignore_eos or out[-1] not in self.eos):
                logits, _ = self._target([ctx[-1]], tcache)
                out.append(self._pick(logits[-1].cpu(), gen))
                ctx.append(out[-1])
        else:
            dcache = KVCache()
            m = 0  # drafter step-0 entries cover positions 0..m-1
            pending = aux  # target aux states for positions m..n-1
            while len(out) < limit and (ignore_eos or out[-1] not in self.eos):
                n = len(ctx) - 1
                drafts, qs = self._draft(ctx, m, n, pending, dcache, gen)
                m = n
                logits, vaux = self._target([ctx[n], *drafts], tcache)
                a, nxt = self._verify(logits.cpu(), drafts, qs, gen)
                stats.num_drafts += 1
                stats.num_draft_tokens += len(drafts)
                stats.num_accepted_tokens += a
                for i in range(a):
                    stats.accepted_per_position[i] += 1
                _crop_target(tcache, n + a + 1)
                pending = vaux[:, : a + 1]
                new = [*drafts[:a], nxt]
                if not ignore_eos:
                    for i, t in enumerate(new):
                        if t in self.eos:
                            new = new[: i + 1]
                            break
                ctx += new
                out += new
            out = out[:limit]
        stats.num_output_tokens = len(out)
        return GenerationResult(out, stats, time.perf_counter() - t0)

    def _draft(self, ctx: list[int], m: int, n: int, pending: torch.Tensor, dcache: KVCache,
               gen: torch.Generator | None) -> tuple[list[int], list[torch.Tensor | None]]:
        d = self.drafter
        assert d is not None
        dev = next(d.parameters()).device
        g = d.combine(pending.to(device=dev, dtype=self.dtype))
        ids = torch.tensor([ctx[m + 1: n + 1]], device=dev)
        pos = torch.arange(m, n, device=dev).unsqueeze(0)
        o = d.forward_step(ids, g, pos, cache=dcache)
        feed, last = o.h_feed[:, -1:], o.h_post[:, -1:]
        drafts: list[int] = []
        qs: list[torch.Tensor | None] = []
        for j in range(self.k):
            logits = d.logits(last)[0, -1].float()
            if self.temperature > 0 and self.draft_sample_method == "probabilistic":
                q = _probs(logits, self.temperature, 1.0).cpu()
                di = int(torch.multinomial(q, 1, generator=gen))
                qs.append(q)
            else:
                di = int(logits.argmax())
                qs.append(None)
            tid = int(d.to_target_ids(torch.tensor([di], device=dev))[0])
            drafts.append(tid)
            if j == self.k - 1:
                break
            p = torch.tensor([[n + j]], device=dev)
            o = d.forward_step(torch.tensor([[tid]], device=dev), feed, p, cache=dcache)
            feed, last = o.h_feed, o.h_post
        _crop(dcache, n)
        if any(q is not None for q in qs) and d.cfg.uses_d2t:  # q over the draft vocab -> target vocab
            qs = [self._q_to_target(q) for q in qs]
        return drafts, qs

    def _q_to_target(self, q: torch.Tensor | None) -> torch.Tensor | None:
        if q is None:
            return None
        d = self.drafter
        tgt = torch.arange(q.shape[-1]) + d.d2t.cpu()
        full = torch.zeros(d.cfg.vocab_size)
        full[tgt] = q
        return full

    def _verify(self, logits: torch.Tensor, drafts: list[int], qs: list[torch.Tensor | None],
                gen: torch.Generator | None) -> tuple[int, int]:
        """(accepted count a, the next token: the correction at a, or the bonus when all were accepted)."""
        if self.temperature <= 0:
            t = logits.argmax(-1).tolist()
            a = 0
            while a < len(drafts) and drafts[a] == t[a]:
                a += 1
            return a, int(t[a])
        for i, dtok in enumerate(drafts):
            p = _probs(logits[i], self.temperature, self.top_p)
            q = qs[i]
            qd = 1.0 if q is None else float(q[dtok])
            u = float(torch.rand(1, generator=gen))
            if u < min(1.0, float(p[dtok]) / max(qd, 1e-20)):
                continue
            if q is None:
                resid = p.clone()
                resid[dtok] = 0.0
            else:
                resid = (p - q).clamp_min(0.0)
            if float(resid.sum()) <= 0:
                resid = p
            return i, int(torch.multinomial(resid / resid.sum(), 1, generator=gen))
        return len(drafts), self._pick(logits[len(drafts)], gen)


def measure(
    target: Any,
    drafters: list[str | Path | EagleDrafter | None],
    suites: dict[str, dict[str, Any]],
    *,
    num_speculative_tokens: int = 3,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    max_model_len: int | None = None,
    draft_sample_method: str = "greedy",
    progress: Any = None,
) -> list[dict[str, tuple[AcceptanceStats, dict[str, Any]]]]:
    """The reference engine's answer in vllm_engine.measure_many's shape: per drafter, {suite: (stats, extra)}.

    ``target``: a path / hub id (loaded here) or a loaded :class:`eagle_migrate.target.Target`. ``extra`` holds
    ``outputs``, ``seconds`` and, for a drafter, ``per_request``: each prompt's counters in vllm_worker's shape.
    """
    if isinstance(target, (str, Path)):
        target = load_target(str(target), device=device, dtype=dtype, with_tokenizer=False)
    results = []
    for d in drafters:
        drafter = d if isinstance(d, EagleDrafter) or d is None else load_drafter(d, target, device=device, dtype=dtype)
        eng = ReferenceEngine(target, drafter, num_speculative_tokens, temperature, top_p, seed,
                              draft_sample_method, max_model_len)
        per: dict[str, tuple[AcceptanceStats, dict[str, Any]]] = {}
        for name, s in suites.items():
            total = AcceptanceStats(accepted_per_position=[0] * num_speculative_tokens if drafter is not None else [])
            outs, secs, per_request = [], 0.0, []
            for i, p in enumerate(s["prompts"]):  # one random stream per prompt (seed, index)
                r = eng.generate(list(p), s.get("max_tokens", 64), s.get("ignore_eos", False), seed=seed * 100003 + i)
                total = total.plus(r.stats)
                per_request.append({"num_drafts": r.stats.num_drafts, "num_draft_tokens": r.stats.num_draft_tokens,
                                    "num_accepted_tokens": r.stats.num_accepted_tokens,
                                    "accepted_per_position": list(r.stats.accepted_per_position)})
                outs.append(r.output)
                secs += r.seconds
                if progress is not None:
                    progress(1)
            per[name] = (total, {"outputs": outs, "seconds": secs}
                         | ({"per_request": per_request} if drafter is not None else {}))
        results.append(per)
    return results
