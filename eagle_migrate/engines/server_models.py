"""What the server engine reports about a live server (``validate --server``): the server's own description
(:class:`ServerInfo`) and the serving speed against a baseline server (:class:`ServingSpeed`, its load runs and
levels). The validation report (``validate/report.py``) carries them as fields; they live beside the engine that
fills them, so the engines never import the validate stage.
Imports: pydantic only.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class ServerInfo(BaseModel):
    """What a live server reported about itself (``validate --server``)."""

    url: str = Field(..., description="the API's URL (credentials removed)")
    vllm_version: str | None = Field(None, description="GET /version")
    model: str | None = Field(None, description="the served model's id (GET /v1/models)")
    model_root: str | None = Field(None, description="the model path the server loaded (``root`` in /v1/models)")
    max_model_len: int | None = None
    speculative_config: dict[str, Any] = Field(default_factory=dict, description="as reported: num_speculative_tokens "
                                               "(positions of the per-position counter), and method / model when "
                                               "the server exposes its config (/server_info)")
    sources: dict[str, str] = Field(default_factory=dict, description="where each speculative_config value came "
                                    "from: metrics, server_info or user")
    chat_template_matches: bool | None = Field(None, description="the server's /tokenize renders built-in chat "
                                               "requests to the suites' token ids (None: not checkable)")
    drafter: dict[str, Any] | None = Field(None, description="what the server does not report: the drafter's "
                                           "aux_layer_ids, flags, weights_sha256, config_sha256 from CKPT's folder, "
                                           "or null and named in `unknown` (engines/server_tokenizer.py)")


class LatencyStats(BaseModel):
    """Percentiles of one latency over the requests of a load run, in milliseconds."""

    p50: float
    p90: float
    p99: float
    mean: float


class LoadRun(BaseModel):
    """One server at one concurrency: C streaming users sending the suites' prompts, greedy, fixed max tokens."""

    requests: int
    output_tokens: int
    seconds: float
    per_user_tokens_per_second: float = Field(..., description="median over requests of output tokens / request latency")
    output_tokens_per_second: float = Field(..., description="all output tokens / wall time of the run")
    ttft_ms: LatencyStats
    itl_ms: LatencyStats = Field(..., description="gaps between streamed chunks (a speculative step streams several tokens)")
    tpot_ms: LatencyStats = Field(..., description="(latency - TTFT) / (output tokens - 1) per request")


class SpeedLevel(BaseModel):
    """Speculative vs baseline server at one concurrency, measured in alternation over rounds."""

    concurrency: int
    rounds: int
    speculative: list[LoadRun]
    baseline: list[LoadRun]
    ratios: list[float] = Field(..., description="per round: per-user tokens/s speculative / baseline")
    speedup: float = Field(..., description="median of the per-round ratios")
    speedup_min: float
    speedup_max: float
    speedup_se: float | None = Field(None, description="standard error of the mean ratio across rounds")


class ServingSpeed(BaseModel):
    """``--baseline-server``: per-user output throughput and latency of the speculative server against the same
    target served without speculation."""

    baseline_url: str
    baseline_vllm_version: str | None = None
    max_tokens: int
    requests_per_run: dict[int, int] = Field(default_factory=dict)
    levels: list[SpeedLevel]
