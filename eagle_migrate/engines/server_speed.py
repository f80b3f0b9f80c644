"""Serving speed of a speculative server against a baseline server (``validate --baseline-server``): streaming load
runs at each concurrency, both servers in alternation, per-user output tokens/s, TTFT, ITL and TPOT percentiles.
Imports: errors, engines.{server_models, server_client}."""

from __future__ import annotations

import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

from ..errors import InputError
from .server_client import ServerClient
from .server_models import LatencyStats, LoadRun, ServingSpeed, SpeedLevel


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    i = (len(s) - 1) * q
    lo, hi = math.floor(i), math.ceil(i)
    return s[lo] + (s[hi] - s[lo]) * (i - lo)


def _lat(xs: list[float]) -> LatencyStats:
    ms = [x * 1000.0 for x in xs]
    return LatencyStats(p50=round(_pct(ms, 0.5), 3), p90=round(_pct(ms, 0.9), 3), p99=round(_pct(ms, 0.99), 3),
                        mean=round(sum(ms) / len(ms), 3) if ms else 0.0)


def load_run(client: ServerClient, prompts: list[Sequence[int]], concurrency: int, max_tokens: int, *,
             seed: int = 0) -> LoadRun:
    """``len(prompts)`` streaming requests from ``concurrency`` users (each sends its next request when the last
    one finished), greedy, ``ignore_eos`` so every request generates ``max_tokens``."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        timings = list(pool.map(lambda p: client.stream(p, max_tokens, seed=seed, ignore_eos=True), prompts))
    wall = time.perf_counter() - t0
    toks = sum(t.output_tokens for t in timings)
    per_user = [t.output_tokens / t.latency for t in timings if t.latency > 0]
    tpot = [(t.latency - t.ttft) / (t.output_tokens - 1) for t in timings if t.output_tokens > 1]
    return LoadRun(requests=len(timings), output_tokens=toks, seconds=round(wall, 3),
                   per_user_tokens_per_second=round(statistics.median(per_user), 3) if per_user else 0.0,
                   output_tokens_per_second=round(toks / wall, 3) if wall > 0 else 0.0,
                   ttft_ms=_lat([t.ttft for t in timings]), itl_ms=_lat([g for t in timings for g in t.gaps]),
                   tpot_ms=_lat(tpot))


def serving_speed(spec: ServerClient, base: ServerClient, prompts: list[Sequence[int]], *, concurrency: list[int],
                  max_tokens: int, rounds: int = 3, requests_per_user: int = 2, seed: int = 0,
                  log: Callable[[str], None] | None = None) -> ServingSpeed:
    """Per concurrency C: ``rounds`` rounds, each one load run on each server (the order alternates round by round,
    so drift of the machine hits both), ``max(C * requests_per_user, 4)`` requests cycling through ``prompts``;
    the speed-up of a round is the ratio of the median per-user output tokens/s."""
    say = log or (lambda m: None)
    if not prompts:
        raise InputError("no prompts for the speed measurement")
    levels, per_run = [], {}
    for c in concurrency:
        n = max(c * requests_per_user, 4)
        per_run[c] = n
        batch = [prompts[i % len(prompts)] for i in range(n)]
        load_run(spec, batch[:min(c, n)], c, min(8, max_tokens), seed=seed)  # warm both (first-request effects)
        load_run(base, batch[:min(c, n)], c, min(8, max_tokens), seed=seed)
        sp, bs, ratios = [], [], []
        for r in range(rounds):
            order = ((spec, sp), (base, bs)) if r % 2 == 0 else ((base, bs), (spec, sp))
            for cl, acc in order:
                acc.append(load_run(cl, batch, c, max_tokens, seed=seed))
            ratios.append(round(sp[-1].per_user_tokens_per_second / bs[-1].per_user_tokens_per_second, 4)
                          if bs[-1].per_user_tokens_per_second else float("nan"))
        se = statistics.stdev(ratios) / math.sqrt(len(ratios)) if len(ratios) > 1 else None
        lvl = SpeedLevel(concurrency=c, rounds=rounds, speculative=sp, baseline=bs, ratios=ratios,
                         speedup=round(statistics.median(ratios), 4), speedup_min=min(ratios), speedup_max=max(ratios),
                         speedup_se=None if se is None else round(se, 4))
        say(f"speed: C={c}: per-user tokens/s {statistics.median([x.per_user_tokens_per_second for x in sp]):.1f} vs "
            f"{statistics.median([x.per_user_tokens_per_second for x in bs]):.1f} -> {lvl.speedup:.3f}x "
            f"(rounds {', '.join(f'{x:.3f}' for x in ratios)})")
        levels.append(lvl)
    return ServingSpeed(baseline_url=base.url, max_tokens=max_tokens, requests_per_run=per_run, levels=levels)
