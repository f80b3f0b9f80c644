"""The server engine: acceptance length and serving speed of a running OpenAI-compatible vLLM server.

``validate --server URL`` sends the suites' token-id prompts to ``/v1/completions`` (greedy, fixed max tokens) in
blocks, and reads vLLM's Prometheus counters from ``/metrics`` (parsed by ``prometheus_client``'s text parser)
before and after each block: the difference is that block's drafts, draft tokens, accepted tokens and accepted per
position. A block whose request / generated-token / prompt-token counters moved by more than what was sent is
refused (other traffic). Each suite's AL is the sum of its blocks' counters, its standard error the ratio
estimator's across blocks. ``--baseline-server URL`` adds per-user output throughput, TTFT and inter-token latency
at each concurrency, speculative and baseline server measured in alternation.

The engine is pluggable beside the in-process one: :func:`validate_server` builds the same suites and the same
:class:`ValidationReport` (engine ``server``) through ``api``'s steps. Imports: errors, choices, validate.{api,
metrics, report}, corpora (through api), httpx, prometheus_client.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit, urlunsplit

from .. import __version__
from ..errors import CheckFailed, EngineError, InputError, ServerError, redact
from .metrics import AcceptanceStats, ratio_se
from .report import (
    LatencyStats,
    LoadRun,
    ServerInfo,
    ServingSpeed,
    SpeedLevel,
    ValidationReport,
    write_report,
)

# The counters read, as vLLM (>= 0.7, V1 engine) exports them; prometheus_client's parser strips ``_total``.
SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
TRAFFIC_COUNTERS = {
    "vllm:request_success": "requests",
    "vllm:generation_tokens": "generation_tokens",
    "vllm:prompt_tokens": "prompt_tokens",
}
SPEC_PREFIX = "vllm:spec_decode"
_SETTLE_SECONDS = 30.0  # how long the counters may lag the last response (vLLM records stats after streaming it)


# ----- metrics ---------------------------------------------------------------------------------------------------
@dataclass
class Scrape:
    """One reading of a server's /metrics: the spec-decode counters (None without speculation), the traffic
    counters, and the family names present."""

    spec: AcceptanceStats | None
    requests: float = 0.0
    generation_tokens: float = 0.0
    prompt_tokens: float = 0.0
    num_positions: int = 0
    names: set[str] = field(default_factory=set)


def parse_metrics(text: str) -> Scrape:
    """Parse Prometheus text with ``prometheus_client.parser`` and sum each counter over its labels (engines,
    models, finish reasons); ``_created`` samples are skipped."""
    from prometheus_client.parser import text_string_to_metric_families

    names: set[str] = set()
    spec = {v: 0.0 for v in SPEC_COUNTERS.values()}
    per_pos: dict[int, float] = {}
    traffic = {v: 0.0 for v in TRAFFIC_COUNTERS.values()}
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:  # not Prometheus text (a proxy's HTML page, ...)
        raise ServerError(f"/metrics is not Prometheus text ({e.__class__.__name__}: {str(e)[:120]})",
                          "point --server at the vLLM server itself (its /metrics endpoint)") from None
    for fam in families:
        names.add(fam.name)
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            if fam.name in SPEC_COUNTERS:
                spec[SPEC_COUNTERS[fam.name]] += s.value
            elif fam.name == PER_POSITION:
                pos = int(s.labels.get("position", 0))
                per_pos[pos] = per_pos.get(pos, 0.0) + s.value
            elif fam.name in TRAFFIC_COUNTERS:
                traffic[TRAFFIC_COUNTERS[fam.name]] += s.value
    has_spec = any(n in names for n in SPEC_COUNTERS)
    n_pos = max(per_pos) + 1 if per_pos else 0
    stats = AcceptanceStats(num_drafts=int(spec["num_drafts"]), num_draft_tokens=int(spec["num_draft_tokens"]),
                            num_accepted_tokens=int(spec["num_accepted_tokens"]),
                            accepted_per_position=[int(per_pos.get(i, 0)) for i in range(n_pos)]) if has_spec else None
    return Scrape(spec=stats, requests=traffic["requests"], generation_tokens=traffic["generation_tokens"],
                  prompt_tokens=traffic["prompt_tokens"], num_positions=n_pos, names=names)


def check_metric_names(s: Scrape, url: str, version: str | None, *, speculative: bool = True) -> None:
    """Refuse a /metrics this version does not read: no vLLM counters, other names, or no speculation."""
    where = f"{url}/metrics" + (f" (vLLM {version})" if version else "")
    if not any(n.startswith("vllm:") for n in s.names):
        raise ServerError(f"{where} lists no vllm:* metrics",
                          "point --server at a vLLM OpenAI-compatible server (not a proxy or another engine)")
    missing = [n for n in TRAFFIC_COUNTERS if n not in s.names]
    spec_names = sorted(n for n in s.names if n.startswith(SPEC_PREFIX))
    if speculative and spec_names:
        missing += [n for n in (*SPEC_COUNTERS, PER_POSITION) if n not in s.names]
    if missing:
        raise ServerError(f"{where} does not export the counters eagle-migrate reads: missing {', '.join(missing)}"
                          + (f" (it has {', '.join(spec_names)})" if spec_names else ""),
                          "this vLLM version names its metrics differently; validate in-process (--engine vllm) or "
                          "report the version")
    if speculative and not spec_names:
        raise ServerError(f"the server at {url} has no speculative decoding configured (no {SPEC_PREFIX}_* "
                          "counters in /metrics)",
                          "start it with --speculative-config '{\"method\": \"eagle3\", \"model\": DRAFTER, "
                          "\"num_speculative_tokens\": 3}'")
    if speculative and s.num_positions == 0:
        raise ServerError(f"{where}: {PER_POSITION} has no positions", "the server's speculative config reports no "
                          "draft positions; check --speculative-config")


# ----- HTTP ------------------------------------------------------------------------------------------------------
def _split_url(url: str) -> tuple[str, str]:
    """(server root, API base): ``http://h:8000``, ``http://h:8000/`` and ``http://h:8000/v1`` all name one server."""
    u = url.strip()
    if "://" not in u:
        raise InputError(f"--server {redact(u)}: not a URL", "pass the API's URL, e.g. http://HOST:8000/v1")
    parts = urlsplit(u)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputError(f"--server {redact(u)}: not an http(s) URL", "pass the API's URL, e.g. http://HOST:8000/v1")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    root = urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    return root, root + "/v1"


