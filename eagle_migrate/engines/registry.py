"""The engines that measure acceptance, registered by name, and the one interface they share.

An :class:`Engine` is registered under its name with :func:`register_engine`; :func:`get_engine` finds it. Every
engine takes one :class:`~eagle_migrate.engines.options.ValidateOptions`:

* :meth:`Engine.open` starts one validation (a :class:`Session`): it checks the inputs, says what the suites are
  built with (tokenizer, the target's config, context length, k), measures the suites' jobs for the drafters it
  serves (:meth:`Session.measure` -> :class:`Measured`) and says what the report records about the engine. The
  validation itself (suites, gates, report: ``validate/api.py``'s :func:`~eagle_migrate.validate.api.run_validation`)
  is the same code whichever engine measures.
* :meth:`Engine.measure` (in-process engines): the counters of given drafters on given jobs (:class:`EngineRun`):
  what quantize's gate and calibration's held-out continuations call through ``engines.in_process.run_engine``.
* what callers would otherwise settle by the engine's name, asked of the engine: whether it runs a quantization
  scheme here (:meth:`Engine.runs_scheme`), in which layout it loads a dense drafter (:meth:`Engine.dense_source`),
  whether it reuses a target already loaded in this process (``reuses_loaded_target``), whether its counters are
  vLLM's own (``serves_vllm``), what its measurement of a quantized drafter means (:meth:`Engine.quantized_note`),
  and why, asked for, it measures without vLLM here (:meth:`Engine.fallback_note`).
* :meth:`Engine.continuations`: the target's greedy continuations of held-out prompts (calibration's judge, the
  target's own text), or None when the engine makes none and the caller's transformers generate does;
  :meth:`Engine.version` keys their cache.

Built in: ``vllm`` and ``reference`` (in-process; ``engines/in_process.py``), ``auto`` (vLLM when it is importable, else
the reference engine; ``engines/in_process.py``), ``server`` (a running vLLM server; ``engines/server.py``, registered
when the validate stage is imported). docs/extending.md: "Add an engine".
Imports: errors only (layer 3: no torch; the engines register themselves here, this module imports none of them).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from ..errors import InputError, UnsupportedError

Results = dict[str, tuple[Any, dict[str, Any]]]  # {job: (AcceptanceStats, extra)} of one drafter
Log = Callable[[str], None]
Progress = Callable[..., None]  # a StageProgress: (stage, done, total, info)


@dataclass
class EngineRun:
    """What an engine measured for a list of drafters: per drafter ``{job: (stats, extra)}`` (None for one the
    engine refused), and how."""

    results: list[Results | None]
    engine_version: str | None
    dtype: str | None
    target_obj: Any = None  # the loaded target (reference engine), for reuse
    attention: dict[str, Any] | None = None  # vLLM: the attention backends asked for, and why (attention_backend.py)


@dataclass
class Measured:
    """One validation's measurement: the results per role (``new``: the drafter validated; ``baseline``; ``plain``:
    the target alone, for the speed-up), how it was measured, and why a drafter was refused (the others' results
    are kept: the report records what was measured)."""

    new: Results | None
    baseline: Results | None = None
    plain: Results | None = None
    engine_version: str | None = None
    dtype: str | None = None
    attention: dict[str, Any] | None = None
    refusal: str | None = None
    target_obj: Any = None


@dataclass
class Session(ABC):
    """One validation on one engine, opened by :meth:`Engine.open` (a context manager: :meth:`close` at the end).

    The attributes are what the shared validation reads: the engine's name as the report records it, the drafter
    (``checkpoint``, its weights' sha256) and ``baseline`` measured, the target as recorded, the tokenizer and the
    target's config the suites are built with, the context the suites must fit and k; ``aux`` / ``warnings``: how
    the drafters' aux layer ids are served (``api.aux_ids_status``)."""

    engine: str
    checkpoint: str | None
    target: str
    tokenizer: Any
    info: Any
    max_model_len: int
    k: int
    weights_sha: str | None = None
    baseline: str | None = None
    aux: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    #: the engine counts per request (each request a cluster of the standard error); False: per block (server)
    per_request: ClassVar[bool] = True

    @abstractmethod
    def measure(self, jobs: dict[str, dict[str, Any]], progress: Progress | None = None) -> Measured:
        """The counters of every drafter this session serves on every job ``{"prompts", "max_tokens"}``."""

    @abstractmethod
    def settings(self, measured: Measured) -> dict[str, Any]:
        """The report's ``settings``: how the suites were run."""

    def finish(self, built: list[Any], jobs: dict[str, Any], measured: Measured, suite_results: list[Any]) -> None:
        """What the engine adds once the suites' results are built (standard errors it counts its own way)."""

    def report_fields(self) -> dict[str, Any]:
        """Fields of the report only this engine fills (the server's description, its serving speed)."""
        return {}

    def close(self) -> None:
        """Release what :meth:`Engine.open` holds (connections)."""

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Engine(ABC):
    """One way to measure acceptance, registered by ``name``. ``in_process``: it loads the drafters it measures
    (baselines, the speed-up and the drift diagnostics need that); the server engine measures the one it serves."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    in_process: ClassVar[bool] = True
    #: it measures on a target already loaded in this process (``target_obj``), which the caller may pass and reuse
    reuses_loaded_target: ClassVar[bool] = False
    #: its counters are vLLM's own, as a server reports them (else a re-implementation of vLLM's algorithm)
    serves_vllm: ClassVar[bool] = False
    #: asked for, it measures where it can (``auto``): without a target nothing is measured, and that is no error
    optional: ClassVar[bool] = False

    def runs_scheme(self, scheme: Any, cuda: bool) -> bool:
        """Whether it measures a drafter quantized with ``scheme`` (a quant.SchemeConfig) here (``cuda``: a GPU)."""
        return True

    def dense_source(self, source: Any, cfg: Any, state_dict: dict[str, Any], work: Any) -> Any:
        """The unquantized drafter in a layout this engine loads: ``source`` itself (any layout it reads), or a copy
        it writes under the folder ``work`` (``cfg`` and ``state_dict``: the drafter read)."""
        return source

    def quantized_note(self, scheme: Any) -> str | None:
        """What its measurement of a quantized drafter means, when that needs saying (the report's note)."""
        return None

    def fallback_note(self, used: str, vllm_python: str | None = None) -> str | None:
        """Asked for by name, when the engine ``used`` measured: why that is not vLLM (``auto`` where vLLM is not
        importable in ``vllm_python``), in one sentence; None when it measured as asked."""
        return None

    def continuations(self, target: str, prompts: dict[str, list[list[int]]], new_tokens: int | dict[str, int], *,
                      dtype: str = "float32", max_model_len: int = 8192, python: str | None = None,
                      ignore_eos: bool = False, skip_tokenizer_init: bool = False, max_num_seqs: int | None = None,
                      progress: Callable[[int, int, str], None] | None = None) -> dict[str, list[list[int]]] | None:
        """The target alone continuing each prompt greedily for ``new_tokens`` tokens (or ``new_tokens[suite]``): per suite, each prompt's
        continuation (token ids); None when this engine makes none (the caller's transformers generate does).
        ``max_num_seqs``: the sequences the engine runs at once (None: its default); ``progress``: ``(done, total,
        info)`` suite by suite."""
        return None

    def version(self, python: str | None = None) -> str | None:
        """What its continuations depend on beyond the target and the settings (its version and interpreter): the
        continuations' cache key; None: not cached."""
        return None

    def available(self, vllm_python: str | None = None) -> bool:
        """Whether the engine can run here (``vllm_python``: the interpreter that would serve vLLM)."""
        return True

    def check(self, vllm_python: str | None = None) -> None:
        """Raise (EngineError) when the engine cannot run here; the hint says what to do."""

    @abstractmethod
    def open(self, checkpoint: Any, target: Any, opts: Any, log: Log) -> Session:
        """Start one validation of ``checkpoint`` on ``target`` with ``opts`` (ValidateOptions)."""

    def measure(self, target: str, drafters: list[Any], jobs: dict[str, dict[str, Any]], opts: Any, *,
                max_model_len: int, skip_tokenizer_init: bool = False, target_obj: Any = None,
                per_request: bool = False, progress: Progress | None = None) -> EngineRun:
        """The counters of each drafter (a checkpoint path, or None for the target alone) on each job."""
        raise UnsupportedError(f"the {self.name} engine measures only the drafter it serves",
                               "measure given drafters with --engine vllm or --engine reference")


E = TypeVar("E", bound=type[Engine])
_ENGINES: dict[str, Engine] = {}


def register_engine(cls: E) -> E:
    """Class decorator: register an engine under its ``name`` (one engine per name)."""
    if cls.name in _ENGINES:
        raise ValueError(f"an engine named {cls.name!r} is already registered ({type(_ENGINES[cls.name]).__name__})")
    _ENGINES[cls.name] = cls()
    return cls


def unregister_engine(name: str) -> None:
    """Remove the engine registered as ``name`` (tests, and a plugin that replaces one)."""
    _ENGINES.pop(name, None)


def get_engine(name: str) -> Engine:
    """The engine registered as ``name``; InputError (exit 2) naming the registered ones otherwise."""
    try:
        return _ENGINES[name]
    except KeyError:
        raise InputError(f"unknown engine '{name}'", "use --engine vllm or --engine reference") from None


def engine_names() -> tuple[str, ...]:
    """The registered engines' names, in registration order."""
    return tuple(_ENGINES)
