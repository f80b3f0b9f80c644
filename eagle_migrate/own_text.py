"""The target's own text, where vLLM drafts (issue 49): prompts from the data, each followed by the target's own greedy
continuation (:class:`~eagle_migrate.judge.HeldoutSequence`), and the step-0 positions of such a sequence where vLLM
drafts: those whose fed token is the target's own greedy token, i.e. the continuation's. The aux-id and
``norm_before_residual`` measurements (:mod:`eagle_migrate.aux_evidence`) score step 0 there alone: a drafter whose
first draft comes from the aux states is right on the target's text and can be confidently wrong on anybody else's.

Layer: beside ``judge``: imports corpora, judge (HeldoutSequence, greedy_continuations), target (a type),
``engines.in_process`` (a large target's continuations are made by the vLLM engine).
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from .corpora import calibration_sequences
from .engines.in_process import get_engine  # light: vLLM itself runs in its worker process, never imported here
from .judge import HeldoutSequence, greedy_continuations

if TYPE_CHECKING:  # pragma: no cover
    from .target import LazyTarget

# a measured sequence: a prompt of PROMPT_TOKENS tokens from the data (its first tokens; a shorter one as it is), then
# the target's own greedy continuation of CONTINUATION_TOKENS tokens, scored alone. The continuations are made
# GENERATE_BATCH at a time, enough for the first three looks in one generate call: a decode step reads every weight
# once, so it costs little more for 16 sequences than for 8 (SmolLM2-135M on one core of the 2-core box: 0.12 s a step
# for 8 sequences, 0.29 s for 32), while the prefill and the scoring forward cost per token.
PROMPT_TOKENS = 48
CONTINUATION_TOKENS = 40
MIN_CONTINUATION = 8
GENERATE_BATCH = 16
# the measurement's budget of sequences (aux_evidence.LOOKS[-1]): the prompts made at most
BUDGET_SEQUENCES = 64
# a target at least this large makes its continuations in vLLM where vLLM is importable: transformers' generate
# reads every weight at each decode step, which costs seconds a step for a multi-billion-parameter model on a CPU,
# while vLLM's start is paid once for all the sequences a measurement wants
VLLM_MIN_PARAMS = 1_000_000_000
# (not a small target whose measurement reads many: SmolLM2-135M's 128 sequences of convert's fit measurement took
# 105 s with the continuations in vLLM, its start included, and 98 s in transformers' generate, 32 a call, on the
# 2-core box: benchmarks/retarget/fit_time.py, docs/benchmarks.md "The fixed part of convert")
VLLM_ENGINE = "vllm"  # the engine that makes them (engines/in_process.py)
FALLBACK_ENGINE = "auto"  # asked for them: vLLM, or None with a warning when vLLM fails (transformers then)


_MADE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {key: (sequences made, their source)}


def measurement_sequences(target: LazyTarget, data: Any, seed: int, first: list[list[int]] | None = None,
                          max_length: int = 512, batch: int = GENERATE_BATCH,
                          want: int = BUDGET_SEQUENCES) -> Iterator[HeldoutSequence]:
    """The measured sequences: prompts, each continued greedily by the target (:func:`continued`). The prompts are the
    first :data:`PROMPT_TOKENS` tokens of ``first`` (convert: the statistics pass's sequences), then of more
    sequences from the same data up to the budget; a tokenizer-less target without data: random first tokens. When
    the data runs out before the budget (a small data set), prompts made from what was measured: a measured sequence
    cut at a random point, one token there replaced at random (:func:`_perturbed`), until the budget is reached.
    Made once per target and arguments: a second measurement on them (``norm_before_residual`` after the aux ids)
    replays what the first made before the target generates more, ``batch`` prompts a generate call from then on
    (a measurement that reads many asks for more at a time: a decode step costs little more for 32 than for 16).
    ``want``: the sequences the caller reads at most; the data gives that many prompts (at least the budget: real
    text before perturbed prompts), and a large target (:func:`in_vllm`) makes all that are still wanted in one vLLM
    call (:func:`continued`)."""
    key = json.dumps([data if isinstance(data, (list, tuple)) else str(data), seed, first, max_length], default=str)
    entry = _MADE.setdefault(target, {}).get(key)
    if entry is None:
        entry = _MADE[target][key] = {"made": [], "batch": batch, "want": want}
        entry["source"] = _made(target, data, seed, first, max_length, lambda: entry["batch"], lambda: entry["want"])
    entry["batch"] = batch
    entry["want"] = max(entry["want"], want)
    made, source = entry["made"], entry["source"]
    i = 0
    while True:
        if i == len(made):
            nxt = next(source, None)
            if nxt is None:
                return
            made.append(nxt)
        yield made[i]
        i += 1


def _made(target: LazyTarget, data: Any, seed: int, first: list[list[int]] | None, max_length: int,
          batch: Callable[[], int], want: Callable[[], int] = lambda: BUDGET_SEQUENCES) -> Iterator[HeldoutSequence]:
    """:func:`measurement_sequences`' sequences as the target makes them, ``batch()`` prompts a generate call;
    ``want()``: the sequences the callers read at most so far (it grows when a later measurement reads more)."""
    seen: set[tuple[int, ...]] = set()
    have: list[list[int]] = []
    plen = max(1, min(PROMPT_TOKENS, max_length - MIN_CONTINUATION))
    new = max(MIN_CONTINUATION, min(CONTINUATION_TOKENS, max_length - 1))

    def prompts() -> Iterator[list[int]]:
        for s in first or []:
            yield list(s[:plen])
        if data is None and target.tokenizer is None:
            g = torch.Generator().manual_seed(seed)
            yield from torch.randint(0, target.info.vocab_size, (BUDGET_SEQUENCES, 1), generator=g).tolist()
            return
        drawn = 0
        while (n := max(BUDGET_SEQUENCES, want())) > drawn:  # more when a later measurement wants more (fresh() dedups)
            for s in calibration_sequences(data, target.tokenizer, target.info.vocab_size, n, max_length, seed):
                yield list(s[:plen])
            drawn = n

    def in_one_call() -> int:
        """The prompts the next vLLM call continues (what is still wanted), or 0: transformers' generate."""
        return max(max(BUDGET_SEQUENCES, want()) - len(have), 1) if in_vllm(target) else 0

    def fresh(ps: Iterable[list[int]]) -> Iterator[list[int]]:
        for p in ps:
            if len(p) >= 1 and tuple(p) not in seen:
                seen.add(tuple(p))
                yield p

    for h in continued(target, fresh(prompts()), new, batch, in_one_call):
        have.append(h.ids)
        yield h
    if have:
        yield from continued(target, fresh(_perturbed(target, have, seed)), new, batch, in_one_call)


def approx_params(info: Any) -> int:
    """The target's parameter count, from its config alone (decoder layers' attention and MLP, embedding and head)."""
    h, n, v = info.hidden_size, info.num_layers, info.vocab_size
    inter = int(info.raw.get("intermediate_size") or 4 * h)
    return n * (4 * h * h + 3 * h * inter) + 2 * v * h


def in_vllm(target: LazyTarget) -> bool:
    """Whether the continuations are made in vLLM: a target of at least :data:`VLLM_MIN_PARAMS` parameters, where vLLM
    is importable in this Python (else transformers' generate, whatever the size)."""
    if approx_params(target.info) < VLLM_MIN_PARAMS:
        return False
    return get_engine(VLLM_ENGINE).available()


def continued(target: LazyTarget, prompts: Iterable[list[int]], new_tokens: int,
              batch: int | Callable[[], int] = GENERATE_BATCH,
              in_one_call: Callable[[], int] | None = None) -> Iterator[HeldoutSequence]:
    """``prompts`` continued greedily by the target, each as prompt + continuation of ``new_tokens`` (one shorter
    than :data:`MIN_CONTINUATION` is left out), made only as the caller asks for more: transformers' generate with
    its KV cache, ``batch`` prompts a call; in vLLM (its start costs more than a batch) as many as ``in_one_call()``
    says (asked anew for every call; 0: transformers), by default a large target's (:func:`in_vllm`) whole budget."""
    if in_one_call is None:
        in_one_call = (lambda: BUDGET_SEQUENCES) if in_vllm(target) else (lambda: 0)
    it = iter(prompts)
    while True:
        size = batch() if callable(batch) else batch  # asked anew for every call: the caller may change it
        n_vllm = in_one_call()
        vllm = n_vllm > 0
        chunk = [p for _, p in zip(range(n_vllm if vllm else size), it)]
        if not chunk:
            return
        # the continuation runs its full length (ignore_eos): a target that ends its answers early (a toy whose
        # greedy text reaches its end-of-sequence id) still measures; a position where the suppressed
        # end-of-sequence token was the greedy one is not scored (drafted_positions)
        made = _vllm_continuations(target, chunk, new_tokens) if vllm else None
        if made is None:  # transformers (or vLLM failed: said, and the rest made here too)
            if vllm:
                in_one_call = lambda: 0  # noqa: E731
            made = greedy_continuations(target.loaded, chunk, new_tokens, batch=size, ignore_eos=True)
        for h in made:
            if len(h.ids) - h.prompt_len >= MIN_CONTINUATION:
                yield h


def _vllm_continuations(target: LazyTarget, prompts: list[list[int]], new_tokens: int) -> list[HeldoutSequence] | None:
    """``prompts`` continued greedily by the target served in vLLM (no drafter), in the target's dtype, token ids in
    and out; None, with the ``auto`` engine's warning, when vLLM fails (the caller's transformers makes them: slower,
    the same text but for near-ties)."""
    longest = max(len(p) for p in prompts) + new_tokens
    made = get_engine(FALLBACK_ENGINE).continuations(str(target.spec), {"own": prompts}, new_tokens,
                                                     dtype=str(target.dtype).replace("torch.", ""),
                                                     max_model_len=longest + 16, ignore_eos=True,
                                                     skip_tokenizer_init=True)
    if made is None:
        return None
    return [HeldoutSequence(list(p) + list(o), len(p)) for p, o in zip(prompts, made["own"])]


def _perturbed(target: LazyTarget, have: list[list[int]], seed: int,
               tries: int = 4 * BUDGET_SEQUENCES) -> Iterator[list[int]]:
    """Prompts made from the measured sequences ``have`` (grows as the caller measures): one of them cut at a random
    point (at least 2 tokens kept), the token there replaced by a random one; at most ``tries``."""
    g = torch.Generator().manual_seed(seed + 7919)
    for _ in range(tries):
        base = have[int(torch.randint(len(have), (1,), generator=g))]
        cut = int(torch.randint(2, max(3, len(base) - MIN_CONTINUATION), (1,), generator=g))
        p = list(base[:cut])
        p[-1] = int(torch.randint(target.info.vocab_size, (1,), generator=g))
        yield p


def drafted_positions(h: HeldoutSequence, nxt: torch.Tensor) -> torch.Tensor:
    """bool [T-1]: the step-0 positions of ``h`` where vLLM drafts. Position i feeds token ids[i+1] with the aux
    states of position i: drafted when ids[i+1] is the target's own greedy token there (``nxt`` [T], the target's
    greedy next token at each position, from the same forward), i.e. in the continuation (i >= prompt_len - 1)."""
    ids = torch.tensor(h.ids)
    t = len(h.ids)
    pos = torch.arange(t - 1)
    return (pos >= h.prompt_len - 1) & (ids[1:] == nxt[: t - 1])


