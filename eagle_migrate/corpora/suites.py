"""The validation suites: named prompt sets as token ids (chat, code, template-shift, long, a prompts file), each
fingerprinted by :func:`prompt_set_hash`. Every selection is deterministic for a seed.
May import: errors, sources, templates, long."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DataError, a_an
from . import sources as _src  # seams looked up at call time (see __init__)
from .long import LONG_BUCKETS, _bucket_key, _long
from .sources import (
    Conversation,
    _fetch_default,
    _humaneval_conv,
    _iter_jsonl,
    _read_records,
    _sample,
)
from .templates import SHIFT_VARIANTS, ByteTokenizer, render

SUITE_NAMES = ("chat", "code", "long", "template-shift")


@dataclass
class Suite:
    """A named prompt set as token ids. ``groups`` labels each prompt (context bucket, template variant)."""

    name: str
    prompts: list[list[int]]
    max_tokens: int
    description: str
    size: int
    groups: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    token_fallback: bool = False

    @property
    def hash(self) -> str:
        return prompt_set_hash(self.prompts)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    def by_group(self) -> dict[str, list[list[int]]]:
        out: dict[str, list[list[int]]] = {}
        for g, p in zip(self.groups or [self.name] * len(self.prompts), self.prompts):
            out.setdefault(g, []).append(p)
        return out

    def manifest(self) -> dict[str, Any]:
        """What the report records about the prompt set."""
        return {"name": self.name, "size": self.size, "max_tokens": self.max_tokens, "hash": self.hash,
                "prompt_tokens": self.prompt_tokens, "groups": sorted(set(self.groups)) if self.groups else [],
                "sources": sorted(set(self.sources)), "token_fallback": self.token_fallback,
                "description": self.description}


def prompt_set_hash(prompts: list[list[int]]) -> str:
    h = hashlib.sha256()
    for p in prompts:
        h.update(json.dumps(p, separators=(",", ":")).encode())
        h.update(b"\n")
    return "sha256:" + h.hexdigest()[:16]


DEFAULT_SIZES = {"chat": 16, "code": 16, "long": 2, "template-shift": 2, "prompts": None}  # long: per bucket; shift: requests
DEFAULT_MAX_TOKENS = {"chat": 128, "code": 128, "long": 64, "template-shift": 128, "prompts": 128}


def _tok_or_bytes(tokenizer: Any, target_info: Any) -> tuple[Any, bool]:
    if tokenizer is not None:
        return tokenizer, False
    vocab = getattr(target_info, "vocab_size", None)
    if vocab is None:
        raise DataError("a tokenizer-less target needs its vocab_size for token-id prompts")
    return ByteTokenizer(int(vocab)), True


def _max_context(target_info: Any, max_model_len: int | None) -> int:
    lim = getattr(target_info, "max_position_embeddings", None) or 8192
    if max_model_len:
        lim = min(lim, max_model_len)
    return int(lim)


def suite(name: str, tokenizer: Any, target_info: Any = None, *, num_prompts: int | None = None,
          max_tokens: int | None = None, seed: int = 0, max_model_len: int | None = None,
          prompts_file: str | os.PathLike | None = None, fetch: bool | None = None,
          long_buckets: tuple[int, ...] = LONG_BUCKETS, long_kinds: tuple[str, ...] = ("pydoc",)) -> Suite:
    """Build suite ``name`` (chat, code, long, template-shift, or ``prompts`` with ``prompts_file``).

    ``num_prompts``: prompts (chat, code, prompts), prompts per bucket (long), requests rendered under every variant
    (template-shift). Prompts that would not fit ``max_model_len`` (or the target's max positions) with
    ``max_tokens`` of output are dropped. ``long_kinds``: what the long prompts are, taken round-robin within each
    bucket (see :data:`LONG_KINDS`; the default, ``pydoc`` alone, is the suite validate and calibrate use).
    """
    fetch = _fetch_default() if fetch is None else fetch
    tok, fallback = _tok_or_bytes(tokenizer, target_info)
    n = num_prompts if num_prompts is not None else DEFAULT_SIZES.get(name)
    mt = max_tokens if max_tokens is not None else DEFAULT_MAX_TOKENS.get(name, 128)
    ctx = _max_context(target_info, max_model_len)
    budget = ctx - mt - 1
    if budget < 8:
        raise DataError(f"max_tokens={mt} leaves no room for prompts in {a_an(ctx)}-token context")
    if name == "chat":
        convs = _chat_convs(n or 16, seed, fetch)
        prompts, groups, sources = _render_all(convs, tok, budget)
        desc = "multi-turn chat requests (built-in set" + (" + ShareGPT V3 sample)" if "sharegpt" in sources else ")")
    elif name == "code":
        convs = _code_convs(n or 16, seed, fetch)
        prompts, groups, sources = _render_all(convs, tok, budget)
        desc = "coding requests (" + ("HumanEval" if "humaneval" in sources else "built-in code set") + ")"
    elif name == "template-shift":
        prompts, groups, sources = _template_shift(n or 2, seed, tok, budget)
        desc = (f"{n or 2} chat requests under {len(SHIFT_VARIANTS)} template / system-prompt variants "
                "(other chat templates, unusual system prompts)")
    elif name == "long":
        prompts, groups, sources = _long(n or 2, seed, tok, budget, long_buckets, long_kinds, fetch)
        what = "document questions" if tuple(long_kinds) == ("pydoc",) else "prompts (" + ", ".join(long_kinds) + ")"
        desc = f"long-context {what} in buckets " + ", ".join(sorted(set(groups), key=_bucket_key))
    elif name == "prompts":
        if prompts_file is None:
            raise DataError("suite 'prompts' needs a prompts file (--prompts FILE)")
        convs = _src.load_conversations(prompts_file, limit=n, seed=seed, fetch=fetch)
        prompts, groups, sources = _render_all(convs, tok, budget)
        desc = f"user prompts from {Path(str(prompts_file)).name}"
    else:
        raise DataError(f"unknown suite '{name}'", f"choose from {', '.join(SUITE_NAMES)} or pass --prompts FILE")
    if not prompts:
        raise DataError(f"suite '{name}': no prompt fits {a_an(ctx)}-token context with {mt} output tokens",
                        "raise --max-model-len or lower --max-tokens")
    if fallback:
        desc += "; token-id prompts (tokenizer-less target: UTF-8 bytes mod vocab)"
    return Suite(name, prompts, mt, desc, len(prompts), groups, sources, fallback)


def suites(names: list[str], tokenizer: Any, target_info: Any = None, **kw: Any) -> list[Suite]:
    return [suite(n, tokenizer, target_info, **kw) for n in names]


def _render_all(convs: list[Conversation], tok: Any, budget: int, **kw: Any) -> tuple[list[list[int]], list[str], list[str]]:
    prompts, groups, sources = [], [], []
    for c in convs:
        ids = render(c, tok, **kw)
        if 0 < len(ids) <= budget:
            prompts.append(ids)
            groups.append(c.source.split(":")[0] if c.source else "prompts")
            sources.append(c.source.split(":")[0] if c.source else "")
    return prompts, groups, sources


def _chat_convs(n: int, seed: int, fetch: bool) -> list[Conversation]:
    builtin = _src.load_conversations(None)
    sg = _src.sharegpt_file(fetch)
    if sg is None:
        return _repeat_to(builtin, n, seed)
    n_sg = n // 2
    n_bi = n - n_sg
    # ShareGPT: keep requests of moderate length (a long one belongs to the long suite)
    pool = [c for c in _read_records(sg, "sharegpt", cap=_src.SUITE_POOL) if 20 <= len(c.text) <= 3000]
    return _sample(builtin, n_bi, seed) + _sample(pool, n_sg, seed)


def _code_convs(n: int, seed: int, fetch: bool) -> list[Conversation]:
    he = _src.humaneval_file(fetch)
    if he is not None:
        return _sample([_humaneval_conv(o) for o in _iter_jsonl(he)], n, seed)
    return _repeat_to(_src.load_conversations("builtin:code"), n, seed)


def _repeat_to(items: list[Conversation], n: int, seed: int) -> list[Conversation]:
    if n <= len(items):
        return _sample(items, n, seed)
    return (items * (n // len(items) + 1))[:n]


def _template_shift(n: int, seed: int, tok: Any, budget: int) -> tuple[list[list[int]], list[str], list[str]]:
    reqs = _sample(_src.load_conversations(None), n, seed + 1)
    prompts, groups, sources = [], [], []
    for label, tmpl, sysp in SHIFT_VARIANTS:
        for c in reqs:
            ids = render(c, tok, template_variant=tmpl, system_prompt=sysp)
            if len(ids) <= budget:
                prompts.append(ids)
                groups.append(label)
                sources.append("builtin")
    return prompts, groups, sources
