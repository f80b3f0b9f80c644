"""A running OpenAI-compatible vLLM server as the server engine sees it: its Prometheus ``/metrics`` (parsed with
``prometheus_client``'s text parser; the counters summed over their labels) and its HTTP API (``/health``,
``/version``, ``/v1/models``, ``/server_info``, ``/tokenize``, ``/v1/completions`` plain and streamed), the API key
sent as a Bearer token and never shown. Imports: errors, engines.metrics, httpx, prometheus_client."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Sequence
from urllib.parse import urlsplit, urlunsplit

from ..errors import EngineError, InputError, ServerError, redact
from .metrics import AcceptanceStats

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
ITL = "vllm:inter_token_latency_seconds"  # a histogram: one sample per request per engine step (watch's break-even)
START_TIME = "process_start_time_seconds"  # prometheus_client's process collector: a restart changes it (watch)


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
    itl_sum: float = 0.0  # vllm:inter_token_latency_seconds: seconds and samples (engine steps of a request)
    itl_count: float = 0.0
    start_time: float | None = None  # process_start_time_seconds, when the server exports it


def parse_metrics(text: str) -> Scrape:
    """Parse Prometheus text with ``prometheus_client.parser`` and sum each counter over its labels (engines,
    models, finish reasons); ``_created`` samples are skipped."""
    from prometheus_client.parser import text_string_to_metric_families  # lazy: prometheus_client, only to parse /metrics (--server, watch)

    names: set[str] = set()
    spec = {v: 0.0 for v in SPEC_COUNTERS.values()}
    per_pos: dict[int, float] = {}
    traffic = {v: 0.0 for v in TRAFFIC_COUNTERS.values()}
    itl = {"_sum": 0.0, "_count": 0.0}
    start_time = None
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
            elif fam.name == ITL and s.name[len(ITL):] in itl:
                itl[s.name[len(ITL):]] += s.value
            elif fam.name == START_TIME:
                start_time = s.value if start_time is None else max(start_time, s.value)
    has_spec = any(n in names for n in SPEC_COUNTERS)
    n_pos = max(per_pos) + 1 if per_pos else 0
    stats = AcceptanceStats(num_drafts=int(spec["num_drafts"]), num_draft_tokens=int(spec["num_draft_tokens"]),
                            num_accepted_tokens=int(spec["num_accepted_tokens"]),
                            accepted_per_position=[int(per_pos.get(i, 0)) for i in range(n_pos)]) if has_spec else None
    return Scrape(spec=stats, requests=traffic["requests"], generation_tokens=traffic["generation_tokens"],
                  prompt_tokens=traffic["prompt_tokens"], num_positions=n_pos, names=names, itl_sum=itl["_sum"],
                  itl_count=itl["_count"], start_time=start_time)


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
    spec: dict[str, Any] | None = None  # the response's metrics.speculative_decoding (vLLM >= 0.32 started with
    # --per-request-spec-decode-metrics summary|detailed), else None


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
        import httpx  # lazy: httpx (0.1 s), only for --server (an in-process validation imports this module too)

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
        import httpx  # lazy: httpx (0.1 s), only for --server (an in-process validation imports this module too)

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
        import httpx  # lazy: httpx (0.1 s), only for --server (an in-process validation imports this module too)

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
        import httpx  # lazy: httpx (0.1 s), only for --server (an in-process validation imports this module too)

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

    def tokenize_text(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """``POST /tokenize`` with a prompt: the server's own tokenizer (validate --server without --target)."""
        r = self._call("POST", self.root + "/tokenize", json={"model": self.model, "prompt": text,
                                                                "add_special_tokens": bool(add_special_tokens)})
        return [int(x) for x in r.json().get("tokens") or []]

    def tokenize_messages(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """``POST /tokenize`` with chat messages (its chat template), raising where :meth:`tokenize_chat` says None."""
        r = self._call("POST", self.root + "/tokenize", json={"model": self.model, "messages": messages,
                                                                "add_generation_prompt": bool(add_generation_prompt)})
        return [int(x) for x in r.json().get("tokens") or []]

    def detokenize(self, ids: Sequence[int]) -> str:
        """``POST /detokenize``: token ids back to text with the server's tokenizer."""
        r = self._call("POST", self.root + "/detokenize", json={"model": self.model, "tokens": [int(x) for x in ids]})
        return str(r.json().get("prompt") or "")

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
        spec = (r.get("metrics") or {}).get("speculative_decoding") if isinstance(r.get("metrics"), dict) else None
        return Completion(ids, int(usage.get("prompt_tokens") or len(prompt)),
                          int(usage.get("completion_tokens") or len(ids)), spec if isinstance(spec, dict) else None)

    def stream(self, prompt: Sequence[int] | str, max_tokens: int, *, temperature: float = 0.0, seed: int = 0,
               ignore_eos: bool = False) -> StreamTiming:
        """One streaming completion, timed on arrival: time to the first chunk carrying tokens, the gaps between
        such chunks, the output tokens (the final usage chunk) and the request's latency."""
        import httpx  # lazy: httpx (0.1 s), only for --server (an in-process validation imports this module too)

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

