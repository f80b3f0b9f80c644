"""The long-context suite's prompts: real text (Python's language reference, standard-library sources, packed
multi-turn chats) cut to token buckets, never filler. May import: errors, sources, templates."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from ..errors import DataError
from . import sources as _src  # seams looked up at call time (see __init__)
from .sources import Conversation, _read_records, _sample
from .templates import ByteTokenizer, _encode, render

LONG_BUCKETS = (1024, 2048, 4096, 8192)
LONG_QUESTIONS = [
    "Summarize the main points of the documentation above in a few sentences.",
    "Which rules described above would a beginner most likely get wrong? Explain briefly.",
    "Write three quiz questions, with answers, that test understanding of the text above.",
    "Explain the most important idea in the text above to someone who has never programmed.",
]


def long_document() -> str:
    """A long real document available offline: Python's own language-reference topics (``pydoc_data``)."""
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip pydoc_data: fall back to the stdlib's own source text
        import argparse
        import difflib
        import textwrap

        return "\n\n".join(Path(m.__file__).read_text(encoding="utf-8") for m in (argparse, difflib, textwrap))
    return "\n\n".join(f"{k}\n{'=' * len(k)}\n{v.strip()}" for k, v in sorted(topics.items()))


def _bucket_label(tokens: int) -> str:
    """1024 -> "1k", 7680 -> "7.5k" (multiples of 512), any other size as itself."""
    if tokens % 1024 == 0:
        return f"{tokens // 1024}k"
    return f"{tokens // 1024}.5k" if tokens % 512 == 0 and tokens > 1024 else str(tokens)


def _bucket_key(label: str) -> int:
    return int(float(label[:-1]) * 1024) if label.endswith("k") else int(label)


# What a long prompt can be (``suite("long", ..., long_kinds=...)``); every kind is real text the target continues
# sensibly, never filler:
# * ``pydoc``: an excerpt of Python's language-reference topics + a question about it (the default suite).
# * ``stdlib``: the head of a large Python standard-library module's source (the files of this Python, whatever the
#   machine), cut at a line end, + a question about the code.
# * ``chat``: a packed multi-turn conversation: consecutive ShareGPT conversations (the built-in chat set when
#   ShareGPT is not available) merged turn by turn into one chat, ending at a user turn; the target answers it.
LONG_KINDS = ("pydoc", "stdlib", "chat")
STDLIB_MODULES = ("argparse", "ast", "datetime", "difflib", "enum", "inspect", "optparse", "pickle", "subprocess",
                  "tarfile", "typing", "zipfile")
CODE_QUESTIONS = [
    "Explain what the last complete function or class above does and how it fits into the rest of the module.",
    "List the main public functions and classes defined above, with one sentence on what each is for.",
    "Which parts of the code above would be hardest to test? Explain briefly.",
]


