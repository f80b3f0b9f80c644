"""Which requests lose acceptance: per-request AL grouped by what the requests are, and the prompts to recalibrate on.

A triage (``validate --server URL --prompts traffic.jsonl --triage``; the replay is ``server_replay.py``'s) gives
every request of the team's own traffic its acceptance counters (:class:`TriagedRequest`: drafts, accepted draft
tokens, the histogram of accepted tokens per draft, AL) and its features:

* ``length``: the prompt's tokens as the server counted them, in buckets (:data:`LENGTH_EDGES`: under 512, 512 to
  2k, 2k to 8k, over 8k);
* ``template``: how the prompt reached the model (the server's chat template; a plain prompt; a plain transcript
  where the model has no chat template; token ids);
* ``system``: the system prompt, by a short hash and its first words (or none);
* ``kind``: a coarse kind of text (:func:`kind_of`: code, prose, or another language / script; documented rule);
* ``tenant``: the record's ``tenant`` field, when the file has one.

:func:`group_requests` gives the pooled AL and each group's AL +- SE (the request is the unit: ``ratio_se``) and names
a group below the pool beyond noise when its AL is below the rest's by more than ``z`` standard errors of that
difference (group and rest are disjoint sets of requests, so their SEs add in quadrature); it reads as "prompts of 2k
to 8k tokens: AL 1.31 +- 0.04 against 1.62 pooled". Features overlap (every long prompt may also be a plain prompt): a
group below only through another one's requests is marked as explained by it, not named. :func:`write_worst` writes
the N lowest-AL requests and every request of a group below the pool as a JSONL that ``convert --data`` reads
(corpora/sources.py's shapes), and a held-out part beside it (``FILE.heldout.jsonl``) for the judge, split by
convert's own rule (corpora/traffic.py: ``convert --data FILE`` judges on exactly that part): a prompt is on one side
only, duplicates included. Imports: errors, corpora (Conversation, the traffic split), formats.output,
engines.metrics.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, Field

from ..corpora import Conversation, content_key, heldout_path, split_traffic
from ..engines.metrics import ratio_se
from ..errors import InputError
from ..formats.output import atomic_write_text, check_no_overlap

LENGTH_EDGES = (512, 2048, 8192)  # prompt-token buckets of the length feature
TRIAGE_Z = 3.0  # a group is below the pool when below the rest by more than this many SE (many groups are tested)
FEATURES = ("length", "template", "system", "kind", "tenant")
_ENGLISH = frozenset("the a an and or of to in is are was be it that this for with on as you i we what how why can "
                     "please do not your my me from at by if".split())
_CODE_LINE = re.compile(r"^\s*(def |class |import |from \S+ import|#include|function |return\b|public |private |"
                        r"const |let |var |fn |func |package |SELECT |for\s*\(|if\s*\(|while\s*\(|@\w+)|[;{}]\s*$|=>")


class TriagedRequest(BaseModel):
    """One replayed request: where it is in the file, its features and its acceptance counters."""

    index: int = Field(..., description="its position among the file's usable records (0-based)")
    line: int = Field(0, description="its line in the JSONL file (0: a JSON list)")
    id: str = ""
    prompt_hash: str = Field("", description="sha256 (16 hex) of the prompt's record as convert --data reads it "
                                             "(prompt_hash): with line, what pairs a request across two triages")
    length: str = ""
    template: str = ""
    system: Optional[str] = None
    kind: str = ""
    tenant: Optional[str] = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    histogram: list[int] = Field(default_factory=list, description="drafts that accepted exactly j tokens, j = 0..k")
    acceptance_length: Optional[float] = Field(None, description="1 + accepted / drafts (None: no draft)")
    source: str = Field("response", description="response (metrics.speculative_decoding) or metrics (/metrics "
                                                "differences around this request alone)")

    def feature(self, name: str) -> str | None:
        v = getattr(self, name)
        return "no system prompt" if name == "system" and v is None else (None if v is None else str(v))


class GroupAL(BaseModel):
    """The requests sharing one value of one feature, against the pool."""

    feature: str
    name: str
    requests: int
    acceptance_length: float
    se: Optional[float] = None
    rest_acceptance_length: Optional[float] = None
    diff_se: Optional[float] = Field(None, description="SE of (group AL - rest AL)")
    z: Optional[float] = None
    below: bool = False
    explained_by: Optional[str] = Field(None, description="a group named before it (feature: name) without whose "
                                                          "requests this one is not below the rest: a confound")
    text: str = ""

    @property
    def named(self) -> bool:
        """Below the pool beyond noise and not explained by another group."""
        return self.below and self.explained_by is None


class Pooled(BaseModel):
    requests: int = 0
    with_drafts: int = 0
    acceptance_length: Optional[float] = None
    se: Optional[float] = None


class WorstFiles(BaseModel):
    file: str
    heldout_file: str
    records: int
    heldout_records: int
    lowest: int = Field(..., description="the N lowest-AL requests asked for (--worst N)")
    from_groups: list[str] = Field(default_factory=list, description="the groups below the pool whose requests were added")


def al_of(reqs: list[TriagedRequest]) -> tuple[float | None, float | None]:
    """(AL, SE) of requests pooled: 1 + sum(accepted) / sum(drafts), the SE across requests (``ratio_se``)."""
    d = [r.num_drafts for r in reqs]
    if sum(d) <= 0:
        return None, None
    a = [r.num_accepted_tokens for r in reqs]
    return 1.0 + sum(a) / sum(d), ratio_se(a, d)


def length_group(n: int) -> str:
    if n < LENGTH_EDGES[0]:
        return f"prompts under {LENGTH_EDGES[0]} tokens"
    for lo, hi in zip(LENGTH_EDGES, LENGTH_EDGES[1:]):
        if n < hi:
            return f"prompts of {_k(lo)} to {_k(hi)} tokens"
    return f"prompts over {_k(LENGTH_EDGES[-1])} tokens"


def _k(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 and n >= 1024 else str(n)


def kind_of(text: str) -> str:
    """A coarse kind of a prompt's text, by a documented rule (docs/triage.md): ``language: SCRIPT`` when more than
    30 % of its letters are outside the Latin script (the script named by Unicode: cyrillic, cjk, arabic, ...);
    ``code`` when it holds a fenced block or 30 % of its non-empty lines look like code (keywords, braces,
    semicolons); ``language: other (latin script)`` when it has 8 words or more and under 5 % of them are common
    English words; ``prose`` otherwise."""
    letters = [c for c in text if c.isalpha()]
    if letters:
        scripts = Counter(unicodedata.name(c, "UNKNOWN ?").split(" ")[0] for c in letters)
        latin = scripts.pop("LATIN", 0)
        if scripts and 1 - latin / len(letters) > 0.3:
            return f"language: {scripts.most_common(1)[0][0].lower()}"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if "```" in text or (lines and sum(bool(_CODE_LINE.search(ln)) for ln in lines) >= 0.3 * len(lines)):
        return "code"
    words = re.findall(r"[^\W\d_]+", text.lower())
    if len(words) >= 8 and sum(w in _ENGLISH for w in words) < 0.05 * len(words):
        return "language: other (latin script)"
    return "prose"


def system_label(conv: Conversation) -> str | None:
    """The request's system prompt as a group name: a short hash and its first words; None without one."""
    sys_ = next((m["content"] for m in conv.messages if m["role"] == "system"), None)
    if sys_ is None:
        return None
    head = " ".join(sys_.split())[:32]
    return f"system prompt {hashlib.sha256(sys_.encode()).hexdigest()[:8]} \"{head}{'...' if len(sys_) > 32 else ''}\""