@dataclass
class Completion:
    token_ids: list[int]
    prompt_tokens: int
    completion_tokens: int


@dataclass
class StreamTiming:
    ttft: float
    gaps: list[float]
    output_tokens: int
    latency: float


class ServerClient:
    """One OpenAI-compatible vLLM server: /health, /version, /v1/models, /metrics, /v1/completions. The API key
    is sent as a Bearer token and never appears in what this prints or raises."""

    def __init__(self, url: str, api_key: str | None = None, *, timeout: float = 900.0, max_connections: int = 64):
        import httpx

        self.root, self.api = _split_url(url)
        self.url = redact(self.api)
        self._key = api_key or None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(timeout=httpx.Timeout(timeout, connect=10.0), headers=headers,
                                  limits=httpx.Limits(max_connections=max_connections,
                                                      max_keepalive_connections=max_connections))
        self.model: str | None = None

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ServerClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _clean(self, text: str) -> str:
        return redact(str(text), self._key)

    def _call(self, method: str, url: str, **kw: Any) -> Any:
        import httpx

        try:
            r = self._http.request(method, url, **kw)
        except httpx.TimeoutException:
            raise ServerError(f"{self.url}: no answer within the timeout ({method} {url.removeprefix(self.root)})",
                              "the server is overloaded or stuck; check its log") from None
        except httpx.HTTPError as e:
            raise ServerError(f"cannot reach the server at {self.url} ({e.__class__.__name__}: "
                              f"{self._clean(str(e))[:160]})",
                              "check the URL and that the server is up: GET URL/health must answer 200") from None
        self._raise_for(r)
        return r

    def _raise_for(self, r: Any) -> None:
        if r.status_code in (401, 403):
            raise ServerError(f"the server at {self.url} refused the API key (HTTP {r.status_code})",
                              "export the server's key (its --api-key / VLLM_API_KEY) in the variable named by "
                              "--api-key-env")
        if r.status_code >= 400:
            try:
                msg = r.json().get("error", {}).get("message") or r.text
            except Exception:
                msg = r.text
            raise EngineError(f"{self.url}: HTTP {r.status_code} on {r.request.method} "
                              f"{str(r.request.url.path)}: {self._clean(msg)[:300]}",
                              "check the server's log; the request was a plain greedy completion")

    def health(self) -> None:
        self._call("GET", self.root + "/health")

    def version(self) -> str | None:
        try:
            return str(self._call("GET", self.root + "/version").json().get("version") or "") or None
        except EngineError:
            return None

    def models(self) -> list[dict[str, Any]]:
        data = self._call("GET", self.api + "/models").json().get("data") or []
        return [m for m in data if isinstance(m, dict)]

    def server_info(self) -> dict[str, Any] | None:
        """vLLM's /server_info (only with ``VLLM_SERVER_DEV_MODE=1``): its config, where the drafter is named."""
        import httpx

        try:
            r = self._http.get(self.root + "/server_info", params={"config_format": "json"})
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        try:
            return r.json()
        except Exception:
            return None

    def tokenize_chat(self, messages: list[dict[str, str]]) -> list[int] | None:
        """The server's own rendering of a chat request (``POST /tokenize`` with ``messages``: its chat template,
        as ``/v1/chat/completions`` applies it); None when the server has no tokenizer or no such route."""
        import httpx

        try:
            r = self._http.post(self.root + "/tokenize", json={"model": self.model, "messages": messages,
                                                               "add_generation_prompt": True})
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        try:
            return [int(x) for x in r.json().get("tokens") or []] or None
        except Exception:
            return None

    def metrics(self) -> Scrape:
        return parse_metrics(self._call("GET", self.root + "/metrics").text)

    def _body(self, prompt: Sequence[int] | str, max_tokens: int, temperature: float, seed: int,
              ignore_eos: bool) -> dict[str, Any]:
        return {"model": self.model, "prompt": list(prompt) if not isinstance(prompt, str) else prompt,
                "max_tokens": int(max_tokens), "temperature": float(temperature), "seed": int(seed),
                "ignore_eos": bool(ignore_eos), "return_token_ids": True}

    def complete(self, prompt: Sequence[int] | str, max_tokens: int, *, temperature: float = 0.0, seed: int = 0,
                 ignore_eos: bool = False) -> Completion:
        r = self._call("POST", self.api + "/completions",
                       json=self._body(prompt, max_tokens, temperature, seed, ignore_eos)).json()
        ch = (r.get("choices") or [{}])[0]
        usage = r.get("usage") or {}
        ids = [int(x) for x in (ch.get("token_ids") or [])]
        return Completion(ids, int(usage.get("prompt_tokens") or len(prompt)),
                          int(usage.get("completion_tokens") or len(ids)))

    def stream(self, prompt: Sequence[int] | str, max_tokens: int, *, temperature: float = 0.0, seed: int = 0,
               ignore_eos: bool = False) -> StreamTiming:
        """One streaming completion, timed on arrival: time to the first chunk carrying tokens, the gaps between
        such chunks, the output tokens (the final usage chunk) and the request's latency."""
        import httpx

        body = self._body(prompt, max_tokens, temperature, seed, ignore_eos)
        body.update(stream=True, stream_options={"include_usage": True})
        t0 = time.perf_counter()
        first, last, gaps, n_tok, usage_tokens = None, None, [], 0, None
        try:
            with self._http.stream("POST", self.api + "/completions", json=body) as r:
                if r.status_code >= 400:
                    r.read()
                    self._raise_for(r)
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if chunk.get("usage") and chunk["usage"].get("completion_tokens") is not None:
                        usage_tokens = int(chunk["usage"]["completion_tokens"])
                    choices = chunk.get("choices") or []
                    got = sum(len(c.get("token_ids") or []) for c in choices) or sum(bool(c.get("text")) for c in choices)
                    if got:
                        now = time.perf_counter()
                        if first is None:
                            first = now
                        else:
                            gaps.append(now - last)
                        last = now
                        n_tok += got
        except httpx.HTTPError as e:
            raise ServerError(f"cannot reach the server at {self.url} ({e.__class__.__name__}: "
                              f"{self._clean(str(e))[:160]})", "check that the server is up") from None
        end = time.perf_counter()
        return StreamTiming(ttft=(first or end) - t0, gaps=gaps,
                            output_tokens=usage_tokens if usage_tokens is not None else n_tok, latency=end - t0)


