"""The run-wide options are declared once (options.RunOptions) and reach every stage that takes them, each under its
own name (the stage model's RUN_FIELDS), through the stage's options model handed whole (issue 52)."""

from __future__ import annotations

import pytest

from eagle_migrate.calibrate.settings import CalibrationSettings
from eagle_migrate.convert.options import ConvertOptions
from eagle_migrate.errors import InputError
from eagle_migrate.options import RunOptions
from eagle_migrate.publish.options import PublishOptions
from eagle_migrate.quantize.options import QuantizeOptions
from eagle_migrate.engines.options import ValidateOptions

STAGES = (ConvertOptions, QuantizeOptions, ValidateOptions, PublishOptions)


@pytest.mark.parametrize("model", STAGES, ids=lambda m: m.__name__)
def test_each_stage_names_run_wide_options_it_has(model):
    assert model.RUN_FIELDS, "every stage takes at least k"
    for name, flat in model.RUN_FIELDS.items():
        assert name in RunOptions.model_fields
        assert model.route(flat) is not None, f"{model.__name__}.{flat} is no option"


def test_onto_lays_the_run_values_over_each_stage_under_its_own_name():
    run = RunOptions.of(num_speculative_tokens=5, engine="reference", seed=7, vllm_python="/py", device="cpu")
    v = run.onto(ValidateOptions.of(suites="chat"))
    assert (v.k, v.engine, v.seed, v.vllm_python, v.device, v.suites) == (5, "reference", 7, "/py", "cpu", ["chat"])
    assert v.dtype == "auto"  # validate serves in the engine's dtype: not a field it takes from the run
    c = run.onto(ConvertOptions.of(steps=3))
    assert (c.num_speculative_tokens, c.seed, c.device, c.calibration.steps) == (5, 7, "cpu", 3)
    assert (c.calibration.engine, c.calibration.vllm_python) == ("reference", "/py")  # the calibration's own
    assert run.onto(QuantizeOptions()).num_speculative_tokens == 5
    assert run.onto(PublishOptions(), repo_id="o/n").num_speculative_tokens == 5
    assert RunOptions().onto(ValidateOptions()).vllm_python is None  # None: not given, the stage's own stays


def test_set_on_finds_a_run_wide_value_set_inside_a_stage_nested_model_too():
    run = RunOptions()
    assert run.set_on(ConvertOptions.of(steps=3)) == []
    assert run.set_on(ValidateOptions(k=4)) == ["k"]
    assert run.set_on(ConvertOptions(calibration=CalibrationSettings(engine="vllm"))) == ["engine"]


def test_migrate_gives_every_stage_the_run_values_and_refuses_one_set_on_a_stage(tmp_path):
    from eagle_migrate.migrate import MigrateOptions, convert_options, publish_options, quantize_options, validation_options

    o = MigrateOptions.of(num_speculative_tokens=5, seed=2, scheme="fp8-dynamic", repo_id="o/n", data="chat")
    assert convert_options(o).num_speculative_tokens == 5 and convert_options(o).data == "chat"
    q = quantize_options(o, "T")
    assert (q.num_speculative_tokens, q.target, q.data, q.validate) == (5, "T", "chat", "none")
    v = validation_options(o, tmp_path)
    assert (v.k, v.seed, v.baseline) == (5, 2, tmp_path)
    assert publish_options(o, "T").num_speculative_tokens == 5
    with pytest.raises(InputError, match="run-wide"):
        MigrateOptions(quantization=QuantizeOptions(num_speculative_tokens=4))
    with pytest.raises(InputError, match="run-wide"):
        MigrateOptions(quantization=QuantizeOptions(data="chat"))  # a shared option: migrate's --data


def test_a_dump_is_versioned_and_another_version_is_refused():
    c = ConvertOptions.of(steps=5, train="all", num_speculative_tokens=4)
    d = c.to_dict()
    assert (d["type"], d["version"]) == ("ConvertOptions", ConvertOptions.VERSION)
    assert d["options"] == {"num_speculative_tokens": 4, "calibration": {"train": "all", "steps": 5}}  # defaults left out
    assert ConvertOptions.from_dict(d) == c
    with pytest.raises(InputError, match="version 0, not ConvertOptions version"):
        ConvertOptions.from_dict({**d, "version": 0})
    with pytest.raises(InputError, match="not ValidateOptions"):
        ValidateOptions.from_dict(d)


def test_migrate_hashes_each_stage_by_its_versioned_dump(tmp_path):
    from eagle_migrate import toy
    from eagle_migrate.migrate import MigrateOptions, build_stages

    target, drafter = toy.write_target(tmp_path / "t"), toy.write_drafter(tmp_path / "d", "oracle")
    st = {s.name: s for s in build_stages(drafter, str(target), MigrateOptions.of(num_speculative_tokens=4,
                                                                                run_validate=True))}
    assert st["convert"].inputs["type"] == "ConvertOptions" and st["convert"].inputs["version"] == 1
    assert st["validate"].inputs["options"]["k"] == 4 and st["validate"].inputs["options"]["baseline"] == str(drafter)