def features(conv: Conversation, template: str) -> dict[str, Any]:
    """The features known before the request is sent (its length comes from the server)."""
    text = conv.text if conv.token_ids is None else ""
    return {"template": template, "system": system_label(conv),
            "kind": kind_of(text) if conv.token_ids is None else "token ids (no text)", "tenant": conv.tenant}


def _compare(mine: list[TriagedRequest], rest: list[TriagedRequest], z: float) -> tuple[float | None, bool]:
    """(z of mine's AL - rest's AL, below beyond ``z`` SE) for disjoint sets of requests."""
    g_al, g_se = al_of(mine)
    r_al, r_se = al_of(rest)
    if g_al is None or r_al is None or g_se is None or r_se is None:
        return None, False
    se, diff = (g_se ** 2 + r_se ** 2) ** 0.5, g_al - r_al
    zz = diff / se if se > 0 else (0.0 if diff == 0 else float("-inf") if diff < 0 else float("inf"))
    return zz, diff < 0 and zz < -z


def group_requests(reqs: list[TriagedRequest], z: float = TRIAGE_Z) -> tuple[Pooled, list[GroupAL]]:
    """The pooled AL and every group's (each value of each feature with two requests or more, when the feature has
    two values or more), each marked below the pool when below the rest beyond ``z`` SE. Groups below are named
    most extreme first; one that is no longer below once the requests of the groups named before it are set aside
    is marked ``explained_by`` the first of them (a confound: plain prompts that are below only because the long
    prompts are plain). The ones below first."""
    drafted = [r for r in reqs if r.num_drafts > 0]
    al, se = al_of(drafted)
    pooled = Pooled(requests=len(reqs), with_drafts=len(drafted), acceptance_length=al, se=se)
    groups: list[GroupAL] = []
    if al is None:
        return pooled, groups
    for feat in FEATURES:
        values = sorted({r.feature(feat) for r in drafted if r.feature(feat) is not None})
        if len(values) < 2:
            continue
        for v in values:
            mine = [r for r in drafted if r.feature(feat) == v]
            rest = [r for r in drafted if r.feature(feat) != v]
            g_al, g_se = al_of(mine)
            r_al, r_se = al_of(rest)
            g = GroupAL(feature=feat, name=v, requests=len(mine), acceptance_length=round(g_al, 4),
                        se=None if g_se is None else round(g_se, 4),
                        rest_acceptance_length=None if r_al is None else round(r_al, 4))
            if g_se is not None and r_se is not None:
                g.diff_se = round((g_se ** 2 + r_se ** 2) ** 0.5, 4)
                zz, g.below = _compare(mine, rest, z)
                g.z = None if zz is None else round(zz, 2)
            g.text = (f"{v}: AL {g_al:.2f}" + (f" +- {g_se:.2f}" if g_se is not None else " (one request: no SE)")
                      + f" against {al:.2f} pooled ({len(mine)} requests)")
            groups.append(g)
    _explain(drafted, groups, z)
    groups.sort(key=lambda g: (not g.named, not g.below, g.feature != "length", g.acceptance_length))
    return pooled, groups


