"""Calibration sequences: the token-id sequences convert (target statistics), quantize (activation scales) and
calibrate (training) use, from any prompt source: whole conversations where they carry the assistant's replies.
May import: errors, sources, templates, drift (torch lazily)."""

from __future__ import annotations

import operator
import os
from collections.abc import Sequence
from typing import Any

from ..errors import DataError
from . import sources as _src  # seams looked up at call time (see __init__)
from .drift import DRIFT_KINDS, drift_sequences
from .templates import ByteTokenizer, render


def calibration_sequences(spec: str | os.PathLike | Sequence[Sequence[int]] | None, tokenizer: Any, vocab_size: int,
                          n: int, max_len: int, seed: int = 0, fetch: bool | None = None) -> list[list[int]]:
    """Token-id sequences for target statistics and calibration (convert, quantize, calibrate share this one).

    ``spec``: any source :func:`~.sources.load_conversations` reads (``None`` = the built-in chat set, a JSONL/JSON file,
    ``sharegpt``, ``humaneval``, ``hf:...``; ``limit=n, seed=seed`` are passed on, so a big source is sampled, never
    read whole; ShareGPT from record ``SUITE_POOL`` on, past what validate's suites sample), ``drift`` /
    ``drift:KIND,KIND`` (:func:`~.drift.drift_sequences`: long code and packed chat of 1k-4k tokens, other
    templates and system prompts, plain chat; never a suite's text), or a list of token-id lists (the first ``n``,
    as given). Conversations that end with an assistant
    reply are rendered whole (prompt + replies, no generation prompt: statistics and calibration want hidden states
    of response text); requests without a reply are rendered with the generation prompt. ``tokenizer`` None (a
    tokenizer-less toy target): :class:`ByteTokenizer` over ``vocab_size``. Each sequence is cut to ``max_len``
    tokens; shorter than 3 are dropped. DataError when none is left or a token id is outside the vocabulary.
    """
    if isinstance(spec, (list, tuple)):
        where = "the token-id sequences given"
        try:
            seqs = [[operator.index(t) for t in x] for x in spec[:n]]
        except TypeError:
            raise DataError(f"{where}: expected a list of token-id lists (integers)") from None
    elif str(spec).split(":")[0] == "drift":
        where = str(spec)
        tok = tokenizer if tokenizer is not None else ByteTokenizer(vocab_size)
        kinds = tuple(k for k in str(spec).partition(":")[2].split(",") if k) or DRIFT_KINDS
        f = _src._fetch_default() if fetch is None else fetch
        seqs = [d.ids for d in drift_sequences(tok, n, seed, kinds=kinds, fetch=f)]
    else:
        where = "builtin:chat" if spec is None else str(spec)
        tok = tokenizer if tokenizer is not None else ByteTokenizer(vocab_size)
        seqs = [render(c, tok, whole=c.ends_with_reply)
                for c in _src.load_conversations(spec, limit=n, seed=seed, fetch=fetch, training=True)]
    for s in seqs:
        bad = next((t for t in s if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise DataError(f"{where}: token id {bad} is outside the target's vocabulary (0..{vocab_size - 1})",
                            "token_ids must come from the target's own tokenizer")
    seqs = [s[:max_len] for s in seqs]
    seqs = [s for s in seqs if len(s) >= 3]
    if not seqs:
        raise DataError(f"{where}: no calibration sequence of 3 tokens or more",
                        "pass prompts, chat conversations or token_ids records of 3+ tokens (--data)")
    return seqs


def random_sequences(vocab_size: int, n: int, length: int, seed: int) -> list[list[int]]:
    """``n`` seeded uniformly random token-id sequences of ``length`` tokens: what convert measures a tokenizer-less
    (toy) target on when no ``--data`` is given (its statistics need no text)."""
    import torch  # lazy: corpora imports no torch (prompts and suites need none)

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (length,), generator=g).tolist() for _ in range(n)]
