"""`eagle-migrate quantize` on the command line: --help, --json, exit codes (0 ok, 1 gate failed, 2 bad input)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("EAGLE_MIGRATE_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "eagle_migrate", *args], capture_output=True, text=True, env=env, timeout=300)


def test_help_has_schemes_and_example():
    r = run("quantize", "--help")
    assert r.returncode == 0
    for s in ("fp8-dynamic", "nvfp4a16", "--quantize-fc", "--max-al-drop", "--target", "--data", "Example"):
        assert s in r.stdout


def _choices(command, param: str) -> tuple[str, ...]:
    """The values typer offers for ``param`` of a CLI command function (its Literal annotation)."""
    from typing import get_args, get_type_hints

    hint = get_args(get_type_hints(command, include_extras=True)[param])[0]  # Annotated[Literal[...], Option]
    args = [a for a in get_args(hint) if a is not type(None)]  # Optional[Literal[...]] (--train: None = by kind)
    return get_args(args[0]) if len(args) == 1 and get_args(args[0]) else tuple(args)


def test_scheme_choices_are_the_library_schemes(tmp_path, toy_random):
    """--scheme offers exactly quantize.SchemeName (the library's Literal, not a copy of it) and refuses others."""
    from typing import get_args

    from eagle_migrate.cli import quantize as cli_quantize
    from eagle_migrate.quantize import SchemeName

    assert _choices(cli_quantize.quantize, "scheme") == get_args(SchemeName) == ("fp8-dynamic", "fp8", "nvfp4a16", "nvfp4")
    r = run("quantize", str(toy_random), "-o", str(tmp_path / "q"), "--scheme", "fp9")
    assert r.returncode == 2 and "fp9" in r.stderr and not (tmp_path / "q").exists()


def test_train_choices_are_the_library_modes():
    """--train (convert, migrate) offers exactly calibrate.TRAIN_MODES; --output-format exactly convert's formats."""
    from typing import get_args

    from eagle_migrate.calibrate import TRAIN_MODES
    from eagle_migrate.cli import convert as cli_convert
    from eagle_migrate.cli import migrate as cli_migrate
    from eagle_migrate.convert import OutputFormat

    for cmd in (cli_convert.convert, cli_migrate.migrate):
        assert _choices(cmd, "train") == TRAIN_MODES == ("norms", "norms+fc", "all")
        assert _choices(cmd, "output_format") == get_args(OutputFormat) == ("vllm", "speculators")


def test_json_is_one_document(tmp_path, toy_random):
    r = run("quantize", str(toy_random), "-o", str(tmp_path / "q"), "--scheme", "nvfp4a16", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["scheme"] == "nvfp4a16" and doc["format"] == "nvfp4-pack-quantized"
    assert doc["ignore"] == ["lm_head", "re:.*fc$"] and len(doc["layers"]) == 7
    assert doc["acceptance"] is None and doc["quantized_ratio"] > 6  # fp32 source
    assert (tmp_path / "q" / "config.json").exists()


def _main(args: list[str]) -> int:
    from eagle_migrate import cli

    try:
        cli.main(args)
    except SystemExit as e:
        return int(e.code or 0)
    return 0


@pytest.fixture
def no_debug(monkeypatch):
    monkeypatch.delenv("EAGLE_MIGRATE_DEBUG", raising=False)


def test_static_scheme_without_target_is_bad_input(tmp_path, toy_random, capsys, no_debug):
    assert _main(["quantize", str(toy_random), "-o", str(tmp_path / "q"), "--scheme", "fp8"]) == 2
    err = capsys.readouterr().err
    assert "calibrates activation scales" in err and "hint:" in err and "Traceback" not in err


def test_unknown_scheme_is_usage_error(tmp_path, toy_random, no_debug):
    assert _main(["quantize", str(toy_random), "-o", str(tmp_path / "q"), "--scheme", "int3"]) == 2


def test_existing_output_needs_force(tmp_path, toy_random, capsys, no_debug):
    out = tmp_path / "q"
    out.mkdir()
    assert _main(["quantize", str(toy_random), "-o", str(out), "--scheme", "fp8-dynamic"]) == 2
    assert "--force" in capsys.readouterr().err
    assert _main(["quantize", str(toy_random), "-o", str(out), "--scheme", "fp8-dynamic", "--force", "--json"]) == 0


def _fake_engine(per_request: bool = True):
    """run_engine's stand-in: the source at AL 4.0 and the quantized drafter at 3.0 over two requests (one draft
    more or fewer each, so the paired SE is not zero), with or without per-request counters."""
    from eagle_migrate.engines import in_process as api
    from eagle_migrate.engines.metrics import AcceptanceStats

    def side(accepted: list[int]):
        stats = AcceptanceStats(num_drafts=10, num_accepted_tokens=sum(accepted), num_prompts=len(accepted))
        pr = [{"num_drafts": 5, "num_accepted_tokens": a} for a in accepted]
        return {"chat": (stats, {"per_request": pr} if per_request else {})}

    def fake(engine, *_a, **_k):  # quantize's gate measures through engines.in_process.run_engine
        return api.EngineRun([side([14, 16]), side([9, 11])], None, "float32")

    return fake


def test_gate_failure_exits_1_with_report(tmp_path, toy_oracle, toy_target, capsys, monkeypatch, no_debug):
    from eagle_migrate.engines import in_process as api

    monkeypatch.setattr(api, "run_engine", _fake_engine())
    code = _main(["quantize", str(toy_oracle), "-o", str(tmp_path / "q"), "--scheme", "fp8-dynamic", "--target",
                  str(toy_target), "--max-al-drop", "2", "--json"])
    assert code == 1
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert doc["acceptance"]["passed"] is False and doc["acceptance"]["before"] == 4.0 and doc["acceptance"]["after"] == 3.0
    paired = doc["acceptance"]["paired"]
    assert paired["ratio"] == 0.75 and paired["se"] > 0 and paired["verdict"] == "worse"
    assert doc["acceptance"]["drop_beyond_noise"] is True and doc["acceptance"]["before_se"] > 0
    assert doc["acceptance"]["suites"]["chat"]["paired"]["ratio"] == 0.75
    assert "error:" in out.err and "--max-al-drop" in out.err
    assert f"paired ratio 0.750 ± {paired['se']:.3f} (worse, beyond 2 SE)" in out.err
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize("per_request", [True, False])
def test_text_output_shows_al_se_and_the_paired_ratio(tmp_path, toy_oracle, toy_target, capsys, monkeypatch, no_debug,
                                                      per_request):
    """The acceptance lines: each AL ± SE, the drop, the paired ratio ± SE and its verdict; without per-request
    counters the ALs alone and why there is no ratio (never a made-up SE)."""
    from eagle_migrate.engines import in_process as api

    monkeypatch.setattr(api, "run_engine", _fake_engine(per_request))
    code = _main(["quantize", str(toy_oracle), "-o", str(tmp_path / "q"), "--scheme", "fp8-dynamic", "--target",
                  str(toy_target), "--max-al-drop", "30"])
    assert code == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("acceptance length"))
    chat = next(x for x in out.splitlines() if x.strip().startswith("chat:"))
    if per_request:
        assert "4.000 ± " in line and "-> 3.000 ± " in line and "(-25.00%; paired ratio 0.750 ± " in line
        assert "(worse, beyond 2 SE)" in line and "ok" in line and "paired ratio 0.750 ± " in chat
    else:
        assert "±" not in line + chat
        assert "4.000 -> 3.000 (-25.00%; paired ratio n/a (not paired: the engine returned no per-request counters))" in line