def _explain(drafted: list[TriagedRequest], groups: list[GroupAL], z: float) -> None:
    """Mark each group below that a group named before it explains (module docstring, group_requests)."""
    named: list[GroupAL] = []
    for g in sorted((g for g in groups if g.below), key=lambda g: (g.z, g.acceptance_length)):
        def inside(r: TriagedRequest, gs: list[GroupAL]) -> bool:
            return any(r.feature(n.feature) == n.name for n in gs)

        for n in named:
            left = [r for r in drafted if not inside(r, [n])]
            _, still = _compare([r for r in left if r.feature(g.feature) == g.name],
                                [r for r in left if r.feature(g.feature) != g.name], z)
            if not still:
                g.explained_by = f"{n.feature}: {n.name}"
                g.text += f" (explained by {n.name}: not below without its requests)"
                break
        else:
            named.append(g)


def prompt_record(conv: Conversation) -> dict[str, Any]:
    """The request as a record ``convert --data`` (corpora/sources.py) reads: its token ids, its plain prompt, or
    its chat messages."""
    if conv.token_ids is not None:
        return {"token_ids": list(conv.token_ids)}
    if conv.shape == "prompt":
        return {"prompt": conv.messages[0]["content"]}
    return {"messages": [dict(m) for m in conv.prompt_messages()]}


