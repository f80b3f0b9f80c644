"""Each stage's options are declared once: every flag of every command maps to one field of that command's options
model (or, for the commands whose few options go straight to one library function, to one of its keyword
parameters), the stage's inputs and the CLI-only flags are named with their reason, and no field of a model is left
without a way in; a composed model (convert -> calibration, migrate -> every stage) routes each flat keyword to the
one field it sets. cli/options.py's COMMANDS is the one table both the commands and this test read."""

from __future__ import annotations

import inspect as _inspect

import pytest

from eagle_migrate.cli import app
from eagle_migrate.cli.options import COMMANDS
from eagle_migrate.options import Options

# fields of an options model that no flag of its command sets, each with its reason (an entry no longer needed fails)
UNMAPPED: dict[str, dict[str, str]] = {
    "convert": {
        "held_out": "library only: sequences held out for the agreement (default: a quarter of them)",
        "max_length": "library only: the statistics pass's sequence length",
        "max_cuts": "library only: agreement chains per sequence",
        "evaluate": "library only: skip the agreement runs",
        "command": "the CLI's command line, set by the command itself for provenance.json",
        "progress": "the run's events, not an option (the CLI passes its StageBar)",
        "calibration.warmup": "library only",
        "calibration.schedule": "library only", "calibration.clip": "library only",
        "calibration.k": "library only (convert's fine-tune unrolls --num-speculative-tokens steps)",
        "calibration.seq_len": "library only", "calibration.batch": "library only",
        "calibration.suites": "library only (the held-out suites)", "calibration.heldout_per_suite": "library only",
        "calibration.heldout_new_tokens": "library only", "calibration.eval_every": "library only",
        "calibration.patience": "library only",
        "calibration.ends_by": "set by convert itself: the retarget default's deadline on a CPU (--max-minutes replaces it)",
    },
    "validate": {
        "diagnostic_sequences": "library only: sequences per suite for the drift diagnostics",
        "device": "library only: the reference engine's device (auto)",
        "check": "the CLI exits 1 on a failed gate itself, after rendering the report",
        "api_key": "library only: the key itself (the CLI takes the variable's name, --api-key-env)",
        "speed_rounds": "library only: rounds per concurrency of the speed runs",
    },
    "quantize": {
        "calibration_max_len": "library only: the activation ranges' sequence length",
        "suites": "library only: the gate's jobs",
        "vllm_options": "library only: the gate's vLLM run",
        "progress": "the run's log lines, not an option",
    },
    "publish": {"forced_by": "migrate's: the flag that asked to publish unvalidated (--no-validate)"},
    "migrate": {
        "convert.force": "migrate writes each stage into its own folder", "convert.command": "provenance, set by convert",
        "convert.progress": "the run's events", "convert.require_improvement": "migrate gates on validate's gates",
        "convert.held_out": "library only", "convert.max_length": "library only", "convert.max_cuts": "library only",
        "convert.evaluate": "library only", "convert.num_sequences": "library only (MigrateOptions.of(num_sequences=))",
        "convert.hidden_states_dir": "library only: migrate captures the target's states itself",
        "convert.keep_architecture": "convert's: the control arm of a measurement, not a migration to EAGLE-3.1",
        "convert.calibration.*": "library only, but steps / train / max_minutes (flags) and the calibration context",
        "quantization.*": "library only, but scheme (--quantize) and quantize_fc",
        "validation.*": "library only, but the suites', prompts' and gates' flags",
        "publishing.*": "library only, but repo_id (--publish), dry_run, private, create_pr, revision",
    },
    "watch": {},
    "inspect": {},
    "demo": {"log": "the run's log lines", "progress": "the run's events"},
}


def _commands() -> dict[str, object]:
    return {c.name or c.callback.__name__: c.callback for c in app.registered_commands}


def _params(callback) -> list[str]:
    return list(_inspect.signature(callback).parameters)


def _fields(target) -> set[str]:
    """What a command's options go to: an options model's flat keywords (composition followed), a pydantic
    model's fields, or a library function's keyword parameters."""
    if isinstance(target, type) and issubclass(target, Options):
        return target.fields_flat()
    if hasattr(target, "model_fields"):
        return set(target.model_fields)
    return {n for n, p in _inspect.signature(target).parameters.items() if p.kind is not p.VAR_KEYWORD}


