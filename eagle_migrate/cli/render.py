"""Rendering helpers shared by the commands: one JSON document on stdout, rich tables, stderr logs, progress."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from pydantic import BaseModel
from rich.console import Console

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


def print_error(message: str, hint: str | None) -> None:
    from rich.markup import escape

    stderr.print(f"[bold red]error:[/] {escape(redact(message))}", highlight=False, markup=True)
    if hint:
        stderr.print(f"[dim]hint:[/] {escape(redact(hint))}", highlight=False)


def print_warning(message: str) -> None:
    from rich.markup import escape

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
    TTY; elsewhere (``--json``, CI logs) one ``command: stage done/total (s) info`` line on stderr when a stage starts,
    at most one every 30 s while it runs, and one when it ends, so long work is never silent."""

    LOG_EVERY = 30.0

    def __init__(self, command: str, json_mode: bool):
        self.command = command
        self.enabled = progress_enabled(json_mode)
        self._p = None
        self._tasks: dict[str, int] = {}
        self._last: dict[str, float] = {}
        self._ended: set[str] = set()
        self._t0 = time.monotonic()

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._p = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                               TextColumn("{task.fields[info]}"), console=stderr, transient=False)
            self._p.__enter__()
        return self

    def __call__(self, stage: str, done: int, total: int | None, info: str = "") -> None:
        if self._p is None:
            now = time.monotonic()
            first = stage not in self._last
            end = total is not None and done >= total and stage not in self._ended
            if end:
                self._ended.add(stage)
            if first or end or (stage not in self._ended and now - self._last[stage] >= self.LOG_EVERY):
                self._last[stage] = now
                of = f"/{total}" if total is not None else ""
                log(f"{self.command}: {stage} {done}{of} ({now - self._t0:.0f} s)" + (f" {info}" if info else ""))
            return
        if stage not in self._tasks:
            self._tasks[stage] = self._p.add_task(stage, total=total, info="")
        self._p.update(self._tasks[stage], completed=done, total=total, info=info or "")

    def __exit__(self, *exc):
        if self._p is not None:
            self._p.__exit__(*exc)
        return False
