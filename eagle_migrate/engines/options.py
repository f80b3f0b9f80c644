"""``ValidateOptions``: every option of ``validate`` (in-process and ``--server``) in one checked model, taken whole
by the engines (``engines/in_process.py``'s registry) and by the validation (``api.run_validation``). The drafter and
the target are the validation's arguments, not options. The API key is never stored: the model holds the name of
the environment variable (``api_key_env``) or, for library callers, the key as a secret that no dump or repr shows.
Imports: pydantic, errors, options (layer 3: no torch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from pydantic import Field, SecretStr, field_validator, model_validator

from ..errors import InputError
from ..options import Options

DEFAULT_K = 3  # draft tokens per step in-process when -k is not given (with --server: the server's)


def _split(v: Any) -> Any:
    """``"chat, code"`` -> ``["chat", "code"]`` (a comma-separated flag; an empty one is None); a list as it is."""
    if isinstance(v, str):
        return [x.strip() for x in v.split(",") if x.strip()] if v else None
    return v


class ValidateOptions(Options):
    """The options of one validation (``eagle-migrate validate``; the library's ``validate()`` and
    ``validate_server()``). ``server`` set: the server engine (a running vLLM server measured through its API),
    else ``engine`` (``auto`` | ``vllm`` | ``reference``) in-process."""

    # the run-wide options it takes (options.RunOptions), k under its own name; not dtype: validate serves in the
    # engine's dtype (auto: float32 on a CPU, the model's own on a GPU), not the calibration's
    RUN_FIELDS = {"device": "device", "seed": "seed", "num_speculative_tokens": "k", "engine": "engine",
                  "vllm_python": "vllm_python"}

    engine: str = "auto"  # a registered engine's name (engines.get_engine checks it when the validation starts)
    suites: Optional[list[str]] = None  # None: chat, code, long, template-shift (only --prompts when that is given)
    prompts_file: Optional[str | Path] = None
    k: Optional[int] = None  # None: DEFAULT_K in-process, the server's own k with --server
    baseline: Optional[str | Path] = None
    min_acceptance_length: Optional[float] = None
    max_regression_pct: Optional[float] = None
    report_dir: Optional[str | Path] = None
    num_prompts: Optional[int] = None
    max_tokens: Optional[int] = None
    temperature: float = 0.0
    seed: int = 0
    dtype: str = "auto"
    max_model_len: Optional[int] = None
    tensor_parallel_size: int = 1
    vllm_python: Optional[str] = None
    speedup: bool = False
    diagnostics: bool = True
    diagnostic_sequences: int = 4
    device: str = "auto"
    check: bool = False  # a failed gate raises CheckFailed (after the report is written)
    attention_backend: Optional[str] = None
    # the server engine
    server: Optional[str] = None
    api_key_env: Optional[str] = None  # the name of the variable that holds the key (never the key)
    api_key: Optional[SecretStr] = Field(None, exclude=True, repr=False)  # library callers: the key itself, send-only
    baseline_server: Optional[str] = None
    concurrency: tuple[int, ...] = (1, 4, 16)
    speed_rounds: int = 3
    block_size: int = 4
    # the triage (validate/server_replay.py, validate/triage.py): per-request AL of --prompts on --server
    triage: bool = False
    worst: Optional[tuple[int, Path]] = None  # --worst N FILE: the N lowest-AL requests (+ groups below the pool)
    compare: Optional[str | Path] = None  # --compare OLD/triage.json: its groups before and after (triage_compare.py)

    @field_validator("suites", mode="before")
    @classmethod
    def _suites(cls, v: Any) -> Any:
        return _split(v)

    @field_validator("concurrency", mode="before")
    @classmethod
    def _concurrency(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                return tuple(int(x) for x in v.split(",") if x.strip())
            except ValueError:
                raise InputError(f"--concurrency {v}: not a comma-separated list of integers",
                                 "e.g. --concurrency 1,4,16") from None
        return v

    @field_validator("block_size")
    @classmethod
    def _block_size(cls, v: int) -> int:
        if v < 1:
            raise InputError("--block-size must be at least 1")
        return v

    @model_validator(mode="after")
    def _engine_flags(self) -> ValidateOptions:
        if self.server is not None:
            if self.baseline is not None or self.max_regression_pct is not None or self.speedup:
                raise InputError("--baseline / --max-regression / --speedup run drafters in-process; with --server they "
                                 "do not apply", "compare two servers' reports, or use --baseline-server for the speed-up")
        elif self.baseline_server is not None or self.api_key_env is not None:
            raise InputError("--baseline-server and --api-key-env need --server URL")
        if self.worst is not None and self.worst[0] < 0:
            raise InputError(f"--worst {self.worst[0]}: N must be 0 or more")
        replay = self.triage or self.worst is not None or self.compare is not None
        if replay and (self.server is None or self.prompts_file is None):
            raise InputError("--triage / --worst / --compare replay your prompts on a running server: they need --server URL and "
                             "--prompts FILE", "eagle-migrate validate --server URL --prompts traffic.jsonl --triage")
        if replay and (self.suites is not None or self.baseline_server is not None):
            raise InputError("--triage measures your --prompts request by request: --suite and --baseline-server do "
                             "not apply to it", "drop them, or run the suites without --triage")
        return self

    @property
    def engine_name(self) -> str:
        """The registered engine that measures: ``server`` with a server URL, else ``engine``."""
        return "server" if self.server is not None else self.engine

    @property
    def num_speculative_tokens(self) -> int:
        """k in-process (:data:`DEFAULT_K` when not given)."""
        return DEFAULT_K if self.k is None else self.k
