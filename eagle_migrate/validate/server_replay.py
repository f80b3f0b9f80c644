"""The triage's replay (``validate --server URL --prompts traffic.jsonl --triage``): the team's own requests sent to a
running vLLM server, and each request's acceptance counters.

The prompts are read by ``corpora`` (JSONL ``{prompt}`` / ``{messages}`` / ``{conversations}`` / ``{token_ids}``,
errors naming the line) and rendered by the server before anything is measured: a chat request by its chat template
(``/tokenize`` with messages, what ``/v1/chat/completions`` applies), a plain prompt as ``/v1/completions`` tokenises
it, token ids as they are. A model without a chat template (a base model) gets its chats as plain transcripts, said in
one line. A prompt that does not fit the server's context with ``--max-tokens`` is refused before any request, by its
line. Each request then goes to ``/v1/completions`` as token ids (greedy, ``--max-tokens``).

Where the server returns per-request metrics (vLLM >= 0.32 started with ``--per-request-spec-decode-metrics
summary|detailed``: ``metrics.speculative_decoding`` in the response), the requests are replayed at ``--concurrency``
and each request's counters are the server's own; the sums are checked against ``/metrics``' difference over the
run. Where it does not, that is said in one line and the requests are sent one at a time, each measured from the
``/metrics`` difference around it alone (slower, exact; other traffic is refused as ``validate --server`` refuses
it). The first request, sent alone, tells which. A server that stops answering ends the
replay: what was measured before is kept and reported, with the error. Progress: a line every 10 s.
``--report DIR`` writes the report as ``DIR/triage.json``. ``--compare OLD/triage.json``: the old report's groups
before and after on the requests that pair (``triage_compare.py``; a file of other prompts is refused before any
request is sent).
Imports: errors, corpora, formats.output, engines.{metrics, options, server, server_client, server_tokenizer},
validate.{report, triage, triage_compare}.
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import BaseModel, Field

from ..corpora import Conversation, load_conversations, render_text
from ..engines.metrics import AcceptanceStats
from ..engines.options import ValidateOptions
from ..engines.server import check_block, describe, server_key, settle
from ..engines.server_client import Completion, ServerClient
from ..engines.server_tokenizer import chat_refusal
from ..errors import EagleMigrateError, EngineError, InputError, ServerError
from ..formats.output import atomic_write_text, check_no_overlap
from .report import ServerInfo
from .triage import (
    GroupAL,
    Pooled,
    TriagedRequest,
    WorstFiles,
    features,
    group_requests,
    histogram_of,
    length_group,
    prompt_hash,
    write_worst,
)
from .triage_compare import TriageComparison, check_pairs, compare, read_before

DEFAULT_MAX_TOKENS = 64
PROGRESS_SECONDS = 10.0
SETTLE_SECONDS = 30.0  # how long /metrics may lag the last response
NO_PER_REQUEST = ("the server returns no per-request spec-decode metrics (start it with "
                  "--per-request-spec-decode-metrics summary, vLLM >= 0.32): measuring the requests one at a time "
                  "from /metrics differences (slower, exact)")


class TriageReport(BaseModel):
    """A triage: the server, how the requests were measured, each request, the pool, the groups, the worst files."""

    server: ServerInfo
    prompts_file: str
    per_request: str = Field(..., description="response (the server's per-request metrics) or metrics (/metrics "
                                              "differences, one request at a time)")
    notes: list[str] = Field(default_factory=list, description="the one-line notes said during the run")
    concurrency: int
    max_tokens: int
    k: int
    records: int = Field(..., description="usable records in the file")
    requests: list[TriagedRequest] = Field(default_factory=list)
    pooled: Pooled = Field(default_factory=Pooled)
    groups: list[GroupAL] = Field(default_factory=list)
    below: list[str] = Field(default_factory=list, description="the groups below the pool beyond noise, in words")
    min_acceptance_length: Optional[float] = None
    below_floor: Optional[int] = Field(None, description="requests whose AL is under --min-acceptance-length")
    metrics_check: Optional[dict[str, Any]] = Field(None, description="per-request sums against /metrics' "
                                                                      "difference over the run")
    complete: bool = True
    error: Optional[str] = None
    error_hint: Optional[str] = None
    seconds: float = 0.0
    worst: Optional[WorstFiles] = None
    passed: bool = True
    failures: list[str] = Field(default_factory=list)
    comparison: Optional[TriageComparison] = Field(None, description="--compare: the old report's groups before and "
                                                                     "after, paired by request")


@dataclass
class _Prepared:
    conv: Conversation
    ids: list[int]
    base: TriagedRequest


def triage_server(opts: ValidateOptions, log: Callable[[str], None] | None = None,
                  clock: Callable[[], float] = time.monotonic) -> TriageReport:
    """Replay ``opts.prompts_file`` on ``opts.server`` and triage it (module docstring); ``opts.worst``: write the
    worst requests. A server that drops mid-run gives a report with ``complete`` false and ``error`` set."""
    say = log or (lambda m: None)
    if opts.server is None or opts.prompts_file is None:
        raise InputError("a triage needs --server URL and --prompts FILE",
                         "eagle-migrate validate --server URL --prompts traffic.jsonl --triage")
    t0 = clock()
    if opts.report_dir is not None:
        check_no_overlap(Path(opts.report_dir), [opts.prompts_file, opts.compare], what="--report")
    convs = load_conversations(opts.prompts_file, limit=opts.num_prompts, seed=opts.seed, fetch=False)
    before = None if opts.compare is None else read_before(opts.compare)
    if before is not None:
        check_pairs(before, convs, opts.compare, opts.prompts_file)
    conc = max(int(c) for c in opts.concurrency) if opts.concurrency else 1
    if conc < 1:
        raise InputError("--concurrency needs positive integers, e.g. 4")
    max_tokens = opts.max_tokens or DEFAULT_MAX_TOKENS
    with ServerClient(opts.server, server_key(opts), max_connections=max(conc, 4)) as client:
        info, _ = describe(client, k=opts.k)
        k = int(info.speculative_config["num_speculative_tokens"])
        notes: list[str] = []
        note = lambda m: (notes.append(m), say(m))  # noqa: E731
        prepared = prepare(client, convs, str(opts.prompts_file), max_tokens, info.max_model_len, conc, note)
        say(f"triage: {len(prepared)} requests on {info.url} (vLLM {info.vllm_version or '?'}, k={k}), "
            f"{max_tokens} output tokens each, at concurrency {conc}")
        rep = Replay(client, k, max_tokens, opts.temperature, opts.seed, say, clock)
        rep.run(prepared, conc, note)
    reqs = [rep.done[i] for i in sorted(rep.done)]
    pooled, groups = group_requests(reqs)
    out = TriageReport(server=info, prompts_file=str(opts.prompts_file), per_request=rep.mode, notes=notes,
                       concurrency=conc if rep.mode == "response" else 1, max_tokens=max_tokens, k=k,
                       records=len(convs), requests=reqs, pooled=pooled, groups=groups,
                       below=[g.text for g in groups if g.named], metrics_check=rep.check,
                       complete=rep.error is None and len(reqs) == len(prepared), error=rep.error,
                       error_hint=rep.error_hint, seconds=round(clock() - t0, 2))
    if opts.worst is not None and reqs:
        n, path = opts.worst
        out.worst = write_worst(reqs, groups, convs, int(n), path, inputs=[opts.prompts_file])
        say(f"triage: wrote {out.worst.records} prompts to {out.worst.file} and {out.worst.heldout_records} held out "
            f"to {out.worst.heldout_file}")
    if before is not None:
        out.comparison = compare(before, reqs, opts.compare)
        say(f"triage: compared with {opts.compare}: {out.comparison.paired} requests paired, "
            f"{out.comparison.only_before} only before, {out.comparison.only_after} only after")
    _gates(out, opts.min_acceptance_length)
    if opts.report_dir is not None:
        Path(opts.report_dir).mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(opts.report_dir) / "triage.json", out.model_dump_json(indent=2) + "\n")
        say(f"triage: wrote {Path(opts.report_dir) / 'triage.json'}")
    return out


def _gates(out: TriageReport, floor: float | None) -> None:
    """--min-acceptance-length: the pooled AL must reach it; the requests under it are counted."""
    out.min_acceptance_length = floor
    if floor is None:
        return
    out.below_floor = sum(1 for r in out.requests if r.acceptance_length is not None and r.acceptance_length < floor)
    al = out.pooled.acceptance_length
    if al is not None and al < floor:
        out.failures.append(f"pooled AL {al:.3f} < --min-acceptance-length {floor:g}")
        out.passed = False


def prepare(client: ServerClient, convs: list[Conversation], where: str, max_tokens: int, max_model_len: int | None,
            conc: int, note: Callable[[str], None]) -> list[_Prepared]:
    """Each request's token ids as the server renders it, and its features; refuses (by line) a text prompt the
    server cannot tokenise and a prompt that does not fit the server's context with ``max_tokens``."""
    chats = any(c.token_ids is None and c.shape != "prompt" for c in convs)
    refused = chat_refusal(client) if chats else None
    if refused is not None:
        note(f"the server's model has no chat template ({refused}): chat requests sent as plain prompts (a plain "
             "transcript of their messages)")

    def one(i: int) -> _Prepared:
        c = convs[i]
        try:
            if c.token_ids is not None:
                ids, how = list(c.token_ids), "token ids"
            elif c.shape == "prompt":
                ids, how = client.tokenize_text(c.messages[0]["content"], add_special_tokens=True), "plain prompt"
            elif refused is None:
                ids, how = client.tokenize_messages(c.prompt_messages()), "chat template"
            else:
                ids = client.tokenize_text(render_text(c, None, "plain"), add_special_tokens=True)
                how = "plain transcript (no chat template)"
        except EngineError as e:
            raise ServerError(f"{where}: line {c.line}: the server cannot tokenise this text prompt ({e.message})",
                              "serve the model with its tokenizer, or pass token ids ({\"token_ids\": [...]})") from None
        base = TriagedRequest(index=i, line=c.line, id=c.id, prompt_hash=prompt_hash(c), **features(c, how))
        return _Prepared(c, ids, base)

    with ThreadPoolExecutor(max_workers=max(1, min(conc, 8))) as pool:
        prepared = list(pool.map(one, range(len(convs))))
    if max_model_len:
        long_ = [p for p in prepared if len(p.ids) + max_tokens > max_model_len]
        if long_:
            p = long_[0]
            more = f" (and {len(long_) - 1} more: lines {', '.join(str(x.conv.line) for x in long_[1:6])}" \
                   f"{', ...' if len(long_) > 6 else ''})" if len(long_) > 1 else ""
            raise InputError(f"{where}: line {p.conv.line}: the prompt has {len(p.ids)} tokens; with --max-tokens "
                             f"{max_tokens} it exceeds the server's context of {max_model_len} tokens{more}",
                             "drop or shorten those lines, or lower --max-tokens")
    return prepared


