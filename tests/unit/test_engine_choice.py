"""The engine choice (--engine, --vllm-python) reaches every stage that serves the target: validate's engines, and
calibration's held-out continuations (vLLM in that interpreter; transformers' generate with --engine reference),
from convert's flags and from migrate's. Once --vllm-python reached validate only, and calibration fell back to
transformers' generate for 28 minutes on the real pair (issue 39)."""

from __future__ import annotations

import sys

import pytest

from eagle_migrate import toy
from eagle_migrate.calibrate import CalibrationSettings, checkpoint
from eagle_migrate.judge import HeldoutSequence


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("engine-choice")
    return toy.write_target(d / "target"), toy.write_drafter(d / "oracle", "oracle")


class Stop(Exception):
    pass


def test_convert_flags_reach_the_calibration(pair, tmp_path, monkeypatch, capsys):
    """convert --engine / --vllm-python: the calibration's settings carry them (checked where calibrate_checkpoint
    receives them, after the structural conversion)."""
    import eagle_migrate.calibrate as cal
    from eagle_migrate.cli import main

    target, src = pair
    seen = {}

    def fake(ckpt, tgt, settings, **kw):
        seen["settings"] = settings
        raise Stop

    monkeypatch.setattr(cal, "calibrate_checkpoint", fake)  # where convert's calibration step looks it up
    with pytest.raises((Stop, SystemExit)):
        main(["convert", str(src), "--target", str(target), "-o", str(tmp_path / "out"), "-n", "4", "--steps", "1",
              "--engine", "reference", "--vllm-python", sys.executable])
    s = seen["settings"]
    assert (s.engine, s.vllm_python, s.steps) == ("reference", sys.executable, 1)


def _held() -> dict[str, list[list[int]]]:
    return {"chat": [[1, 2, 3], [4, 5]]}


def test_the_held_out_continuations_come_from_the_engine_asked_for(monkeypatch):
    """vllm (or auto with vLLM there): served by vLLM in --vllm-python; reference: left to transformers' generate;
    vllm asked for and failing: an error, not a silent half-hour fallback."""
    from eagle_migrate.engines import in_process

    calls = []

    def fake_vllm(self, target, prompts, new_tokens, python=None, **kw):
        calls.append(python)
        return {n: [[9] for _ in ps] for n, ps in prompts.items()}

    monkeypatch.setattr(in_process.VllmEngine, "continuations", fake_vllm)
    monkeypatch.setattr(in_process, "resolve_engine", lambda engine, python, **kw: "reference" if engine == "reference" else "vllm")
    got, _ = checkpoint._heldout_continuations("t", _held(), 1, CalibrationSettings(engine="vllm", vllm_python="/venv/bin/python"))
    assert calls == ["/venv/bin/python"] and got["chat"][0].ids == [1, 2, 3, 9]
    assert checkpoint._heldout_continuations("t", _held(), 1, CalibrationSettings(engine="reference")) == (_held(), None)
    assert calls == ["/venv/bin/python"]  # reference: not served by vLLM

    def broken(*a, **k):
        raise RuntimeError("worker died")

    monkeypatch.setattr(in_process.VllmEngine, "continuations", broken)
    with pytest.warns(UserWarning, match="using transformers"):  # auto: the fallback, said
        assert checkpoint._heldout_continuations("t", _held(), 1, CalibrationSettings(engine="auto")) == (_held(), None)
    with pytest.raises(RuntimeError, match="worker died"):  # vllm asked for: no silent fallback
        checkpoint._heldout_continuations("t", _held(), 1, CalibrationSettings(engine="vllm"))


def test_an_engine_that_cannot_run_is_refused_before_serving(monkeypatch):
    from eagle_migrate.errors import EngineError
    from eagle_migrate.engines import vllm_engine

    monkeypatch.setattr(vllm_engine, "vllm_importable", lambda python=None: False)
    with pytest.raises(EngineError, match="not importable in /no/vllm"):
        checkpoint._heldout_continuations("t", _held(), 1, CalibrationSettings(engine="vllm", vllm_python="/no/vllm"))
    assert checkpoint._heldout_continuations("t", _held(), 1, CalibrationSettings(engine="auto")) == (_held(), None)


def test_migrate_gives_the_engine_choice_to_convert_and_validate(pair):
    from eagle_migrate.migrate import MigrateOptions, convert_options, validation_options

    target, src = pair
    opts = MigrateOptions.of(engine="vllm", vllm_python=sys.executable, run_validate=True)
    c, v = convert_options(opts), validation_options(opts, src)  # each stage's options model, handed whole
    assert (v.engine, v.vllm_python, v.baseline) == ("vllm", sys.executable, src)
    plain = convert_options(MigrateOptions.of(run_validate=True)).calibration
    assert (plain.engine, plain.vllm_python) == ("auto", None)
    assert (c.calibration.engine, c.calibration.vllm_python) == ("vllm", sys.executable)
