"""When vLLM refuses a drafter in validate: the error names which drafter (role and path), gives vLLM's reason's
first line in full (no 400-character cut), adds the inspect finding that explains it, and the report still records
what was measured. The vLLM worker is faked (its answer's shape is vllm_worker.run's)."""

from __future__ import annotations

import json

import pytest

from eagle_migrate import toy
from eagle_migrate.errors import EngineError
from eagle_migrate.validate import validate
from eagle_migrate.engines import in_process as engine
from eagle_migrate.engines import vllm_engine

from ..layouts import write_layout
from .test_convert import toy_cfg, toy_layout_sd

REASON = ("ValueError: the draft model's d2t is present although draft_vocab_size equals vocab_size; " + "x" * 500
          + " end-of-first-line")


def fake_worker(request, python=None, timeout=0, **_):
    runs = []
    for r in request["runs"]:
        if r["drafter"] and "specforge" in r["drafter"]:
            runs.append({"drafter": r["drafter"], "suites": {}, "error": REASON + "\nTraceback (most recent call last): ..."})
            continue
        runs.append({"drafter": r["drafter"], "suites": {
            name: {"num_drafts": 10, "num_draft_tokens": 30, "num_accepted_tokens": 30, "accepted_per_position": [10, 10, 10],
                   "num_prompts": len(job["prompts"]), "outputs": [[1, 2]] * len(job["prompts"]), "output_tokens": 40,
                   "seconds": 0.1} for name, job in request["suites"].items()}})
    return {"ok": True, "vllm_version": "0.32.0", "runs": runs, "suites": runs[0]["suites"]}


def test_a_refused_baseline_is_named_with_its_reason_and_finding_and_the_report_is_written(tmp_path, monkeypatch):
    target = toy.write_target(tmp_path / "target")
    new = toy.write_drafter(tmp_path / "oracle", "oracle")
    base = write_layout("specforge", toy_cfg(), toy_layout_sd(), tmp_path / "specforge")  # d2t with Vd = V
    monkeypatch.setattr(vllm_engine, "run_worker", fake_worker)
    monkeypatch.setattr(engine, "resolve_engine", lambda name, python: "vllm")
    with pytest.raises(EngineError) as ei:
        validate(new, str(target), engine="vllm", suites=["chat"], baseline=base, num_prompts=2, max_tokens=8,
                 report_dir=tmp_path / "rep", max_regression_pct=5.0)
    msg = ei.value.message
    assert f"baseline drafter {base}" in msg and "end-of-first-line" in msg and REASON in msg  # the line in full
    assert "Traceback" not in msg
    assert "inspect finds d2t_with_full_vocab" in msg
    assert "report.json" in ei.value.hint
    doc = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert doc["passed"] is False and any("baseline drafter" in f for f in doc["failures"])
    assert doc["suites"][0]["new"]["acceptance_length"] == 4.0 and doc["suites"][0]["baseline"] is None
    assert doc["overall"] == {"new": 4.0}


def test_a_refused_checkpoint_is_named_and_the_report_records_the_failure(tmp_path, monkeypatch):
    target = toy.write_target(tmp_path / "target")
    new = write_layout("specforge", toy_cfg(), toy_layout_sd(), tmp_path / "specforge")
    monkeypatch.setattr(vllm_engine, "run_worker", fake_worker)
    monkeypatch.setattr(engine, "resolve_engine", lambda name, python: "vllm")
    with pytest.raises(EngineError) as ei:
        validate(new, str(target), engine="vllm", suites=["chat"], num_prompts=2, max_tokens=8, report_dir=tmp_path / "rep")
    assert f"checkpoint drafter {new}" in ei.value.message
    doc = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert doc["passed"] is False and doc["suites"] == [] and doc["failures"]