def api_key_from_env(name: str | None) -> str | None:
    """The API key from the environment variable ``name`` (never from the command line)."""
    if not name:
        return None
    key = os.environ.get(name)
    if not key:
        raise InputError(f"--api-key-env {name}: the variable is not set or empty",
                         f"export {name}=... (the server's --api-key) before running")
    return key


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


def _settle(client: ServerClient, before: Scrape, sent: int, *, timeout: float = _SETTLE_SECONDS) -> Scrape:
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
            seed: int = 0, log: Callable[[str], None] | None = None) -> dict[str, tuple[AcceptanceStats, dict[str, Any]]]:
    """Per job ``{"prompts", "max_tokens"}``: the counters summed over its blocks, and in ``extra`` the outputs,
    the seconds and the per-block counters (``blocks``) a standard error needs. A block's requests are sent
    together (the server batches them); the counters are read before and after each block."""
    say = log or (lambda m: None)
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
                after = _settle(client, before, len(chunk))
                blocks.append(check_block(before, after, len(chunk), comps))
                outputs += [c.token_ids for c in comps]
                before = after
            total = AcceptanceStats()
            for b in blocks:
                total = _add(total, b)
            say(f"server: {name}: {len(prompts)} prompts in {len(blocks)} blocks, AL {total.acceptance_length:.3f}")
            out[name] = (total, {"outputs": outputs, "seconds": secs, "blocks": [b.model_dump() for b in blocks]})
    return out


