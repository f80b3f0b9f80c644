"""Rendering helpers shared by the commands: one JSON document on stdout, rich tables, stderr logs, progress."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
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


@contextlib.contextmanager
def progress(json_mode: bool, description: str, total: float | None = None) -> Iterator[Any]:
    """A rich progress bar on stderr, or a no-op when --json is set or stderr is not a TTY.

    Yields ``update(advance=1, **fields)``.
    """
    if not progress_enabled(json_mode):
        yield lambda advance=1, **kw: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"), console=stderr, transient=False,
    ) as p:
        task = p.add_task(description, total=total, info="")

        def update(advance: float = 1, info: str | None = None) -> None:
            p.update(task, advance=advance, **({"info": info} if info is not None else {}))

        yield update
