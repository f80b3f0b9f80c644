"""A newly registered engine works everywhere an engine is chosen (issue 52): validate, calibration's held-out
generation, quantize's gate and migrate take its name, and each asks the engine what it used to settle by name
(which layout it loads, whether it reuses the loaded target, whether it makes the held-out continuations)."""

from __future__ import annotations

import pytest

from eagle_migrate import toy
from eagle_migrate.errors import InputError
from eagle_migrate.engines.in_process import ReferenceEngine, check_engine_name, in_process_engines
from eagle_migrate.engines.registry import register_engine, unregister_engine


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
    got, answers = checkpoint._heldout_continuations("t", held, 4, CalibrationSettings(engine="counting"))
    assert got is held and answers is None  # it makes none


def test_calibration_takes_the_continuations_a_plugin_makes(tmp_path):
    """An engine that makes the held-out continuations (its ``continuations``) is asked for them, and its ``version``
    keys their cache: a second run with the same prompts reads the cache, another version makes them again."""
    from eagle_migrate.calibrate import checkpoint
    from eagle_migrate.calibrate.settings import CalibrationSettings

    made: list[dict] = []

    @register_engine
    class Echo(ReferenceEngine):
        name = "echo"
        release = "1"

        def continuations(self, target, prompts, new_tokens, **kw):
            made.append(prompts)
            return {n: [[p[-1]] * new_tokens for p in ps] for n, ps in prompts.items()}

        def version(self, python=None):
            return f"echo {self.release}"

    try:
        target = tmp_path / "target"
        target.mkdir()
        (target / "config.json").write_text("{}")
        s = CalibrationSettings(engine="echo", cache_dir=tmp_path / "cache")
        got, _ = checkpoint._heldout_continuations(str(target), {"chat": [[1, 2, 3]]}, 2, s)
        assert [(h.ids, h.prompt_len) for h in got["chat"]] == [([1, 2, 3, 3, 3], 3)] and len(made) == 1
        checkpoint._heldout_continuations(str(target), {"chat": [[1, 2, 3]]}, 2, s)
        assert len(made) == 1  # from the cache
        Echo.release = "2"
        checkpoint._heldout_continuations(str(target), {"chat": [[1, 2, 3]]}, 2, s)
        assert len(made) == 2  # another version of the engine: made again
    finally:
        unregister_engine("echo")


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


# ----- no module outside engines/ settles anything by an engine's name (issue 52) ----------------------------------
ENGINE_WORDS = ("engine", "validate")  # the names a caller keeps an engine's name under (quantize's --validate)


def _name_comparisons(src: str, names: set[str]) -> list[str]:
    """``x == "vllm"``, ``engine in ("auto", ...)`` and the like: a comparison of a registered engine's name with an
    expression whose source names an engine (``engine``, ``res.engine``, ``engine_used``, quantize's ``validate``)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(src)):
        if not isinstance(node, ast.Compare):
            continue
        parts = [node.left, *node.comparators]
        consts = {c.value for p in parts for c in ast.walk(p) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
        others = [ast.unparse(p) for p in parts if not isinstance(p, (ast.Constant, ast.Tuple, ast.Set, ast.List))]
        if consts & names and any(w in o.lower() for o in others for w in ENGINE_WORDS):
            found.append(ast.unparse(node))
    return found


def test_the_name_check_finds_a_comparison():
    names = {"vllm", "reference", "auto"}
    assert _name_comparisons('if engine != "auto" and res.engine in ("vllm", "x"): pass', names) == [
        "engine != 'auto'", "res.engine in ('vllm', 'x')"]
    assert _name_comparisons('if layout == "vllm" or validate != "none": pass', names) == []


def test_no_module_outside_engines_compares_an_engine_name():
    from pathlib import Path

    import eagle_migrate
    from eagle_migrate.engines import server  # noqa: F401  (registers the server engine)
    from eagle_migrate.engines.registry import engine_names

    root = Path(eagle_migrate.__file__).parent
    found = [f"{p.relative_to(root)}: {c}" for p in sorted(root.rglob("*.py")) if "engines" not in p.relative_to(root).parts
             for c in _name_comparisons(p.read_text(), set(engine_names()))]
    assert found == []
