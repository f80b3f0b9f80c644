"""The attention backend asked of vLLM on a CPU (engines/attention_backend.py): MLA in float32 on an AMX host must
not get the bf16-only AMX_MLA backend (issue 24); the choice is the same function on hosts with and without AMX."""

from __future__ import annotations

import json

import pytest

from eagle_migrate.engines import attention_backend as ab
from eagle_migrate.engines import vllm_engine


@pytest.mark.parametrize("amx", [True, False])
def test_mla_in_float32_gets_the_reference_backend_on_both_hosts(amx):
    c = ab.choose(on_cpu=True, amx=amx, dtype="float32", target_mla=True, drafter_mla=True)
    assert (c.target, c.drafter) == (ab.CPU_MLA, ab.CPU_MLA)
    assert ("on an AMX CPU" in c.reason) == amx


def test_bf16_on_an_amx_host_keeps_vllms_fast_backend():
    c = ab.choose(on_cpu=True, amx=True, dtype="bfloat16", target_mla=True, drafter_mla=True)
    assert (c.target, c.drafter) == (ab.AMX_MLA, ab.AMX_MLA)
    c = ab.choose(on_cpu=True, amx=False, dtype="bfloat16", target_mla=True, drafter_mla=True)
    assert (c.target, c.drafter) == (ab.CPU_MLA, ab.CPU_MLA)


def test_only_the_mla_side_is_asked_and_the_user_wins():
    c = ab.choose(on_cpu=True, amx=True, dtype="float32", target_mla=False, drafter_mla=True)
    assert (c.target, c.drafter) == (None, ab.CPU_MLA)
    c = ab.choose(on_cpu=True, amx=True, dtype="float32", target_mla=True, drafter_mla=False)
    assert (c.target, c.drafter) == (ab.CPU_MLA, None)
    c = ab.choose(on_cpu=True, amx=True, dtype="float32", target_mla=True, drafter_mla=True, user_backend="AMX_MLA")
    assert (c.target, c.drafter) == ("AMX_MLA", "AMX_MLA") and "user" in c.reason
    assert ab.choose(on_cpu=True, amx=True, dtype="float32", target_mla=False, drafter_mla=False).drafter is None
    assert ab.choose(on_cpu=False, amx=True, dtype="float32", target_mla=True, drafter_mla=True).target is None


def test_mla_is_read_from_any_producers_nesting(tmp_path):
    for name, cfg, want in [("vllm", {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "kv_lora_rank": 512}, True),
                            ("spec", {"transformer_layer_config": {"kv_lora_rank": 512}}, True),
                            ("llama", {"architectures": ["LlamaForCausalLMEagle3"], "kv_lora_rank": None}, False)]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
        assert ab.is_mla(tmp_path / name) is want, name
    assert ab.is_mla(tmp_path / "missing") is False and ab.is_mla("org/hub-id") is False


def test_the_probe_and_the_engine_request(tmp_path, monkeypatch):
    """With the AMX probe answering yes (as on a Sapphire Rapids host), the request the worker gets asks for CPU_MLA
    on the MLA target and each MLA drafter, and for nothing on a Llama drafter."""
    for name, cfg in [("t", {"kv_lora_rank": 512}), ("d", {"kv_lora_rank": 512}), ("l", {"hidden_size": 8})]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    monkeypatch.setenv(ab.ASSUME_AMX_ENV, "1")
    assert ab.amx_available()
    monkeypatch.setattr(vllm_engine, "cuda_available", lambda: False)
    seen = {}
    monkeypatch.setattr(vllm_engine, "run_worker", lambda req, python, timeout, **_: seen.update(req) or {
        "vllm_version": "x", "runs": [{"suites": {}} for _ in req["runs"]]})
    vllm_engine.measure_many(str(tmp_path / "t"), [str(tmp_path / "d"), str(tmp_path / "l"), None],
                             {"s": {"prompts": [[1]], "max_tokens": 1}}, dtype="float32")
    assert seen["attention_backend"] == ab.CPU_MLA
    assert [r["draft_attention_backend"] for r in seen["runs"]] == [ab.CPU_MLA, None, None]
    monkeypatch.delenv(ab.ASSUME_AMX_ENV)
    monkeypatch.setattr(ab.platform, "machine", lambda: "aarch64")
    assert not ab.amx_available()