def test_every_command_declares_how_its_flags_map():
    assert set(_commands()) == set(COMMANDS), "a command without its COMMANDS entry (cli/options.py), or the reverse"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_flag_maps_to_one_field(name):
    spec, params = COMMANDS[name], _params(_commands()[name])
    assert set(spec.inputs) <= set(params) and set(spec.cli_only) <= set(params), "a named input / CLI-only flag is gone"
    options = [p for p in params if p not in spec.inputs and p not in spec.cli_only]
    if not spec.model:
        assert options == [], f"{name} has options but no options model"
        return
    target = spec.load()
    fields = _fields(target)
    assert [p for p in options if p not in fields] == [], f"{name}: flags that no field of {spec.model} takes"
    if isinstance(target, type) and issubclass(target, Options):
        for p in options:  # one field each: the route is unambiguous (Options.route raises otherwise)
            assert target.route(p) is not None


def _all_fields(model: type[Options], prefix: str = "") -> set[str]:
    out = set()
    for n in model.model_fields:
        sub = model.nested().get(n)
        out |= _all_fields(sub, f"{prefix}{n}.") if sub else {prefix + n}
    return out


@pytest.mark.parametrize("name", ["convert", "validate", "quantize", "publish", "migrate"])
def test_no_field_is_left_without_a_flag_unless_named(name):
    """A field no flag sets is named in UNMAPPED with its reason; a name there that a flag does set fails too."""
    spec, params = COMMANDS[name], _params(_commands()[name])
    model = spec.load()
    set_by_flags = {".".join(model.route(p)) for p in params if p not in spec.inputs and p not in spec.cli_only}
    unmapped = _all_fields(model) - set_by_flags
    named = UNMAPPED[name]
    covered = {f for f in unmapped if f in named or any(k.endswith(".*") and f.startswith(k[:-1]) for k in named)}
    if name == "migrate":  # a run-wide field is set on MigrateOptions, never on a stage's (the model refuses it)
        from eagle_migrate.migrate import _PARTS, SHARED, MigrateOptions

        for part in _PARTS:  # each stage's run-wide fields, by its RUN_FIELDS, and the shared ones
            model = MigrateOptions.model_fields[part].annotation
            covered |= {f"{part}." + ".".join(model.route(f)) for f in model.RUN_FIELDS.values()}
        covered |= {f"{part}.{f}" for f, parts in SHARED.items() for part in parts}
        covered |= {f"convert.calibration.{f}" for f in __import__("eagle_migrate.calibrate.settings",
                                                                   fromlist=["CONTEXT"]).CONTEXT}
    if name == "convert":  # the calibration's context is convert's own options (calibration_settings lays them over)
        from eagle_migrate.calibrate.settings import CONTEXT

        covered |= {f"calibration.{f}" for f in CONTEXT}
    assert sorted(unmapped - covered) == [], f"{name}: fields no flag sets and UNMAPPED does not name"
    assert sorted(k for k in named if not k.endswith(".*") and k not in unmapped) == [], "UNMAPPED names a mapped field"


def test_migrate_routes_each_flag_to_its_stage():
    from eagle_migrate.migrate import MigrateOptions

    o = MigrateOptions.of(steps=5, train="all", scheme="fp8", quantize_fc=True, suites="chat,code", repo_id="o/n",
                          dry_run=True, engine="reference", vllm_python="/py", num_speculative_tokens=4)
    assert (o.convert.calibration.steps, o.convert.calibration.train) == (5, "all")
    assert (o.quantization.scheme, o.quantization.quantize_fc) == ("fp8", True)
    assert o.validation.suites == ["chat", "code"] and (o.publishing.repo_id, o.publishing.dry_run) == ("o/n", True)
    assert (o.run.engine, o.run.vllm_python, o.run.num_speculative_tokens) == ("reference", "/py", 4)  # run-wide, once
    with pytest.raises(TypeError, match="ambiguous"):
        MigrateOptions.of(k=3)  # calibration's k or validate's k: a caller says which (num_speculative_tokens)
    from eagle_migrate.errors import InputError
    from eagle_migrate.engines.options import ValidateOptions

    with pytest.raises(InputError, match="run-wide"):
        MigrateOptions(validation=ValidateOptions(engine="vllm"))  # it would be overruled by migrate's --engine
