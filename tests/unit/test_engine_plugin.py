"""A newly registered engine works everywhere an engine is chosen (issue 52): validate, calibration's held-out
generation, quantize's gate and migrate take its name, and each asks the engine what it used to settle by name
(which layout it loads, whether it reuses the loaded target, whether it writes continuations)."""

from __future__ import annotations

import pytest

from eagle_migrate import toy
from eagle_migrate.errors import InputError
from eagle_migrate.validate.engine import ReferenceEngine, check_engine_name, in_process_engines
from eagle_migrate.validate.engines import register_engine, unregister_engine


@pytest.fixture()
def counting():
    """A plugin's engine: the reference engine's measurement under another name, counting its calls."""
    calls: list[int] = []

    @register_engine
    class Counting(ReferenceEngine):
        name = "counting"
        description = "the reference engine, counting its measurements"

        def measure(self, target, drafters, jobs, opts, **kw):
            calls.append(len(drafters))
            return super().measure(target, drafters, jobs, opts, **kw)

    yield calls
    unregister_engine("counting")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("plugin")
    return toy.write_target(d / "target"), toy.write_drafter(d / "oracle", "oracle")


def test_its_name_is_a_choice_once_registered(counting):
    assert "counting" in in_process_engines()
    check_engine_name("counting")
    with pytest.raises(InputError, match="expected auto or one of .*counting"):
        check_engine_name("countin")
    unregister_engine("counting")
    with pytest.raises(InputError, match="--engine 'counting'"):
        check_engine_name("counting")
    register_engine(type(ReferenceEngine)("Counting", (ReferenceEngine,), {"name": "counting"}))


def test_validate_measures_with_it(counting, pair):
    from eagle_migrate.validate.api import validate

    target, drafter = pair
    rep = validate(drafter, str(target), engine="counting", suites=["chat"], num_prompts=2, max_tokens=8,
                   diagnostics=False)
    assert rep.engine == "counting" and counting == [1]
    assert rep.suites[0].new.acceptance_length == pytest.approx(4.0)  # the oracle drafter on the toy: k + 1


def test_quantize_gate_measures_with_it(counting, pair, tmp_path):
    from eagle_migrate.quant.schemes import get_scheme
    from eagle_migrate.quantize.gate import gate_engine
    from eagle_migrate.quantize.stage import quantize

    target, drafter = pair
    assert gate_engine(get_scheme("fp8-dynamic"), "counting", str(target), None, None) == ("counting", "counting")
    with pytest.raises(InputError, match="unknown validate mode"):
        gate_engine(get_scheme("fp8-dynamic"), "countin", str(target), None, None)
    res = quantize(drafter, tmp_path / "q", "fp8-dynamic", target=str(target), validate="counting")
    assert res.acceptance.engine == "counting" and counting == [2]  # the source and the quantized drafter, one run
    assert res.acceptance.note and "compressed-tensors" in res.acceptance.note  # the engine's own note (reference's)


def test_calibration_leaves_the_continuations_to_transformers(counting):
    from eagle_migrate.calibrate import checkpoint
    from eagle_migrate.calibrate.settings import CalibrationSettings

    held = {"chat": [[1, 2, 3]]}
    assert checkpoint._vllm_heldout("t", held, 4, CalibrationSettings(engine="counting")) is held  # it writes none


def test_migrate_runs_with_it(counting, pair, tmp_path):
    from eagle_migrate.migrate import MigrateOptions, migrate

    target, drafter = pair
    opts = MigrateOptions.of(engine="counting", calibrate=False, num_sequences=4, run_validate=True, suites=["chat"],
                             num_prompts=2, max_tokens=8)
    res = migrate(drafter, str(target), tmp_path / "run", opts)
    assert res.ok, res
    stages = {s.name: s for s in res.stages}
    assert stages["validate"].outputs["engine"] == "counting" and counting == [2]  # the new drafter and the source
    with pytest.raises(InputError, match="--engine 'countin'"):
        migrate(drafter, str(target), tmp_path / "run2", MigrateOptions.of(engine="countin"))