def stdlib_sources(modules: tuple[str, ...] = STDLIB_MODULES) -> list[tuple[str, str]]:
    """(module, source text) of ``modules`` (default :data:`STDLIB_MODULES`, the long suite's) found in this
    Python's standard-library folder."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for m in modules:
        f = root / f"{m}.py"
        if f.is_file():
            out.append((m, f.read_text(encoding="utf-8", errors="replace")))
    return out


def _long(per_bucket: int, seed: int, tok: Any, budget: int, buckets: tuple[int, ...],
          kinds: tuple[str, ...] = ("pydoc",), fetch: bool = False) -> tuple[list[list[int]], list[str], list[str]]:
    bad = [k for k in kinds if k not in LONG_KINDS]
    if bad or not kinds:
        raise DataError(f"unknown long-context kind '{(bad or ['(none)'])[0]}'", f"choose from {', '.join(LONG_KINDS)}")
    use = [b for b in buckets if b <= budget]
    labels = {b: _bucket_label(b) for b in use}
    if len(use) < len(buckets) and (not use or budget - max(use) >= 256):
        # the first bucket that does not fit is kept, capped at the context: labelled by its nominal size when the cap
        # is within 10 % of it (4031 -> "4k"), else by its real size (4542 is not "8k")
        nominal = min(b for b in buckets if b > budget)
        labels[budget] = _bucket_label(nominal) if use and budget >= 0.9 * nominal else str(budget)
        use.append(budget)
    rng = random.Random(seed)  # pydoc offsets (the default suite's stream, unchanged)
    lazy: dict[str, Any] = {}
    prompts, groups, sources = [], [], []
    for b in use:
        for j in range(per_bucket):
            kind = kinds[j % len(kinds)]
            nth = j // len(kinds)  # the how-many-th prompt of this kind in this bucket
            if kind == "pydoc":
                if "pydoc" not in lazy:
                    lazy["pydoc"] = _encode(tok, long_document())
                full = _long_pydoc(tok, lazy["pydoc"], b, LONG_QUESTIONS[(j + b) % len(LONG_QUESTIONS)], rng)
                src = "pydoc"
            elif kind == "stdlib":
                if "stdlib" not in lazy:
                    lazy["stdlib"] = stdlib_sources()
                mods = lazy["stdlib"]
                if not mods:
                    continue
                mod, text = mods[random.Random(f"{seed}:stdlib:{b}:{nth}").randrange(len(mods))]
                full = _long_stdlib(tok, mod, text, b, CODE_QUESTIONS[(nth + b) % len(CODE_QUESTIONS)])
                src = f"stdlib:{mod}"
            else:
                if "chat" not in lazy:
                    lazy["chat"] = _long_chat_pool(seed, fetch)
                full, src = _long_packed_chat(tok, lazy["chat"], b, random.Random(f"{seed}:chat:{b}:{nth}"))
            if full is None or (kind != "pydoc" and len(full) < 0.5 * b):  # too short for its bucket: left out
                continue
            prompts.append(full[:b])
            groups.append(labels[b])
            sources.append(src)
    return prompts, groups, sources


def _long_pydoc(tok: Any, doc_ids: list[int], b: int, q: str, rng: random.Random) -> list[int] | None:
    shell = Conversation([{"role": "user", "content": "Read this documentation excerpt.\n\n{DOC}\n\n" + q}])
    overhead = len(render(shell, tok)) - len(_encode(tok, "{DOC}"))
    room = b - overhead
    if room <= 16:
        return None
    start = rng.randrange(0, max(1, len(doc_ids) - room))
    ids = doc_ids[start:start + room]
    if isinstance(tok, ByteTokenizer):  # byte fallback: the ids are the text
        conv_ids = render(Conversation([{"role": "user", "content": "Read this documentation excerpt.\n\n"}]), tok, add_generation_prompt=False)
        return conv_ids + ids + _encode(tok, "\n\n" + q + "\n") + _encode(tok, "Assistant:")
    full = render(Conversation([{"role": "user", "content": shell.messages[0]["content"].replace("{DOC}", tok.decode(ids))}]), tok)
    while len(full) > b and len(ids) > 16:  # decode/encode round trips can grow by a few tokens
        ids = ids[: len(ids) - (len(full) - b) - 1]
        full = render(Conversation([{"role": "user", "content": shell.messages[0]["content"].replace("{DOC}", tok.decode(ids))}]), tok)
    return full


def _fit_text(tok: Any, make: Any, text: str, b: int) -> list[int] | None:
    """The longest prefix of ``text``, cut at a line end, whose rendered prompt ``make(prefix)`` fits ``b`` tokens."""
    lines = text.splitlines(keepends=True)
    ends = [0]
    for ln in lines:
        ends.append(ends[-1] + len(ln))
    lo, hi, best = 1, len(lines), None  # binary search on the number of whole lines kept
    while lo <= hi:
        mid = (lo + hi) // 2
        ids = make(text[: ends[mid]])
        if len(ids) <= b:
            best, lo = ids, mid + 1
        else:
            hi = mid - 1
    return best


def _long_stdlib(tok: Any, mod: str, text: str, b: int, q: str) -> list[int] | None:
    def make(code: str) -> list[int]:
        msg = f"Here is the beginning of the source of Python's `{mod}` module.\n\n```python\n{code}```\n\n{q}"
        return render(Conversation([{"role": "user", "content": msg}]), tok)

    return _fit_text(tok, make, text, b)


def _long_chat_pool(seed: int, fetch: bool) -> tuple[list[Conversation], str]:
    """Multi-turn conversations to pack: a seeded ShareGPT sample (else the built-in chat set)."""
    sg = _src.sharegpt_file(fetch)
    if sg is None:
        return _src.load_conversations(None), "builtin"
    pool = [c for c in _read_records(sg, "sharegpt", cap=_src.SUITE_POOL)
            if len(c.messages) >= 2 and not any(m["role"] == "system" for m in c.messages)]
    return _sample(pool, min(len(pool), 600), seed + 7), "sharegpt"


def _long_packed_chat(tok: Any, pool: tuple[list[Conversation], str], b: int,
                      rng: random.Random) -> tuple[list[int] | None, str]:
    """Consecutive conversations of ``pool`` from a seeded start, merged into one chat of user/assistant turns that
    ends at a user turn: as many whole turns as fit ``b`` tokens with the generation prompt."""
    best: list[int] | None = None
    for _ in range(8):  # a few seeded starts: the first that fills 90 % of the bucket, else the longest
        ids = _pack_from(tok, pool[0], b, rng.randrange(len(pool[0])))
        if ids is not None and (best is None or len(ids) > len(best)):
            best = ids
        if best is not None and len(best) >= 0.9 * b:
            break
    return best, f"{pool[1]}-packed"


def _pack_from(tok: Any, convs: list[Conversation], b: int, start: int) -> list[int] | None:
    turns: list[dict[str, str]] = []
    for i in range(len(convs)):
        for m in convs[(start + i) % len(convs)].messages:
            if m["role"] == "system":
                continue
            if turns and turns[-1]["role"] == m["role"]:  # keep strict alternation across conversation seams
                turns[-1] = {"role": m["role"], "content": turns[-1]["content"] + "\n\n" + m["content"]}
            else:
                turns.append(dict(m))
        if sum(len(t["content"]) for t in turns) > 6 * b:  # plenty of text for b tokens (>= ~1.5 chars a token)
            break
    user_ends = [i + 1 for i, t in enumerate(turns) if t["role"] == "user"]
    best = None
    lo, hi = 0, len(user_ends) - 1
    while lo <= hi:  # the most turns (ending at a user turn) that fit
        mid = (lo + hi) // 2
        ids = render(Conversation(turns[: user_ends[mid]]), tok)
        if len(ids) <= b:
            best, lo = ids, mid + 1
        else:
            hi = mid - 1
    return best