def _add(a: AcceptanceStats, b: AcceptanceStats) -> AcceptanceStats:
    n = max(len(a.accepted_per_position), len(b.accepted_per_position))
    pa = a.accepted_per_position + [0] * (n - len(a.accepted_per_position))
    pb = b.accepted_per_position + [0] * (n - len(b.accepted_per_position))
    return AcceptanceStats(num_drafts=a.num_drafts + b.num_drafts, num_draft_tokens=a.num_draft_tokens + b.num_draft_tokens,
                           num_accepted_tokens=a.num_accepted_tokens + b.num_accepted_tokens,
                           accepted_per_position=[x + y for x, y in zip(pa, pb)],
                           num_prompts=a.num_prompts + b.num_prompts,
                           num_output_tokens=a.num_output_tokens + b.num_output_tokens)


def block_errors(blocks: list[dict[str, Any]]) -> tuple[float | None, list[float] | None]:
    """SE of the AL and of each per-position rate across blocks (ratio estimator, each block a cluster)."""
    if len(blocks) < 2:
        return None, None
    d = [b["num_drafts"] for b in blocks]
    se = ratio_se([b["num_accepted_tokens"] for b in blocks], d)
    k = max(len(b["accepted_per_position"]) for b in blocks)
    pos = [ratio_se([(b["accepted_per_position"] + [0] * k)[i] for b in blocks], d) for i in range(k)]
    return (None if se is None else round(se, 4)), [round(x or 0.0, 4) for x in pos]


# ----- serving speed ------------------------------------------------------------------------------------------------
def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    i = (len(s) - 1) * q
    lo, hi = math.floor(i), math.ceil(i)
    return s[lo] + (s[hi] - s[lo]) * (i - lo)


def _lat(xs: list[float]) -> LatencyStats:
    ms = [x * 1000.0 for x in xs]
    return LatencyStats(p50=round(_pct(ms, 0.5), 3), p90=round(_pct(ms, 0.9), 3), p99=round(_pct(ms, 0.99), 3),
                        mean=round(sum(ms) / len(ms), 3) if ms else 0.0)