def prompt_hash(conv: Conversation) -> str:
    """A short hash of the request's prompt (its :func:`prompt_record`, canonical JSON): the same prompt in two
    runs has the same hash, whatever server renders it (``--compare`` pairs requests by line and this)."""
    rec = json.dumps(prompt_record(conv), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(rec.encode()).hexdigest()[:16]


def select_worst(reqs: list[TriagedRequest], groups: list[GroupAL], n: int) -> tuple[list[TriagedRequest], list[str]]:
    """The ``n`` lowest-AL requests (ties by line) and every request of a group below the pool, each once, lowest
    AL first; and the names of those groups."""
    drafted = sorted((r for r in reqs if r.acceptance_length is not None), key=lambda r: (r.acceptance_length, r.index))
    chosen = {r.index: r for r in drafted[:max(0, n)]}
    below = [g for g in groups if g.named]
    for g in below:
        for r in drafted:
            if r.feature(g.feature) == g.name:
                chosen.setdefault(r.index, r)
    return sorted(chosen.values(), key=lambda r: (r.acceptance_length, r.index)), [f"{g.feature}: {g.name}" for g in below]


def write_worst(reqs: list[TriagedRequest], groups: list[GroupAL], convs: list[Conversation], n: int,
                path: str | Path, inputs: list[Any] = ()) -> WorstFiles:
    """Write the worst requests (:func:`select_worst`) to ``path`` and their held-out part to
    :func:`heldout_path`, each file atomically; one JSON object a line: the prompt's record, its ``id`` and the AL
    it had (``al``: not read by ``convert --data``). Refuses a path that is one of ``inputs``."""
    path = Path(path)
    held_path = heldout_path(path)
    for p in (path, held_path):
        check_no_overlap(p, list(inputs), what="--worst")
    if not path.parent.is_dir():
        raise InputError(f"--worst {path}: the folder {path.parent} does not exist")
    chosen, from_groups = select_worst(reqs, groups, n)
    records = [(r, prompt_record(convs[r.index])) for r in chosen]
    _, judged = split_traffic([convs[r.index] for r in chosen])  # convert's own rule: it judges on exactly these
    held_keys = {content_key(c) for c in judged}
    is_held = [content_key(convs[r.index]) in held_keys for r in chosen]
    train = [x for x, h in zip(records, is_held) if not h]
    held = [x for x, h in zip(records, is_held) if h]

    def lines(rows: list[tuple[TriagedRequest, dict[str, Any]]]) -> str:
        return "".join(json.dumps({**rec, "id": r.id or str(r.line), "al": r.acceptance_length},
                                  ensure_ascii=False) + "\n" for r, rec in rows)

    atomic_write_text(path, lines(train))
    atomic_write_text(held_path, lines(held))
    return WorstFiles(file=str(path), heldout_file=str(held_path), records=len(train), heldout_records=len(held),
                      lowest=n, from_groups=from_groups)


def histogram_of(drafts: int, per_position: list[int], k: int) -> list[int]:
    """Drafts that accepted exactly j tokens (j = 0..k), from /metrics' counters: acceptance stops at the first
    rejected token, so the drafts accepting j or more are ``per_position[j - 1]`` (all drafts for j = 0)."""
    at_least = [drafts] + [int(x) for x in per_position] + [0] * (k - len(per_position))
    return [at_least[j] - (at_least[j + 1] if j < k else 0) for j in range(k + 1)]
