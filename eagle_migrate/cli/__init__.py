"""The typer app. Commands only parse options, call one library function and render its typed result.

Each command lives in its own module (``cli/inspect.py``, ...) with its options model beside it, and is registered
on ``app`` below, one line each; ``main()`` maps
every ``EagleMigrateError`` to one line on stderr plus a hint and the error's exit code.
"""

from __future__ import annotations

import os
import sys

import typer

from .. import __version__
from ..allocator import fixed_mmap_threshold
from ..errors import EagleMigrateError, Interrupted, sigterm_raises
from . import convert, demo, inspect, migrate, publish, quantize, render, validate, version, watch
from .render import install_warning_handler, print_error, print_json, redact

app = typer.Typer(
    name="eagle-migrate",
    help=(
        "Inspect, convert to EAGLE-3.1, calibrate, quantize, validate and publish EAGLE speculative-decoding drafters."
        "\n\nExit codes: 0 ok, 1 a check failed, 2 bad input or usage. EAGLE_MIGRATE_DEBUG=1 shows tracebacks."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help: option names are never cut and no `<bool>` placeholders at 80 columns (rich's panels
    # squeezed both); -h is --help for every command
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


# every command, registered in one line each (huggingface_hub's cli/hf.py): its function lives in cli/<name>.py with
# its options model beside it (``options_model``, in COMMANDS: imported when the command runs, so --help stays fast)
app.command(short_help="What a drafter checkpoint is and what vLLM will do with it.")(inspect.inspect)
app.command(short_help="Convert an EAGLE-2/3 drafter to EAGLE-3.1 (+ calibration).")(convert.convert)
app.command(short_help="Quantize a drafter to FP8 or NVFP4 (compressed-tensors).")(quantize.quantize)
app.command(short_help="Measure acceptance length per suite (vLLM or reference).")(validate.validate)
app.command(short_help="Watch a live deployment's acceptance against what was validated.")(watch.watch)
app.command(short_help="Upload a validated drafter to the Hugging Face Hub.")(publish.publish)
app.command(short_help="Every stage, inspect to publish, in one resumable run.")(migrate.migrate)
app.command(short_help="The pipeline on a toy pair built to drift (or --real).")(demo.demo)
app.command(short_help="Print the eagle-migrate version.")(version.version)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"eagle-migrate {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Group callback: keeps single-command apps a group; --version."""


def main(argv: list[str] | None = None) -> int:
    """Console entry point: typer handles usage errors (exit 2); our errors become one line + hint."""
    debug = os.environ.get("EAGLE_MIGRATE_DEBUG", "") not in ("", "0")
    fixed_mmap_threshold()  # every command: freed tensors go back to the OS instead of fragmenting the heap
    install_warning_handler(debug)
    if not sys.stderr.isatty() or "--json" in (sys.argv[1:] if argv is None else argv):
        # progress bars only on a terminal and never with --json: ours check this themselves; this turns off
        # the ones transformers and huggingface_hub draw (loading weights, downloads)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    args = sys.argv[1:] if argv is None else list(argv)
    json_mode = "--json" in args
    render.json_documents_printed = 0
    render.interrupted_reported = False
    real_stderr = sys.stderr
    if json_mode:  # typer prints usage errors itself: keep a copy to put into the JSON error document
        sys.stderr = _Tee(real_stderr)
    try:
        with sigterm_raises():  # SIGTERM unwinds like Ctrl-C: temporary outputs removed, then exit 143
            app(args=argv, prog_name="eagle-migrate", standalone_mode=True)
        return 0
    except SystemExit as e:
        term = _interrupted_by(e)
        if e.code == 130 and term is not None:  # typer says 130 for any KeyboardInterrupt, SIGTERM's included
            e = SystemExit(128 + term.signum)
        if e.code in INTERRUPTED_CODES and not render.interrupted_reported:
            sys.stderr = real_stderr
            _interrupted(args, int(e.code), json_mode)
        if json_mode and e.code == 2 and not render.json_documents_printed and isinstance(sys.stderr, _Tee):
            message = _usage_message(sys.stderr.captured()) or "invalid command-line usage"
            sys.stderr = real_stderr
            render.print_json({"error": {"code": "UsageError", "message": message,
                                         "hint": "see 'eagle-migrate COMMAND --help'", "exit_code": 2}})
        raise e from None
    except EagleMigrateError as e:
        _fail(e.__class__.__name__, e.message, e.hint, e.exit_code, debug, json_mode)
    except KeyboardInterrupt as e:  # outside typer (while importing): the same line and code
        sys.stderr = real_stderr
        code = 128 + e.signum if isinstance(e, Interrupted) else 130
        _interrupted(args, code, json_mode)
        raise SystemExit(code) from None
    except Exception as e:
        first = str(e).splitlines()[0][:300] if str(e) else ""
        _fail("InternalError", f"unexpected {e.__class__.__name__}: {first}",
              "this is a bug in eagle-migrate: re-run with EAGLE_MIGRATE_DEBUG=1 and report the traceback", 1, debug, json_mode)
    finally:
        sys.stderr = real_stderr
    return 0


def _interrupted_by(exc: BaseException) -> Interrupted | None:
    """The :class:`Interrupted` (SIGTERM) behind typer's exit, if one is in its chain of causes."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, Interrupted):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


INTERRUPTED_CODES = (130, 143)  # 128 + SIGINT (typer turns Ctrl-C into exit 130), 128 + SIGTERM


def interrupted_line(args: list[str]) -> str:
    """The one line Ctrl-C prints: migrate and demo resume where they stopped when run again (their stage folders
    are written atomically); every other command writes its output only when it finishes (a temporary folder
    renamed at the end, removed when interrupted), so nothing was written; convert --resume DIR continues its
    calibration from the last saved step."""
    import shlex

    cmd = next((a for a in args if not a.startswith("-")), "")
    again = "eagle-migrate " + shlex.join(args)
    if cmd in ("migrate", "demo"):
        return f"interrupted; resume with: {again}"
    if cmd == "convert" and any(a == "--resume" or a.startswith("--resume=") for a in args):
        return f"interrupted; nothing was written; continue from the last saved calibration step with: {again}"
    return "interrupted; nothing was written"


def _interrupted(args: list[str], code: int, json_mode: bool) -> None:
    render.interrupted_reported = True
    line = interrupted_line(args)
    render.log_plain(line)
    if json_mode and not render.json_documents_printed:
        render.print_json({"error": {"code": "Interrupted", "message": line, "hint": None, "exit_code": code}})


class _Tee:
    """stderr that also keeps what was written (typer's usage errors, for the ``--json`` error document)."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self._parts: list[str] = []

    def write(self, s: str | bytes) -> int:
        if isinstance(s, (bytes, bytearray)):  # click's plain help writes usage errors as bytes
            s = bytes(s).decode("utf-8", "replace")
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
    if debug:
        import traceback

        traceback.print_exc(file=sys.stderr)
    message, hint = redact(message), redact(hint) if hint else hint
    print_error(message, hint)
    if json_mode and not render.json_documents_printed:  # a command that printed its result keeps it the only one
        print_json({"error": {"code": code, "message": message, "hint": hint, "exit_code": exit_code}})
    raise SystemExit(exit_code) from None
