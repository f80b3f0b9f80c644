"""Ctrl-C and SIGTERM: one line (with the resume command for migrate), exit 130 / 143, nothing half-written (temporary
folders gone)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from eagle_migrate import toy
from eagle_migrate.cli import interrupted_line, main


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def _run(capsys, argv):
    with pytest.raises(SystemExit) as ei:
        main(argv)
    out, err = capsys.readouterr()
    return ei.value.code, out, err


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("ctrlc")
    return toy.write_target(d / "target"), toy.write_drafter(d / "oracle", "oracle")


def test_convert_interrupted_says_so_exits_130_and_leaves_no_temp_folder(pair, tmp_path, capsys, monkeypatch):
    import eagle_migrate.convert.base as base

    target, src = pair
    monkeypatch.setattr(base, "verify_written", _interrupt)  # Ctrl-C while the output is half-written
    out = tmp_path / "out"
    code, stdout, err = _run(capsys, ["convert", str(src), "--target", str(target), "-o", str(out), "--no-calibrate",
                                      "-n", "4"])
    assert code == 130
    lines = [ln for ln in err.splitlines() if "interrupted" in ln]
    assert lines == ["interrupted; nothing was written"]
    assert list(tmp_path.iterdir()) == []  # neither the output nor its temporary sibling
    code, stdout, err = _run(capsys, ["convert", str(src), "--target", str(target), "-o", str(out), "--no-calibrate",
                                      "-n", "4", "--json"])
    assert code == 130 and json.loads(stdout)["error"]["code"] == "Interrupted"


def test_sigterm_unwinds_like_ctrl_c_exits_143_and_leaves_no_temp_folder(pair, tmp_path, capsys, monkeypatch):
    """`timeout`, `kill` or a container stop sends SIGTERM, whose default ends the process where it stands and
    leaves the half-written output's hidden temporary folder behind: every command now unwinds instead."""
    import eagle_migrate.convert.base as base

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # a real signal to this process while the output is half-written
        time.sleep(10)
        raise AssertionError("SIGTERM did not interrupt the command")

    target, src = pair
    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(base, "verify_written", terminated)
    out = tmp_path / "out"
    argv = ["convert", str(src), "--target", str(target), "-o", str(out), "--no-calibrate", "-n", "4"]
    code, stdout, err = _run(capsys, argv)
    assert code == 143
    assert [ln for ln in err.splitlines() if "interrupted" in ln] == ["interrupted; nothing was written"]
    assert list(tmp_path.iterdir()) == []  # neither the output nor its temporary sibling
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is the command's only
    code, stdout, err = _run(capsys, [*argv, "--json"])
    assert code == 143 and json.loads(stdout)["error"] == {"code": "Interrupted", "exit_code": 143, "hint": None,
                                                           "message": "interrupted; nothing was written"}


def test_migrate_interrupted_prints_the_resume_command(pair, tmp_path, capsys, monkeypatch):
    import eagle_migrate.convert as conv

    target, src = pair
    monkeypatch.setattr(conv, "convert", _interrupt)
    argv = ["migrate", str(src), "--target", str(target), "-o", str(tmp_path / "run"), "--no-calibrate"]
    code, stdout, err = _run(capsys, argv)
    assert code == 130
    assert f"interrupted; resume with: eagle-migrate migrate {src} --target {target} -o {tmp_path / 'run'} --no-calibrate" in err
    assert err.count("interrupted; resume with") == 1
    assert not [p for p in (tmp_path / "run").iterdir() if ".tmp-" in p.name]


def test_the_line_names_the_resume_command_only_where_there_is_one():
    assert interrupted_line(["quantize", "a", "-o", "b"]) == "interrupted; nothing was written"
    assert "continue from the last saved calibration step with: eagle-migrate convert a --resume r" in \
        interrupted_line(["convert", "a", "--resume", "r"])
    assert interrupted_line(["demo"]) == "interrupted; resume with: eagle-migrate demo"


def test_an_interrupted_engine_call_ends_its_vllm_worker_at_once(monkeypatch):
    """SIGTERM (or Ctrl-C) while the vLLM worker runs: the worker is killed by the call, not left running until this
    process has exited (its parent-death signal) while the reader threads wait on its pipes."""
    import subprocess
    import sys
    import threading

    from eagle_migrate.engines import vllm_engine
    from eagle_migrate.errors import Interrupted, sigterm_raises

    started: list[subprocess.Popen] = []
    real = subprocess.Popen

    def popen(*args, **kwargs):
        started.append(real(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(vllm_engine.subprocess, "Popen", popen)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    t0 = time.monotonic()
    with pytest.raises(Interrupted), sigterm_raises():
        timer.start()
        vllm_engine._communicate([sys.executable, "-c", "import time; time.sleep(120)"], "", dict(os.environ), 300, None)
    assert started and started[0].poll() is not None  # ended, not left to sleep
    assert time.monotonic() - t0 < 60
