"""Rendering helpers shared by the commands: one JSON document on stdout, rich tables, stderr logs, progress."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape

from ..errors import redact

stdout = Console(soft_wrap=True)
stderr = Console(stderr=True, soft_wrap=True)


def to_jsonable(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if hasattr(obj, "__dataclass_fields__"):
        import dataclasses

        return to_jsonable(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "__fspath__"):
        return str(obj)
    return obj


def _redacted(obj: Any) -> Any:
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {k: _redacted(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_redacted(v) for v in obj]
    return obj


json_documents_printed = 0  # main() prints a failure document only when the command printed none
interrupted_reported = False  # main() prints the "interrupted" line once


def evidence_rows(aux: Any, nbr: Any = None) -> list[tuple[str, str]]:
    """Table rows for a measurement's evidence (aux-id convention; norm_before_residual): the statistic, both
    readings, the paired difference with its SE, the positions and the verdict."""
    rows: list[tuple[str, str]] = []
    for label, m in (("aux-id evidence", getattr(aux, "measurement", None)), ("norm_before_residual evidence", nbr)):
        if m is None:
            continue
        a, b = m.readings
        rows.append((label, f"{m.statistic}: {a} {m.mean.get(a, float('nan')):.4f}, {b} {m.mean.get(b, float('nan')):.4f}; "
                            f"difference {m.difference:+.4f} +- {m.standard_error:.4f} (SE, by sequence) on {m.positions} "
                            f"positions / {m.sequences} sequences -> {m.winner or m.verdict} ({m.seconds:.1f} s; top-1 "
                            f"agreement {m.agreement.get(a, float('nan')):.3f} vs {m.agreement.get(b, float('nan')):.3f})"))
    return rows


def print_json(obj: Any) -> None:
    """Exactly one JSON document on stdout (credentials in URLs redacted)."""
    global json_documents_printed
    json_documents_printed += 1
    sys.stdout.write(json.dumps(_redacted(to_jsonable(obj)), indent=2, default=str) + "\n")
    sys.stdout.flush()


def print_json_line(obj: Any) -> None:
    """One JSON document on one line of stdout (a stream of them: ``watch --json``), credentials redacted."""
    global json_documents_printed
    json_documents_printed += 1
    sys.stdout.write(json.dumps(_redacted(to_jsonable(obj)), default=str) + "\n")
    sys.stdout.flush()


def print_error(message: str, hint: str | None) -> None:
    stderr.print(f"[bold red]error:[/] {escape(redact(message))}", highlight=False, markup=True)
    if hint:
        stderr.print(f"[dim]hint:[/] {escape(redact(hint))}", highlight=False)


def print_warning(message: str) -> None:
    stderr.print(f"[bold yellow]warning:[/] {escape(redact(message))}", highlight=False, markup=True)


def install_warning_handler(debug: bool) -> None:
    """Python warnings become one stderr line each (``warning: ...``), without the source line under it; outside
    debug mode the deprecation chatter of the libraries we call is dropped."""
    import warnings

    if not debug:
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ARG001 - the warnings API
        text = str(message).splitlines()[0] if str(message) else category.__name__
        print_warning(text if category is UserWarning else f"{category.__name__}: {text}")

    warnings.showwarning = show


def log(message: str) -> None:
    stderr.print(redact(message), highlight=False)


def log_plain(message: str) -> None:
    """A log line printed as is (no rich markup: ``[convert] running`` keeps its brackets)."""
    stderr.print(redact(message), highlight=False, markup=False)


def progress_enabled(json_mode: bool) -> bool:
    return not json_mode and sys.stderr.isatty()


class StageBar:
    """The one progress display (a :class:`eagle_migrate.progress.StageProgress`): stage-wise rich bars on stderr on a
    TTY; elsewhere (``--json``, CI logs) one ``command: stage done/total (elapsed, ETA) info`` line on stderr when a
    stage starts, when it ends, and at least every ``LOG_EVERY`` seconds while the command runs: a heartbeat thread
    repeats the current stage's line (``still running``) when the library has reported nothing for that long (a
    long evaluation, loading a model), so long work is never silent."""

    LOG_EVERY = 10.0

    def __init__(self, command: str, json_mode: bool, clock=time.monotonic, heartbeat: bool = True):
        self.command = command
        self.enabled = progress_enabled(json_mode)
        self._clock = clock
        self._p = None
        self._tasks: dict[str, int] = {}
        self._last: dict[str, float] = {}
        self._ended: set[str] = set()
        self._t0 = clock()
        self._started: dict[str, float] = {}
        self._current: tuple[str, int, int | None, str] | None = None
        self._done: str | None = None  # the last stage that ended
        self._last_line = self._t0
        self._heartbeat = heartbeat
        self._stop = None
        self._lock = None

    def __enter__(self):
        import threading

        self._lock = threading.Lock()
        if self.enabled:
            # lazy: rich.progress loads only when a bar is drawn (--help stays fast)
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            self._p = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                               TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=stderr, transient=False)
            self._p.__enter__()
        elif self._heartbeat:
            self._stop = threading.Event()
            threading.Thread(target=self._beat, name="progress-heartbeat", daemon=True).start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(1.0):
            self.tick()

    def _line(self, stage: str, done: int, total: int | None, info: str, now: float, still: bool = False) -> str:
        of = f"/{total}" if total is not None else ""
        t = f"{now - self._t0:.0f} s"
        since = self._started.get(stage, now)
        if total and 0 < done < total and now > since:
            t += f", ETA {(now - since) / done * (total - done):.0f} s"
        return (f"{self.command}: {stage} {done}{of} ({t})" + (" still running" if still else "")
                + (f" {info}" if info else ""))

    def tick(self) -> None:
        """The heartbeat: the current stage's line again when nothing was printed for ``LOG_EVERY`` seconds."""
        if self._p is not None or self._lock is None or (self._current is None and self._done is None):
            return
        with self._lock:
            now = self._clock()
            if now - self._last_line < self.LOG_EVERY:
                return
            self._last_line = now
            if self._current is None:  # between stages (loading the target, preparing the next one)
                log_plain(f"{self.command}: still running ({now - self._t0:.0f} s; {self._done} done)")
                return
            stage, done, total, info = self._current
            log_plain(self._line(stage, done, total, info, now, still=True))

    def __call__(self, stage: str, done: int, total: int | None, info: str = "") -> None:
        if self._p is None:
            import contextlib

            with self._lock or contextlib.nullcontext():
                now = self._clock()
                first = stage not in self._last
                if first:
                    self._started[stage] = now
                end = total is not None and done >= total and stage not in self._ended
                if end:
                    self._ended.add(stage)
                finished = total is not None and done >= total  # a finished stage is never the one in flight
                self._current = None if finished else (stage, done, total, info)
                if end:
                    self._done = stage
                if first or end or (stage not in self._ended and now - self._last_line >= self.LOG_EVERY):
                    self._last[stage] = self._last_line = now
                    log_plain(self._line(stage, done, total, info, now))
            return
        if stage not in self._tasks:
            self._tasks[stage] = self._p.add_task(stage, total=total, info="")
        self._p.update(self._tasks[stage], completed=done, total=total, info=info or "")

    def __exit__(self, *exc):
        if self._stop is not None:
            self._stop.set()
        if self._p is not None:
            self._p.__exit__(*exc)
        return False
