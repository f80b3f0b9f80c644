"""A file of served prompts split into what trains and what the judge holds out, one rule for both sides: the
triage's ``--worst FILE`` writes the split (``FILE`` and :func:`heldout_path` beside it) and ``convert --data FILE``
judges on exactly that held-out part when it is there, else splits ``FILE`` by the same rule (:func:`split_traffic`).
A prompt's identity is its content (:func:`content_key`), so every copy of a held-out prompt is held out, whatever
the file's order. Imports: nothing of this package (a Conversation is taken as it comes).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TRAFFIC_HELDOUT = 0.15  # the share of a file's prompts held out (by content hash)
TRAFFIC_MIN_HELDOUT = 4  # held out at least this many (the smallest hashes), while at least as many are left to train


def content_key(conv: Any) -> str:
    """A prompt's identity by content: sha256 of its token ids, else of its messages as the target is asked them (the
    reply the target must write is left out)."""
    what = conv.token_ids if conv.token_ids is not None else conv.prompt_messages()
    return hashlib.sha256(json.dumps(what, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def split_traffic(convs: Sequence[Any], fraction: float = TRAFFIC_HELDOUT,
                  min_heldout: int = TRAFFIC_MIN_HELDOUT) -> tuple[list[Any], list[Any]]:
    """(trained on, held out): a conversation is held out when its :func:`content_key` read as a number in [0, 1) is
    below ``fraction``; when that holds out fewer than ``min_heldout`` distinct prompts, the distinct prompts of the
    smallest keys are (at most half of them). Every copy of a held-out prompt is held out."""
    keys = [content_key(c) for c in convs]
    distinct = sorted(set(keys))
    held = {k for k in distinct if int(k[:13], 16) / 16**13 < fraction}
    want = min(min_heldout, len(distinct) // 2)
    if len(held) < want:
        held = set(distinct[:want])
    return ([c for c, k in zip(convs, keys) if k not in held], [c for c, k in zip(convs, keys) if k in held])


def heldout_path(path: str | Path) -> Path:
    """``worst.jsonl`` -> ``worst.heldout.jsonl`` (beside it): a traffic file's held-out part."""
    p = Path(path)
    return p.with_name((p.name[: -len(".jsonl")] if p.name.endswith(".jsonl") else p.name) + ".heldout.jsonl")
