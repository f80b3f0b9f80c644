"""Issue 28 (item 6): `migrate` measures before it publishes, and its card says what happened.

With --publish the validate stage runs by default (the reference engine here, and the stage says why); skipping it is
an explicit --no-validate that the card states (never a --force that was not passed); the target is named without
its machine path; no record names a stage's temporary folder; the stage table rounds its numbers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from eagle_migrate.errors import InputError
from eagle_migrate.migrate import MigrateOptions, build_stages, check_options, migrate


@pytest.fixture
def pair(tmp_path, toy_target, toy_oracle) -> tuple[Path, Path]:
    t, d = tmp_path / "models" / "toy-target", tmp_path / "models" / "drafter"
    shutil.copytree(toy_target, t)
    shutil.copytree(toy_oracle, d)
    return t, d


def _names(stages) -> list[str]:
    return [s.name for s in stages]


def test_validate_runs_by_default_when_publishing(pair):
    target, drafter = pair
    assert _names(build_stages(drafter, str(target), MigrateOptions.of(repo_id="o/n", dry_run=True))) == \
        ["inspect", "convert", "validate", "publish"]
    assert _names(build_stages(drafter, str(target), MigrateOptions.of())) == ["inspect", "convert"]  # nothing to publish
    st = build_stages(drafter, str(target), MigrateOptions.of(repo_id="o/n", run_validate=False))  # an upload too: explicit
    assert _names(st) == ["inspect", "convert", "publish"]
    pub = st[-1].inputs["options"]  # publish's options model, hashed by its dump less its defaults
    assert pub["force"] is True and pub["forced_by"] == "--no-validate"


def test_no_validate_with_a_gate_is_refused(pair, tmp_path):
    target, drafter = pair
    with pytest.raises(InputError, match="--no-validate"):
        check_options(drafter, str(target), tmp_path / "o", MigrateOptions.of(run_validate=False, max_regression_pct=5.0))


def _opts(**kw) -> MigrateOptions:
    base = dict(calibrate=False, num_sequences=4, scheme="fp8-dynamic", engine="reference", suites=["chat"],
                num_prompts=2, max_tokens=8, repo_id="o/toy", dry_run=True)
    return MigrateOptions.of(**{**base, **kw})


def test_migrate_publish_dry_run_card(pair, tmp_path):
    target, drafter = pair
    res = migrate(drafter, str(target), tmp_path / "run", _opts())
    assert res.ok, res
    stages = {s.name: s for s in res.stages}
    assert list(stages) == ["inspect", "convert", "quantize", "validate", "publish"]
    assert stages["convert"].message == "step-0 agreement 1.000; not calibrated (--no-calibrate)"
    msg = stages["validate"].message
    assert msg.startswith("reference") and "chat AL" in msg and "no gate set" in msg and "passed" not in msg
    repo = tmp_path / "run" / "publish" / "repo"
    card = (repo / "README.md").read_text()
    assert "--force" not in card and "Warning" not in card and "TARGET_MODEL" not in card
    assert "`toy-target` (a local model; Hub id not recorded)" in card and "vllm serve toy-target " in card
    assert "measured only: no acceptance gate was set" in card
    md = (tmp_path / "run" / "validate" / "report" / "report.md").read_text()
    assert "**MEASURED: no gate was set" in md and "PASSED" not in md and "| pass |" not in md
    # the reference engine counts per request: the stage line, the card's table and its lineage carry each AL's SE
    # and the paired ratio against the source, measured on the same prompts
    assert "chat AL " in msg and " ± " in msg and "paired ratio " in msg, msg
    validation = card.split("## Validation", 1)[1].split("\n## ", 1)[0]
    assert "| suite | AL | baseline AL | paired ratio (AL / baseline AL) | verdict |" in validation, validation
    row = next(ln for ln in validation.splitlines() if ln.startswith("| chat |"))
    assert row.count(" ± ") == 3 and "AL ± its standard error (the request as the unit)" in validation
    lineage = card.split("## Lineage", 1)[1].split("##", 1)[0]
    assert "paired ratio " in lineage.split("| validate |", 1)[1]
    for stage in ("| source | EAGLE-3 drafter from eagle-migrate", "| convert | EAGLE-3 -> EAGLE-3.1", "| quantize | fp8-dynamic",
                  "| validate | engine reference"):
        assert stage in lineage, lineage
    # no temporary folder and no machine path in anything published, nor in the run's own records
    published = "\n".join(p.read_text() for p in repo.rglob("*") if p.suffix in (".md", ".json"))
    assert ".tmp-" not in published and str(tmp_path) not in published
    records = [p for p in (tmp_path / "run").rglob("*") if p.suffix in (".md", ".json")]
    assert records and not [p for p in records if ".tmp-" in p.read_text()]


def test_migrate_no_validate_card_says_so(pair, tmp_path):
    target, drafter = pair
    res = migrate(drafter, str(target), tmp_path / "run", _opts(run_validate=False, scheme=None))
    assert res.ok and [s.name for s in res.stages] == ["inspect", "convert", "publish"]
    card = (tmp_path / "run" / "publish" / "repo" / "README.md").read_text()
    assert "published with `--no-validate`" in card and "--force" not in card
    prov = json.loads((tmp_path / "run" / "publish" / "repo" / "provenance.json").read_text())
    assert prov["publish"]["validation"]["forced_by"] == "--no-validate"


def test_no_default_output_lands_in_the_current_directory(tmp_path, monkeypatch, capsys):
    """`demo` without --out works under the eagle-migrate cache (a clear place), not in the current directory;
    `publish --dry-run` without --out writes nothing at all (tests/unit/test_publish.py)."""
    import eagle_migrate.demo as demo_mod
    from eagle_migrate import cli

    seen = {}

    def fake(out, **kw):
        seen["out"] = out
        raise InputError("stop here")

    monkeypatch.setattr(demo_mod, "run_demo", fake)
    monkeypatch.setenv("EAGLE_MIGRATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        cli.main(["demo"])
    assert Path(seen["out"]) == tmp_path / "cache" / "demo"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]


def test_the_validate_line_says_when_vllm_was_missing():
    """--engine auto without vLLM measures with the reference engine and the stage line says so (and why)."""
    from types import SimpleNamespace as NS

    from eagle_migrate.engines.in_process import get_engine
    from eagle_migrate.migrate import validate_message

    note = get_engine("auto").fallback_note("reference")  # what migrate's validate stage asks the engine asked for
    assert note and "vLLM is not importable" in note
    assert get_engine("reference").fallback_note("reference") is None and get_engine("auto").fallback_note("vllm") is None
    from eagle_migrate.engines.metrics import PairedComparison

    suite = NS(name="chat", new=NS(acceptance_length=2.9558465286, acceptance_length_se=None),
               baseline=NS(acceptance_length=3.0, acceptance_length_se=None), paired=None)
    rep = NS(engine="reference", engine_version="torch 2.13.0", suites=[suite], failures=[], gates=[])
    assert validate_message(rep, note) == ("reference torch 2.13.0 (vLLM not importable); no gate set "
                                           "(--min-acceptance-length / --max-regression): measured only; "
                                           "chat AL 2.956 (source 3.000)")
    # counted per request: each AL's SE and the paired ratio against the source, with its verdict
    suite.new.acceptance_length_se, suite.baseline.acceptance_length_se = 0.0214, 0.02
    suite.paired = PairedComparison(ratio=0.9853, se=0.0061, requests=16, verdict="worse")
    assert validate_message(rep).endswith("chat AL 2.956 ± 0.021 (source 3.000 ± 0.020; paired ratio 0.985 ± 0.006 (worse))")