class Replay:
    """The requests sent and measured (module docstring); ``done``: index -> measured request, kept on a drop."""

    def __init__(self, client: ServerClient, k: int, max_tokens: int, temperature: float, seed: int,
                 say: Callable[[str], None], clock: Callable[[], float]):
        self.client, self.k, self.max_tokens, self.temperature, self.seed = client, k, max_tokens, temperature, seed
        self.say, self.clock = say, clock
        self.done: dict[int, TriagedRequest] = {}
        self.mode = "metrics"
        self.error: str | None = None
        self.error_hint: str | None = None
        self.check: dict[str, Any] | None = None

    def _send(self, p: _Prepared) -> Completion:
        return self.client.complete(p.ids, self.max_tokens, temperature=self.temperature, seed=self.seed)

    def run(self, prepared: list[_Prepared], conc: int, note: Callable[[str], None]) -> None:
        if not prepared:
            return
        self._exc: EagleMigrateError | None = None
        self._run(prepared, conc, note)
        if self._exc is not None:  # said once everything that finished is counted
            e = self._exc
            self.error = f"the replay stopped after {len(self.done)} of {self.total} requests: {e.message}"
            self.error_hint = e.hint
            self.say("warning: " + self.error + " (what was measured before is kept)")

    def _run(self, prepared: list[_Prepared], conc: int, note: Callable[[str], None]) -> None:
        self.t0 = self.t_tick = self.clock()
        self.total = len(prepared)
        try:
            start = self.client.metrics()
            after = self._alone(prepared[0], start)
        except EagleMigrateError as e:
            return self._stopped(e)
        if self.mode == "metrics":
            note(NO_PER_REQUEST)
            try:
                for p in prepared[1:]:
                    after = self._alone(p, after)
                    self._tick()
            except EagleMigrateError as e:
                self._stopped(e)
            return
        self._concurrent(prepared[1:], conc)
        if self._exc is None:
            self._check_totals(start)

    def _alone(self, p: _Prepared, before: Any) -> Any:
        """One request alone: from its response when it carries per-request metrics (other traffic does not matter
        then), else from /metrics around it (refused when other traffic moved the counters)."""
        comp = self._send(p)
        if comp.spec is not None:
            self.mode = "response"
            self.done[p.base.index] = self._from_response(p, comp)
            return before
        after = settle(self.client, before, 1)
        self.done[p.base.index] = self._from_stats(p, comp, check_block(before, after, 1, [comp]))
        return after

    def _concurrent(self, rest: list[_Prepared], conc: int) -> None:
        pool = ThreadPoolExecutor(max_workers=max(1, conc))
        pending: dict[Future, _Prepared] = {pool.submit(self._send, p): p for p in rest}
        try:
            while pending:
                finished, _ = wait(pending, timeout=PROGRESS_SECONDS, return_when=FIRST_COMPLETED)
                for f in finished:
                    p = pending.pop(f)
                    comp = f.result()
                    if comp.spec is None:
                        raise ServerError("a response came without metrics.speculative_decoding after the first had "
                                          "it (another server behind the URL?)", "replay against one server")
                    self.done[p.base.index] = self._from_response(p, comp)
                self._tick()
        except EagleMigrateError as e:
            self._stopped(e)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            for f, p in pending.items():  # finished while stopping: measured all the same
                if f.done() and not f.cancelled() and f.exception() is None and f.result().spec is not None:
                    self.done[p.base.index] = self._from_response(p, f.result())

    def _from_response(self, p: _Prepared, comp: Completion) -> TriagedRequest:
        s = comp.spec or {}
        hist = [int(x) for x in s.get("acceptance_histogram") or []]
        drafts = int(s.get("num_spec_steps", sum(hist)))
        return p.base.model_copy(update=dict(
            length=length_group(comp.prompt_tokens), prompt_tokens=comp.prompt_tokens,
            output_tokens=comp.completion_tokens, num_drafts=drafts,
            num_draft_tokens=int(s.get("num_draft_tokens", 0)),
            num_accepted_tokens=int(s.get("num_accepted_draft_tokens", sum(j * c for j, c in enumerate(hist)))),
            histogram=hist, acceptance_length=float(s["mean_acceptance_length"]) if drafts else None,
            source="response"))

    def _from_stats(self, p: _Prepared, comp: Completion, d: AcceptanceStats) -> TriagedRequest:
        return p.base.model_copy(update=dict(
            length=length_group(comp.prompt_tokens), prompt_tokens=comp.prompt_tokens,
            output_tokens=comp.completion_tokens, num_drafts=d.num_drafts, num_draft_tokens=d.num_draft_tokens,
            num_accepted_tokens=d.num_accepted_tokens,
            histogram=histogram_of(d.num_drafts, d.accepted_per_position, self.k),
            acceptance_length=1 + d.num_accepted_tokens / d.num_drafts if d.num_drafts else None, source="metrics"))

    def _tick(self) -> None:
        now = self.clock()
        if now - self.t_tick >= PROGRESS_SECONDS:
            self.t_tick = now
            self.say(f"triage: {len(self.done)}/{self.total} requests measured, {now - self.t0:.0f} s")

    def _stopped(self, e: EagleMigrateError) -> None:
        self._exc = self._exc or e

    def _check_totals(self, start: Any) -> None:
        """The per-request sums against /metrics' difference over the run (equal unless other traffic moved it)."""
        t_end = self.clock() + SETTLE_SECONDS
        try:
            end = self.client.metrics()
            while end.requests - start.requests < len(self.done) and self.clock() < t_end:
                time.sleep(0.05)  # vLLM records a request's stats just after its response
                end = self.client.metrics()
        except EagleMigrateError as e:
            self.check = {"checked": False, "why": e.message}
            return
        if start.spec is None or end.spec is None:
            self.check = {"checked": False, "why": "no spec-decode counters in /metrics"}
            return
        d = end.spec.minus(start.spec)
        reqs = list(self.done.values())
        ours = {"requests": len(reqs), "num_drafts": sum(r.num_drafts for r in reqs),
                "num_draft_tokens": sum(r.num_draft_tokens for r in reqs),
                "num_accepted_tokens": sum(r.num_accepted_tokens for r in reqs)}
        theirs = {"requests": round(end.requests - start.requests), "num_drafts": d.num_drafts,
                  "num_draft_tokens": d.num_draft_tokens, "num_accepted_tokens": d.num_accepted_tokens}
        self.check = {"checked": True, "per_request_sum": ours, "metrics_difference": theirs,
                      "equal": ours == theirs}
        if ours != theirs:
            self.say("warning: the per-request counters do not sum to /metrics' difference over the run "
                     f"({ours} against {theirs}): other traffic on this server?")
