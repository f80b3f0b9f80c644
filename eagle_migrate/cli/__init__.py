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
    from importlib import import_module

    for mod in ("inspect", "convert", "quantize", "validate", "publish", "migrate", "demo", "version"):
        try:
            import_module(f"{__name__}.{mod}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{mod}":
                raise


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
    try:
        app(args=argv, prog_name="eagle-migrate", standalone_mode=True)
        return 0
    except EagleMigrateError as e:
        if debug:
            raise
        from .render import print_error

        print_error(e.message, e.hint)
        raise SystemExit(e.exit_code) from None
    except (SystemExit, KeyboardInterrupt):
        raise
    except Exception as e:
        if debug:
            raise
        from .render import print_error

        first = str(e).splitlines()[0][:300] if str(e) else ""
        print_error(
            f"unexpected {e.__class__.__name__}: {first}",
            "this is a bug in eagle-migrate: re-run with EAGLE_MIGRATE_DEBUG=1 and report the traceback",
        )
        raise SystemExit(1) from None
