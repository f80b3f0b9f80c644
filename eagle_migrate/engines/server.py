"""The server engine: acceptance length and serving speed of a running OpenAI-compatible vLLM server.

``validate --server URL`` sends the suites' token-id prompts to ``/v1/completions`` (greedy, fixed max tokens) in
blocks, and reads vLLM's Prometheus counters from ``/metrics`` (parsed by ``prometheus_client``'s text parser)
before and after each block: the difference is that block's drafts, draft tokens, accepted tokens and accepted per
position. A block whose request / generated-token / prompt-token counters moved by more than what was sent is
refused (other traffic). Each suite's AL is the sum of its blocks' counters, its standard error the ratio
estimator's across blocks. ``--baseline-server URL`` adds per-user output throughput, TTFT and inter-token latency
at each concurrency, speculative and baseline server measured in alternation.

The engine is registered as ``server`` (``engines/registry.py``) beside the in-process ones: a
:class:`ServerSession` says what the suites are built with (the target's tokenizer, or the server's own), measures
them block by block and adds the block standard errors and the serving speed; the suites, gates and report are the
validation's own (``api.run_validation``), the same code as in-process; ``api.validate_server`` is the keyword form.
The server's HTTP API and metrics are ``server_client.py``'s, the speed runs ``server_speed.py``'s, the URL-only
tokenisation ``server_tokenizer.py``'s. Imports: errors, target (lazily: torch), corpora, formats,
engines.{registry, in_process (aux ids), metrics, options, server_models, server_client, server_speed,
server_tokenizer}.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..corpora import load_conversations, render
from ..errors import InputError, ServerError
from ..formats.io import open_checkpoint_path, sha256_files
from ..formats.output import check_no_overlap
from .in_process import aux_ids_status
from .metrics import AcceptanceStats, ratio_se
from .options import ValidateOptions
from .registry import Engine, Measured, Session, register_engine
from .server_client import (  # noqa: F401  (re-exported: the engine's public names live here)
    PER_POSITION,
    SPEC_COUNTERS,
    SPEC_PREFIX,
    TRAFFIC_COUNTERS,
    Completion,
    Scrape,
    ServerClient,
    StreamTiming,
    _split_url,
    api_key_from_env,
    check_metric_names,
    parse_metrics,
)
from .server_models import ServerInfo
from .server_speed import load_run, serving_speed  # noqa: F401
from .server_tokenizer import ServedModel, ServerTokenizer, drafter_record

_SETTLE_SECONDS = 30.0  # how long the counters may lag the last response (vLLM records stats after streaming it)


# ----- the server's description ------------------------------------------------------------------------------------
def describe(client: ServerClient, *, drafter: str | None = None, k: int | None = None,
             speculative: bool = True) -> tuple[ServerInfo, Scrape]:
    """Reach the server, read what it reports (version, model, context, speculative config) and check its metric
    names; the drafter and k as the server reports them, else as the user states them."""
    client.health()
    models = client.models()  # a guarded /v1 path: a wrong key is refused here
    if not models:
        raise ServerError(f"{client.url}/models lists no model", "is the server still loading?")
    m = models[0]
    client.model = str(m.get("id"))
    version = client.version()
    scrape = client.metrics()
    check_metric_names(scrape, client.url, version, speculative=speculative)
    spec: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if speculative:
        spec["num_speculative_tokens"] = scrape.num_positions
        sources["num_speculative_tokens"] = "metrics"
        info = client.server_info() or {}
        sc = (info.get("vllm_config") or {}).get("speculative_config") if isinstance(info.get("vllm_config"), dict) else None
        if isinstance(sc, dict):
            for key in ("method", "model", "num_speculative_tokens", "draft_tensor_parallel_size", "quantization"):
                if sc.get(key) is not None and key not in spec:
                    spec[key] = sc[key]
                    sources[key] = "server_info"
        if "model" not in spec and drafter:
            spec["model"] = str(drafter)
            sources["model"] = "user"
        if k is not None and k != scrape.num_positions:
            raise InputError(f"-k {k}, but the server drafts {scrape.num_positions} tokens per step "
                             f"({PER_POSITION} has {scrape.num_positions} positions)",
                             "leave -k out with --server (the server's k is used)")
    mml = m.get("max_model_len")
    info_ = ServerInfo(url=client.url, vllm_version=version, model=client.model,
                       model_root=str(m.get("root")) if m.get("root") else None,
                       max_model_len=int(mml) if mml else None, speculative_config=spec, sources=sources)
    return info_, scrape


# ----- acceptance, block by block ------------------------------------------------------------------------------------
class OtherTraffic(ServerError):
    pass


def settle(client: ServerClient, before: Scrape, sent: int, *, timeout: float = _SETTLE_SECONDS) -> Scrape:
    """Read /metrics until the finished-request counter has moved by ``sent`` (vLLM records a request's stats just
    after streaming its last chunk); refuse at once when it moved by more."""
    t_end = time.monotonic() + timeout
    while True:
        after = client.metrics()
        moved = after.requests - before.requests
        if moved > sent:
            raise OtherTraffic(f"other traffic during a block: vllm:request_success moved by {moved:.0f}, "
                               f"{sent} requests were sent",
                               "measure on a replica no one else uses (or at a quiet time); counters are server-wide")
        if moved == sent or time.monotonic() > t_end:
            return after
        time.sleep(0.05)


def check_block(before: Scrape, after: Scrape, sent: int, completions: list[Completion]) -> AcceptanceStats:
    """The block's spec-decode counters, after checking that the server's traffic counters moved by exactly what
    this block sent (requests, generated tokens, prompt tokens); :class:`OtherTraffic` otherwise."""
    gen = sum(c.completion_tokens for c in completions)
    prm = sum(c.prompt_tokens for c in completions)
    moved = {"vllm:request_success": (after.requests - before.requests, sent),
             "vllm:generation_tokens": (after.generation_tokens - before.generation_tokens, gen),
             "vllm:prompt_tokens": (after.prompt_tokens - before.prompt_tokens, prm)}
    bad = [f"{n} moved by {got:.0f}, expected {want}" for n, (got, want) in moved.items() if round(got) != want]
    if bad:
        raise OtherTraffic("other traffic during a block (counts do not match the requests sent): " + "; ".join(bad),
                           "measure on a replica no one else uses (or at a quiet time); counters are server-wide")
    if after.spec is None or before.spec is None:
        raise ServerError("the speculative-decoding counters disappeared from /metrics during the run",
                          "was the server restarted? re-run")
    d = after.spec.minus(before.spec)
    if d.num_drafts < 0 or d.num_accepted_tokens < 0:
        raise OtherTraffic("the spec-decode counters went backwards (the server restarted during a block)", "re-run")
    if d.num_drafts > gen or d.num_accepted_tokens > d.num_draft_tokens:
        raise OtherTraffic(f"spec-decode counters inconsistent with this block ({d.num_drafts} drafts for {gen} "
                           f"generated tokens, {d.num_accepted_tokens} accepted of {d.num_draft_tokens})",
                           "measure on a replica no one else uses")
    d.num_prompts = sent
    d.num_output_tokens = gen
    return d


def measure(client: ServerClient, jobs: dict[str, dict[str, Any]], *, block_size: int = 4, temperature: float = 0.0,
            seed: int = 0, log: Callable[[str], None] | None = None,
            progress: Callable[[int, int, str], None] | None = None) -> dict[str, tuple[AcceptanceStats, dict[str, Any]]]:
    """Per job ``{"prompts", "max_tokens"}``: the counters summed over its blocks, and in ``extra`` the outputs,
    the seconds and the per-block counters (``blocks``) a standard error needs. A block's requests are sent
    together (the server batches them); the counters are read before and after each block; ``progress(done,
    total, job)`` after each block (requests)."""
    say = log or (lambda m: None)
    total_requests, sent = sum(len(j["prompts"]) for j in jobs.values()), 0
    out: dict[str, tuple[AcceptanceStats, dict[str, Any]]] = {}
    before = client.metrics()
    with ThreadPoolExecutor(max_workers=max(1, block_size)) as pool:
        for name, job in jobs.items():
            prompts = job["prompts"]
            blocks: list[AcceptanceStats] = []
            outputs: list[list[int]] = []
            secs = 0.0
            for i in range(0, len(prompts), block_size):
                chunk = prompts[i:i + block_size]
                t0 = time.perf_counter()
                futs = [pool.submit(client.complete, p, job["max_tokens"], temperature=temperature, seed=seed,
                                    ignore_eos=bool(job.get("ignore_eos", False))) for p in chunk]
                comps = [f.result() for f in futs]
                secs += time.perf_counter() - t0
                after = settle(client, before, len(chunk))
                blocks.append(check_block(before, after, len(chunk), comps))
                outputs += [c.token_ids for c in comps]
                before = after
                sent += len(chunk)
                if progress is not None:
                    progress(sent, total_requests, name)
            total = AcceptanceStats.total(blocks)
            say(f"server: {name}: {len(prompts)} prompts in {len(blocks)} blocks, AL {total.acceptance_length:.3f}")
            out[name] = (total, {"outputs": outputs, "seconds": secs, "blocks": [b.model_dump() for b in blocks]})
    return out


def block_errors(blocks: list[dict[str, Any]]) -> tuple[float | None, list[float] | None]:
    """SE of the AL and of each per-position rate across blocks (ratio estimator, each block a cluster)."""
    if len(blocks) < 2:
        return None, None
    d = [b["num_drafts"] for b in blocks]
    se = ratio_se([b["num_accepted_tokens"] for b in blocks], d)
    k = max(len(b["accepted_per_position"]) for b in blocks)
    pos = [ratio_se([(b["accepted_per_position"] + [0] * k)[i] for b in blocks], d) for i in range(k)]
    return (None if se is None else round(se, 4)), [round(x or 0.0, 4) for x in pos]


# ----- the server engine ---------------------------------------------------------------------------------------------
@register_engine
class ServerEngine(Engine):
    name = "server"
    description = "a running OpenAI-compatible vLLM server: /v1/completions in blocks, /metrics around each block"
    in_process = False

    def open(self, checkpoint: Any, target: Any, opts: ValidateOptions, log: Callable[[str], None]) -> Session:
        return ServerSession.open(checkpoint, target, opts, log)


@dataclass
class ServerSession(Session):
    """A validation against a running server: the suites are the target's tokenizer's (``target`` needs its
    tokenizer and config only, no weights) or, without ``target``, the server's own (``/tokenize``; the model from
    ``/v1/models``). ``checkpoint``: the drafter as the user states it, or None; a local folder is read only to
    record its aux ids, flags and hashes (``server.drafter``), never to measure."""

    per_request = False  # the counters are read around blocks of requests: each block is a unit of the SE

    opts: ValidateOptions | None = None
    log: Any = None
    client: Any = None
    server_info: ServerInfo | None = None
    stated: Any = None  # the checkpoint as the user stated it
    target_given: bool = True
    concurrency: list[int] | None = None
    speed: Any = None

    @classmethod
    def open(cls, checkpoint: Any, target: Any, opts: ValidateOptions, log: Callable[[str], None]) -> ServerSession:
        conc = sorted({int(c) for c in opts.concurrency})
        if opts.baseline_server and (not conc or conc[0] < 1):
            raise InputError("--concurrency needs positive integers, e.g. 1,4,16")
        if opts.report_dir is not None:
            check_no_overlap(Path(opts.report_dir), [checkpoint, target, opts.prompts_file], what="--report")
        weights_sha = _weights_sha(checkpoint)
        client = ServerClient(opts.server, server_key(opts)).__enter__()
        try:
            info, _ = describe(client, drafter=str(checkpoint) if checkpoint is not None else None, k=opts.k)
            kk = int(info.speculative_config["num_speculative_tokens"])
            log(f"server: {info.url} vLLM {info.vllm_version or '?'}, model {info.model}, k={kk}"
                + (f", drafter {info.speculative_config.get('model')} ({info.sources.get('model')})"
                   if info.speculative_config.get("model") else ""))
            tinfo, tok = _tokenizer(client, info, target, log)
            mml = info.max_model_len or int(tinfo.max_position_embeddings or 8192)
            named = info.speculative_config.get("model") if info.sources.get("model") == "server_info" else None
            info.drafter = drafter_record(checkpoint, named)
        except BaseException:
            client.__exit__(None, None, None)
            raise
        ckpt = str(checkpoint) if checkpoint is not None else (str(named) if named else None)
        return cls(engine="server", checkpoint=ckpt or None, target=str(target) if target is not None else
                   str(info.model_root or info.model), tokenizer=tok, info=tinfo, max_model_len=mml, k=kk,
                   weights_sha=weights_sha, opts=opts, log=log, client=client, server_info=info, stated=checkpoint,
                   target_given=target is not None, concurrency=conc)

    def measure(self, jobs: dict[str, dict[str, Any]], progress: Any = None) -> Measured:
        tick = (lambda done, total, info: progress("validate: server", done, total, info)) if progress else None
        new_r = measure(self.client, jobs, block_size=self.opts.block_size, temperature=self.opts.temperature,
                        seed=self.opts.seed, log=self.log, progress=tick)
        return Measured(new=new_r, engine_version=self.server_info.vllm_version)

    def finish(self, built: list[Any], jobs: dict[str, Any], measured: Measured, suite_results: list[Any]) -> None:
        """The speed runs against --baseline-server (on all suites' prompts), then each suite's (and group's)
        standard errors across its blocks; the drafter's aux ids as recorded."""
        o = self.opts
        if o.baseline_server:
            self.speed = _speed(self.client, self.server_info, o.baseline_server, server_key(o), built, self.concurrency,
                                o.speed_rounds, o.seed, self.log)
        _add_block_errors(built, jobs, measured.new, suite_results)
        if self.server_info.drafter.get("source") is not None:
            self.aux, self.warnings = aux_ids_status({"new": str(self.stated)}, self.target)
            for w in self.warnings:
                self.log("warning: " + w)

    def settings(self, measured: Measured) -> dict[str, Any]:
        o = self.opts
        return {"num_speculative_tokens": self.k, "temperature": o.temperature, "seed": o.seed, "dtype": None,
                "max_model_len": self.max_model_len, "tensor_parallel_size": None, "speedup": bool(o.baseline_server),
                "block_size": o.block_size, "concurrency": self.concurrency if o.baseline_server else None,
                "tokenizer": "target" if self.target_given else "server"}

    def report_fields(self) -> dict[str, Any]:
        return {"server": self.server_info, "serving_speed": self.speed}

    def close(self) -> None:
        if self.client is not None:
            self.client.__exit__(None, None, None)
            self.client = None


def server_key(opts: ValidateOptions) -> str | None:
    """The server's API key: the library's ``api_key``, else the variable ``api_key_env`` names (send-only)."""
    return opts.api_key.get_secret_value() if opts.api_key is not None else api_key_from_env(opts.api_key_env)


def _tokenizer(client: ServerClient, info: ServerInfo, target: str | None, say: Callable[[str], None]) -> tuple[Any, Any]:
    """(the target's config view, the tokenizer) the suites are built with: the target's own when ``target`` is
    given (its chat template checked against the server's), else the server's (/tokenize, /detokenize)."""
    if target is None:
        info.chat_template_matches = True  # the server renders every chat request itself
        say("suites: tokenised by the server (/tokenize; no --target)")
        tok = ServerTokenizer(client)
        if tok.chat_refused is not None:
            say(f"suites: the server's model has no chat template ({tok.chat_refused}): chats rendered as plain "
                "prompts (a plain transcript), measured through /v1/completions")
        return ServedModel(info.max_model_len), tok
    from ..target import load_tokenizer, target_info  # lazy: torch (a URL-only validation never loads it)

    tinfo = target_info(target)
    tok = load_tokenizer(target)
    info.chat_template_matches = template_check(client, tok)
    if info.chat_template_matches is False:
        say("warning: the server renders chat requests differently from the target's tokenizer here (its "
            "--chat-template?); the suites use the target's template")
    return tinfo, tok


def _weights_sha(checkpoint: str | os.PathLike | None) -> str | None:
    """sha256 of the stated drafter's weights when it is a local folder or file (publish checks it)."""
    if checkpoint is None or not Path(checkpoint).exists():
        return None
    return sha256_files(open_checkpoint_path(Path(checkpoint))[1])


def _speed(client: ServerClient, info: ServerInfo, baseline_server: str, api_key: str | None, built: list[Any],
           conc: list[int], rounds: int, seed: int, say: Callable[[str], None]) -> Any:
    """--baseline-server: check it (no speculation, the same target), then the speed runs on all suites' prompts."""
    with ServerClient(baseline_server, api_key) as base:
        binfo, bscrape = describe(base, speculative=False)
        if bscrape.spec is not None:
            raise ServerError(f"the baseline server {base.url} has speculative decoding configured",
                              "serve the same target without --speculative-config for --baseline-server")
        _same_target(info, binfo)
        pool = [p for s in built for p in s.prompts]
        speed = serving_speed(client, base, pool, concurrency=conc, max_tokens=max(s.max_tokens for s in built),
                              rounds=rounds, seed=seed, log=say)
        speed.baseline_vllm_version = binfo.vllm_version
    return speed


def _add_block_errors(built: list[Any], jobs: dict[str, Any], new_r: dict[str, Any], results: list[Any]) -> None:
    """Each suite's (and group's) standard errors across its blocks, into its Metrics."""
    for s, res in zip(built, results):
        keys = [x for x in jobs if x == s.name or x.startswith(s.name + "/")]
        blocks = [b for x in keys for b in new_r[x][1]["blocks"]]
        res.new.acceptance_length_se, res.new.per_position_rate_se = block_errors(blocks)
        res.new.num_blocks = len(blocks)
        for g in res.groups:
            gb = new_r[f"{s.name}/{g.name}"][1]["blocks"]
            g.new.acceptance_length_se, g.new.per_position_rate_se = block_errors(gb)
            g.new.num_blocks = len(gb)


def template_check(client: ServerClient, tokenizer: Any, n: int = 3) -> bool | None:
    """Whether the server renders the first ``n`` built-in chat requests to the same token ids as the suites do
    with ``tokenizer`` (the target's chat template); None when either side cannot render (no tokenizer)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return None

    for conv in load_conversations(None)[:n]:
        theirs = client.tokenize_chat([{"role": m["role"], "content": m["content"]} for m in conv.prompt_messages()])
        if theirs is None:
            return None
        if theirs != render(conv, tokenizer):
            return False
    return True


def _same_target(spec: ServerInfo, base: ServerInfo) -> None:
    a, b = spec.model_root or spec.model, base.model_root or base.model
    if a and b and Path(str(a)).name != Path(str(b)).name:
        raise ServerError(f"the baseline server serves {base.model_root or base.model}, the speculative one "
                          f"{spec.model_root or spec.model}", "serve the same target on both (only the speculation "
                          "may differ)")
