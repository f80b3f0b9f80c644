"""The one exception hierarchy and its table of exit codes and hints.

Every error a user can cause maps to one line on stderr (``error: <message>`` then ``hint: <hint>``) and an exit
code: 2 for bad input or usage, 1 for a check that ran and failed. ``EAGLE_MIGRATE_DEBUG=1`` shows the traceback.
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
from collections.abc import Iterator

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2


class EagleMigrateError(Exception):
    """Base class. ``hint`` is one line telling the user what to do next."""

    exit_code: int = EXIT_BAD_INPUT
    default_hint: str = "run with EAGLE_MIGRATE_DEBUG=1 for the traceback"

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else self.default_hint


class InputError(EagleMigrateError):
    """A path, option or file given by the user cannot be used."""

    default_hint = "check the path and the option values (see --help)"


class CheckpointError(InputError):
    """A drafter checkpoint is missing, unreadable, malformed or self-contradicting."""

    default_hint = "run `eagle-migrate inspect PATH` on a copy you trust; the input was not modified"


class UnsafeInputError(CheckpointError):
    """A file would need unsafe deserialisation (arbitrary pickle)."""

    default_hint = "convert the file to safetensors with a tool you trust; eagle-migrate never unpickles code"


class UnsupportedError(InputError):
    """Recognised, but not something this version can convert (e.g. a drafter its family's vLLM class cannot load)."""

    default_hint = "open an issue with `eagle-migrate inspect PATH --json` attached"


class TargetError(InputError):
    """The target model cannot be loaded or read."""

    default_hint = "pass a local folder with config.json and weights, or a hub id (set HF_HUB_OFFLINE=1 to stay offline)"


class PairingError(InputError):
    """Drafter and target do not fit together (hidden size, vocab, aux layer ids)."""

    default_hint = "pass the target the drafter was trained for; `eagle-migrate inspect CKPT --target T` lists every mismatch"


class DataError(InputError):
    """Calibration or evaluation data cannot be read."""

    default_hint = "see docs/cli.md for the accepted --data / --prompts layouts"


class OutputExistsError(InputError):
    """The output folder exists and --force was not given."""

    default_hint = "pass --force to replace it, or choose another -o"


class ServerError(InputError):
    """A running inference server cannot be measured: unreachable, the API key refused, no speculative decoding,
    metric names this version does not read, or other traffic moving its counters during a measurement."""

    default_hint = "check --server URL (GET URL/health must answer) and --api-key-env; see docs/validate.md"


class EngineError(EagleMigrateError):
    """An inference engine (vLLM worker) failed to start or run."""

    exit_code = EXIT_CHECK_FAILED
    default_hint = "re-run with EAGLE_MIGRATE_DEBUG=1 to see the engine's log, or use --engine reference"


class HubError(EagleMigrateError):
    """The Hub could not be reached or refused the upload for a reason other than the input."""

    exit_code = EXIT_CHECK_FAILED
    default_hint = "the repo folder was built; re-run the same command (the commit is all-or-nothing)"


class CheckFailed(EagleMigrateError):
    """A quality gate ran and did not pass (e.g. --min-acceptance-length)."""

    exit_code = EXIT_CHECK_FAILED
    default_hint = "see the report for the failing suite; the thresholds are the options you passed"


class Interrupted(KeyboardInterrupt):
    """Raised in the main thread when the process gets SIGTERM (:func:`sigterm_raises`; SIGINT raises
    KeyboardInterrupt): every ``finally`` and cleanup runs, as for Ctrl-C, and the exit code is 128 + ``signum``."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """While the block runs, SIGTERM (``timeout``, ``kill``, a container stop) raises :class:`Interrupted` in the main
    thread instead of ending the process where it stands: temporary folders are removed and locks released. Outside
    the main thread signals are left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise Interrupted(signum)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


# The table: class -> (exit code, default hint). docs/cli.md is generated from it.
ERROR_TABLE: dict[type[EagleMigrateError], tuple[int, str]] = {
    cls: (cls.exit_code, cls.default_hint)
    for cls in (
        InputError,
        CheckpointError,
        UnsafeInputError,
        UnsupportedError,
        TargetError,
        PairingError,
        DataError,
        OutputExistsError,
        ServerError,
        EngineError,
        HubError,
        CheckFailed,
    )
}


# ----- credentials never leave in what we print or write ---------------------------------------------------------
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<cred>[^/@\s:]*(?::[^/@\s]*)?)@")
_HF_TOKEN = re.compile(r"hf_[A-Za-z0-9]{6,}")


def redact(text: str, *secrets: str | None, tokens: bool = True) -> str:
    """``text`` with credentials removed: ``user:password@`` in URLs (``https://user:token@host`` ->
    ``https://***@host``), anything shaped like a Hub token (unless ``tokens=False``), and the given ``secrets``."""
    if not isinstance(text, str) or not text:
        return text
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    text = _URL_CREDENTIALS.sub(lambda m: m.group("scheme") + "***@", text)
    return _HF_TOKEN.sub("hf_***", text) if tokens else text


def a_an(thing: object) -> str:
    """``thing`` with its indefinite article as English reads it: "an 8-layer", "a 12-layer", "an 11-token",
    "an eagle2", "a list". A number takes "an" when it is read starting with "eight" or "eleven" / "eighteen"
    (8, 80, 800, 8000, 11, 18, 11000, 18000, ...); a word when it starts with a vowel (not "uni", "use", "eu",
    "one")."""
    s = str(thing)
    digits = re.match(r"\d+", s.replace(",", ""))
    if digits:
        n = digits.group(0).lstrip("0") or "0"
        lead = n[: len(n) % 3 or 3]  # the leading group of three digits: how the number is read first
        an = lead.startswith("8") or lead in ("11", "18")
    else:
        w = s.lower()
        an = w[:1] in ("a", "e", "i", "o", "u") and not w.startswith(("uni", "use", "usu", "eu", "one", "once"))
    return f"{'an' if an else 'a'} {s}"
