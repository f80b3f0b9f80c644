"""The typer app. Commands only parse options, call one library function and render its typed result.

Each command lives in its own module (``cli/inspect.py``, ...) and registers itself on ``app``; ``main()`` maps
every ``EagleMigrateError`` to one line on stderr plus a hint and the error's exit code.
"""

from __future__ import annotations

import os
import sys

import typer

from ..errors import EagleMigrateError

app = typer.Typer(
    name="eagle-migrate",
    help=(
        "Inspect, convert to EAGLE-3.1, calibrate, quantize, validate and publish EAGLE speculative-decoding drafters."
        "\n\nExit codes: 0 ok, 1 a check failed, 2 bad input or usage. EAGLE_MIGRATE_DEBUG=1 shows tracebacks."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _register() -> None:
    """Import every command module; a missing module (or a dependency one needs) is an error, never a silently
    missing command."""
    from importlib import import_module

    for mod in ("inspect", "convert", "quantize", "validate", "publish", "migrate", "demo", "version"):
        import_module(f"{__name__}.{mod}")


_register()


@app.callback()
def _root() -> None:
    """Group callback: keeps single-command apps a group."""


def main(argv: list[str] | None = None) -> int:
    """Console entry point: typer handles usage errors (exit 2); our errors become one line + hint."""
    debug = os.environ.get("EAGLE_MIGRATE_DEBUG", "") not in ("", "0")
    from ..allocator import fixed_mmap_threshold

    fixed_mmap_threshold()  # every command: freed tensors go back to the OS instead of fragmenting the heap
    from .render import install_warning_handler

    install_warning_handler(debug)
    if not sys.stderr.isatty() or "--json" in (sys.argv[1:] if argv is None else argv):
        # progress bars only on a terminal and never with --json: ours check this themselves; this turns off
        # the ones transformers and huggingface_hub draw (loading weights, downloads)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    args = sys.argv[1:] if argv is None else list(argv)
    json_mode = "--json" in args
    from . import render

    render.json_documents_printed = 0
    real_stderr = sys.stderr
    if json_mode:  # typer prints usage errors itself: keep a copy to put into the JSON error document
        sys.stderr = _Tee(real_stderr)
    try:
        app(args=argv, prog_name="eagle-migrate", standalone_mode=True)
        return 0
    except SystemExit as e:
        if json_mode and e.code == 2 and not render.json_documents_printed and isinstance(sys.stderr, _Tee):
            message = _usage_message(sys.stderr.captured()) or "invalid command-line usage"
            sys.stderr = real_stderr
            render.print_json({"error": {"code": "UsageError", "message": message,
                                         "hint": "see 'eagle-migrate COMMAND --help'", "exit_code": 2}})
        raise
    except EagleMigrateError as e:
        _fail(e.__class__.__name__, e.message, e.hint, e.exit_code, debug, json_mode)
    except KeyboardInterrupt:
        raise
    except Exception as e:
        first = str(e).splitlines()[0][:300] if str(e) else ""
        _fail("InternalError", f"unexpected {e.__class__.__name__}: {first}",
              "this is a bug in eagle-migrate: re-run with EAGLE_MIGRATE_DEBUG=1 and report the traceback", 1, debug, json_mode)
    finally:
        sys.stderr = real_stderr
    return 0


class _Tee:
    """stderr that also keeps what was written (typer's usage errors, for the ``--json`` error document)."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self._parts: list[str] = []

    def write(self, s: str) -> int:
        self._parts.append(s)
        return self._stream.write(s)

    def captured(self) -> str:
        return "".join(self._parts)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _usage_message(text: str) -> str:
    """The error inside typer's usage output (its boxed 'Error' panel, or click's 'Error: ...' line), on one line."""
    lines = [ln.strip().strip("│╭╮╰╯─").strip() for ln in text.splitlines()]
    keep = [ln for ln in lines if ln and not ln.startswith(("Usage:", "Try ")) and ln.strip("─ ") != "Error"]
    msg = " ".join(keep)
    return msg[len("Error:"):].strip() if msg.startswith("Error:") else msg


def _fail(code: str, message: str, hint: str | None, exit_code: int, debug: bool, json_mode: bool) -> None:
    """One line (+ hint) on stderr, the JSON error document on stdout with ``--json``; debug adds the traceback
    but never changes the exit code."""
    from . import render
    from .render import print_error, print_json, redact

    if debug:
        import traceback

        traceback.print_exc(file=sys.stderr)
    message, hint = redact(message), redact(hint) if hint else hint
    print_error(message, hint)
    if json_mode and not render.json_documents_printed:  # a command that printed its result keeps it the only one
        print_json({"error": {"code": code, "message": message, "hint": hint, "exit_code": exit_code}})
    raise SystemExit(exit_code) from None