def load_run(client: ServerClient, prompts: list[Sequence[int]], concurrency: int, max_tokens: int, *,
             seed: int = 0) -> LoadRun:
    """``len(prompts)`` streaming requests from ``concurrency`` users (each sends its next request when the last
    one finished), greedy, ``ignore_eos`` so every request generates ``max_tokens``."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        timings = list(pool.map(lambda p: client.stream(p, max_tokens, seed=seed, ignore_eos=True), prompts))
    wall = time.perf_counter() - t0
    toks = sum(t.output_tokens for t in timings)
    per_user = [t.output_tokens / t.latency for t in timings if t.latency > 0]
    tpot = [(t.latency - t.ttft) / (t.output_tokens - 1) for t in timings if t.output_tokens > 1]
    return LoadRun(requests=len(timings), output_tokens=toks, seconds=round(wall, 3),
                   per_user_tokens_per_second=round(statistics.median(per_user), 3) if per_user else 0.0,
                   output_tokens_per_second=round(toks / wall, 3) if wall > 0 else 0.0,
                   ttft_ms=_lat([t.ttft for t in timings]), itl_ms=_lat([g for t in timings for g in t.gaps]),
                   tpot_ms=_lat(tpot))


def serving_speed(spec: ServerClient, base: ServerClient, prompts: list[Sequence[int]], *, concurrency: list[int],
                  max_tokens: int, rounds: int = 3, requests_per_user: int = 2, seed: int = 0,
                  log: Callable[[str], None] | None = None) -> ServingSpeed:
    """Per concurrency C: ``rounds`` rounds, each one load run on each server (the order alternates round by round,
    so drift of the machine hits both), ``max(C * requests_per_user, 4)`` requests cycling through ``prompts``;
    the speed-up of a round is the ratio of the median per-user output tokens/s."""
    say = log or (lambda m: None)
    if not prompts:
        raise InputError("no prompts for the speed measurement")
    levels, per_run = [], {}
    for c in concurrency:
        n = max(c * requests_per_user, 4)
        per_run[c] = n
        batch = [prompts[i % len(prompts)] for i in range(n)]
        load_run(spec, batch[:min(c, n)], c, min(8, max_tokens), seed=seed)  # warm both (first-request effects)
        load_run(base, batch[:min(c, n)], c, min(8, max_tokens), seed=seed)
        sp, bs, ratios = [], [], []
        for r in range(rounds):
            order = ((spec, sp), (base, bs)) if r % 2 == 0 else ((base, bs), (spec, sp))
            for cl, acc in order:
                acc.append(load_run(cl, batch, c, max_tokens, seed=seed))
            ratios.append(round(sp[-1].per_user_tokens_per_second / bs[-1].per_user_tokens_per_second, 4)
                          if bs[-1].per_user_tokens_per_second else float("nan"))
        se = statistics.stdev(ratios) / math.sqrt(len(ratios)) if len(ratios) > 1 else None
        lvl = SpeedLevel(concurrency=c, rounds=rounds, speculative=sp, baseline=bs, ratios=ratios,
                         speedup=round(statistics.median(ratios), 4), speedup_min=min(ratios), speedup_max=max(ratios),
                         speedup_se=None if se is None else round(se, 4))
        say(f"speed: C={c}: per-user tokens/s {statistics.median([x.per_user_tokens_per_second for x in sp]):.1f} vs "
            f"{statistics.median([x.per_user_tokens_per_second for x in bs]):.1f} -> {lvl.speedup:.3f}x "
            f"(rounds {', '.join(f'{x:.3f}' for x in ratios)})")
        levels.append(lvl)
    return ServingSpeed(baseline_url=base.url, max_tokens=max_tokens, requests_per_run=per_run, levels=levels)


# ----- validate --server ---------------------------------------------------------------------------------------------
def validate_server(
    checkpoint: str | os.PathLike | None,
    target: str,
    server: str,
    *,
    api_key: str | None = None,
    baseline_server: str | None = None,
    concurrency: Sequence[int] = (1, 4, 16),
    speed_rounds: int = 3,
    suites: list[str] | tuple[str, ...] | None = None,
    prompts_file: str | os.PathLike | None = None,
    k: int | None = None,
    min_acceptance_length: float | None = None,
    report_dir: str | os.PathLike | None = None,
    num_prompts: int | None = None,
    max_tokens: int | None = None,
    temperature: float = 0.0,
    seed: int = 0,
    block_size: int = 4,
    check: bool = False,
    log: Callable[[str], None] | None = None,
) -> ValidationReport:
    """``validate`` against a running vLLM server (engine ``server``): the same suites (token ids, built with the
    target's tokenizer: ``target`` needs its tokenizer and config only, no weights), the same gates and report.
    ``checkpoint``: the drafter as the user states it (recorded; its weights' sha256 when it is a local folder),
    used where the server does not name its drafter. ``api_key``: the server's key (send-only)."""
    from . import api

    t_start = time.perf_counter()
    say = log or (lambda m: None)
    api._quiet_transformers()
    if block_size < 1:
        raise InputError("--block-size must be at least 1")
    conc = sorted({int(c) for c in concurrency})
    if baseline_server and (not conc or conc[0] < 1):
        raise InputError("--concurrency needs positive integers, e.g. 1,4,16")
    if report_dir is not None:
        from ..formats.output import check_no_overlap

        check_no_overlap(Path(report_dir), [checkpoint, target, prompts_file], what="--report")
    weights_sha = None
    if checkpoint is not None and Path(checkpoint).exists():
        from ..formats.io import open_checkpoint_path, sha256_files

        weights_sha = sha256_files(open_checkpoint_path(Path(checkpoint))[1])
    with ServerClient(server, api_key) as client:
        info, _ = describe(client, drafter=str(checkpoint) if checkpoint is not None else None, k=k)
        kk = int(info.speculative_config["num_speculative_tokens"])
        say(f"server: {info.url} vLLM {info.vllm_version or '?'}, model {info.model}, k={kk}"
            + (f", drafter {info.speculative_config.get('model')} ({info.sources.get('model')})"
               if info.speculative_config.get("model") else ""))
        from ..target import target_info

        tinfo = target_info(target)
        tok = api.load_tokenizer(target)
        info.chat_template_matches = template_check(client, tok)
        if info.chat_template_matches is False:
            say("warning: the server renders chat requests differently from the target's tokenizer here (its "
                "--chat-template?); the suites use the target's template")
        mml = info.max_model_len or int(tinfo.max_position_embeddings or 8192)
        inp = api._Inputs(str(checkpoint or info.speculative_config.get("model") or "?"), None, "server",
                          weights_sha or "", tinfo, tok, mml)
        built, jobs = api._build_suites(inp, suites, prompts_file, num_prompts=num_prompts, max_tokens=max_tokens,
                                        seed=seed)
        say("suites: " + ", ".join(f"{s.name} ({s.size} prompts)" for s in built))
        new_r = measure(client, jobs, block_size=block_size, temperature=temperature, seed=seed, log=say)
        speed = None
        if baseline_server:
            with ServerClient(baseline_server, api_key) as base:
                binfo, bscrape = describe(base, speculative=False)
                if bscrape.spec is not None:
                    raise ServerError(f"the baseline server {base.url} has speculative decoding configured",
                                      "serve the same target without --speculative-config for --baseline-server")
                _same_target(info, binfo)
                pool = [p for s in built for p in s.prompts]
                mt = max(s.max_tokens for s in built)
                speed = serving_speed(client, base, pool, concurrency=conc, max_tokens=mt, rounds=speed_rounds,
                                      seed=seed, log=say)
                speed.baseline_vllm_version = binfo.vllm_version

    suite_results = [api._suite_result(s, jobs, new_r, None, None) for s in built]
    for s, res in zip(built, suite_results):
        keys = [x for x in jobs if x == s.name or x.startswith(s.name + "/")]
        blocks = [b for x in keys for b in new_r[x][1]["blocks"]]
        res.new.acceptance_length_se, res.new.per_position_rate_se = block_errors(blocks)
        res.new.num_blocks = len(blocks)
        for g in res.groups:
            gb = new_r[f"{s.name}/{g.name}"][1]["blocks"]
            g.new.acceptance_length_se, g.new.per_position_rate_se = block_errors(gb)
            g.new.num_blocks = len(gb)
    gates, failures = api._apply_gates(suite_results, min_acceptance_length, None)
    overall = {"new": round(api._sum([new_r[x][0] for x in jobs]).acceptance_length, 4)}
    settings = {"num_speculative_tokens": kk, "temperature": temperature, "seed": seed, "dtype": None,
                "max_model_len": mml, "tensor_parallel_size": None, "speedup": bool(baseline_server),
                "block_size": block_size, "concurrency": conc if baseline_server else None}
    report = ValidationReport(
        tool=f"eagle-migrate {__version__}", created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        checkpoint=inp.ckpt, weights_sha256=weights_sha, baseline=None, target=str(target), engine="server",
        engine_version=info.vllm_version, settings=settings, suites=suite_results, overall=overall, gates=gates,
        passed=not failures, failures=failures, diagnostics=None, server=info, serving_speed=speed)
    report.seconds = round(time.perf_counter() - t_start, 1)
    if report_dir is not None:
        write_report(report, Path(report_dir))
    if check and not report.passed:
        raise CheckFailed("; ".join(failures))
    return report


def template_check(client: ServerClient, tokenizer: Any, n: int = 3) -> bool | None:
    """Whether the server renders the first ``n`` built-in chat requests to the same token ids as the suites do
    with ``tokenizer`` (the target's chat template); None when either side cannot render (no tokenizer)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return None
    from ..corpora import load_conversations, render

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
