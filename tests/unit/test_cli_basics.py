"""The CLI shell: help, version, usage errors, and the error -> exit-code mapping of main()."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from eagle_migrate.errors import ERROR_TABLE, CheckFailed, CheckpointError, EagleMigrateError


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "eagle_migrate", *args], capture_output=True, text=True, env=e, timeout=120)


def test_root_help_lists_commands():
    r = run("--help")
    assert r.returncode == 0
    assert "version" in r.stdout and "Exit codes" in r.stdout


def test_version_json_is_one_document():
    r = run("version", "--json")
    assert r.returncode == 0
    from eagle_migrate import __version__

    assert json.loads(r.stdout) == {"version": __version__}


def test_unknown_command_is_usage_error():
    r = run("no-such-command")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("bad", [["--train", "bogus"], ["--no-such-option"]])
def test_usage_error_with_json_is_a_json_error_document(tmp_path, bad):
    r = run("convert", str(tmp_path / "x"), "--target", str(tmp_path / "t"), "-o", str(tmp_path / "o"), *bad, "--json")
    assert r.returncode == 2
    doc = json.loads(r.stdout)  # exactly one JSON document on stdout, even for errors typer reports itself
    assert doc["error"]["code"] == "UsageError" and doc["error"]["exit_code"] == 2
    assert (bad[1] if bad[0] == "--train" else bad[0]) in doc["error"]["message"]
    assert "Usage:" in r.stderr and not (tmp_path / "o").exists()


def test_error_table_exit_codes():
    assert ERROR_TABLE[CheckpointError][0] == 2
    assert ERROR_TABLE[CheckFailed][0] == 1
    assert all(issubclass(c, EagleMigrateError) and hint for c, (_, hint) in ERROR_TABLE.items())


@pytest.mark.parametrize("debug", [False, True])
def test_main_renders_errors_as_one_line(monkeypatch, capsys, debug):
    from eagle_migrate import cli

    @cli.app.command("_boom", hidden=True)
    def _boom() -> None:
        raise CheckpointError("the file is broken", "try another file")

    try:
        if debug:
            monkeypatch.setenv("EAGLE_MIGRATE_DEBUG", "1")
        else:
            monkeypatch.delenv("EAGLE_MIGRATE_DEBUG", raising=False)
        with pytest.raises(SystemExit) as ei:
            cli.main(["_boom"])
        assert ei.value.code == 2  # debug adds the traceback, never changes the exit code
        err = capsys.readouterr().err
        assert "error:" in err and "the file is broken" in err and "hint:" in err
        assert ("Traceback" in err) == debug
    finally:
        cli.app.registered_commands[:] = [c for c in cli.app.registered_commands if c.name != "_boom"]


def test_main_renders_python_warnings_as_one_line_each(monkeypatch, capsys):
    """A library warning (calibration that did not improve, a skipped suite) reaches the user as one `warning:`
    line, not as a file:line header with the source line under it; library deprecations are dropped."""
    import warnings

    from eagle_migrate import cli

    @cli.app.command("_warn", hidden=True)
    def _warn() -> None:
        warnings.warn("calibration did not improve the held-out simulated AL\nsecond line", stacklevel=1)
        warnings.warn("old API", DeprecationWarning, stacklevel=1)
        warnings.warn("odd value", RuntimeWarning, stacklevel=1)

    monkeypatch.delenv("EAGLE_MIGRATE_DEBUG", raising=False)
    saved = warnings.showwarning
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            with pytest.raises(SystemExit) as ei:
                cli.main(["_warn"])
        assert ei.value.code == 0
        lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
        assert lines == ["warning: calibration did not improve the held-out simulated AL", "warning: RuntimeWarning: odd value"]
    finally:
        warnings.showwarning = saved
        cli.app.registered_commands[:] = [c for c in cli.app.registered_commands if c.name != "_warn"]


def test_dash_h_and_version():
    from eagle_migrate import __version__

    r = run("-h")
    assert r.returncode == 0 and "Commands:" in r.stdout and "--version" in r.stdout
    r = run("convert", "-h")
    assert r.returncode == 0 and "--require-improvement" in r.stdout
    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"eagle-migrate {__version__}"


@pytest.mark.parametrize("command", ["convert", "migrate", "validate", "quantize", "publish", "inspect", "demo", "watch"])
def test_help_at_80_columns_keeps_every_option_name_whole(command):
    """At 80 columns: no line wider than 80, every option's full name printed, no `<bool>` placeholder, and the
    root listing's one-line summaries are not cut."""
    import re

    from eagle_migrate.cli import app
    from typer.main import get_command

    cmd = get_command(app).commands[command]
    names = [n for p in cmd.params for n in (p.opts + p.secondary_opts) if n.startswith("--")]
    r = run(command, "--help", env={"COLUMNS": "80", "TERM": "dumb", "NO_COLOR": "1"})
    assert r.returncode == 0
    assert max(len(ln) for ln in r.stdout.splitlines()) <= 80
    for n in names:
        assert re.search(re.escape(n) + r"(?![\w-])", r.stdout), f"{n} cut or missing in {command} --help"
    assert "<bool>" not in r.stdout and "…" not in r.stdout
    root = run("--help", env={"COLUMNS": "80"})
    listing = root.stdout.split("Commands:", 1)[1]
    assert "..." not in listing and "…" not in listing
