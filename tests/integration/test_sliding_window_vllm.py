"""Sliding-window draft layers (speculators >= 0.9's trainer default): our torch drafter drafts exactly vLLM's tokens
when vLLM serves the drafter with ``layer_types`` / ``sliding_window`` (vLLM 0.32: models/llama.py and qwen3_eagle3.py
give a ``sliding_attention`` layer ``per_layer_sliding_window``), on contexts several windows long.

Random drafters with W = 8 on prompts of 36-44 tokens (the equivalence test's target and drafter builders): Llama with
one sliding layer and with two, Qwen3 with one sliding layer (a drafter mixing full and sliding layers does not load in
vLLM 0.32: "All drafting layers should belong to the same kv cache group"; inspect reports it). The test can fail: the same weights with the window dropped, or with W - 1 /
W + 1, must draft differently somewhere (so a missing window or an off-by-one in which keys a query sees is caught).
"""

from __future__ import annotations

import pytest
import torch

from eagle_migrate.loader import load_drafter
from eagle_migrate.target import load_target
from eagle_migrate.engines.vllm_engine import measure_many

from ..conftest import requires_vllm
from .test_equivalence_vllm import K_SPEC, V, _random_drafter, _random_target

pytestmark = [pytest.mark.vllm, requires_vllm]

W = 8
DRAFTERS: dict[str, dict[str, dict]] = {
    "llama": {
        "sliding": {"layer_types": ["sliding_attention"], "sliding_window": W},
        "2layers": {"num_layers": 2, "layer_types": ["sliding_attention"] * 2, "sliding_window": W},
    },
    "qwen3": {
        "sliding": {"num_attention_heads": 4, "layer_types": ["sliding_attention"], "sliding_window": W},
    },
}


@pytest.fixture(scope="module", params=list(DRAFTERS))
def pair(request, tmp_path_factory):
    family = request.param
    root = tmp_path_factory.mktemp(f"swa-{family}")
    target = _random_target(root / "target", family)
    drafters = {name: _random_drafter(root / name, seed=40 + i, family=family, **dict(flags))
                for i, (name, flags) in enumerate(DRAFTERS[family].items())}
    return target, drafters, family


def test_torch_drafter_drafts_what_vllm_drafts_with_a_sliding_window(pair):
    target_dir, drafters, _ = pair
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, V - 1, (n,), generator=g).tolist() for n in (36, 44)]
    names = list(drafters)
    results = measure_many(
        str(target_dir), [str(drafters[n]) for n in names],
        {"swa": {"prompts": prompts, "max_tokens": 16, "ignore_eos": True}},
        num_speculative_tokens=K_SPEC, skip_tokenizer_init=True, max_model_len=256, record_drafts=True,
    )
    target = load_target(str(target_dir), with_tokenizer=False)
    report = {}
    for name, res in zip(names, results):
        _, extra = res["swa"]
        drafter = load_drafter(drafters[name], target)
        assert drafter.cfg.sliding_window == W and "sliding_attention" in drafter.cfg.layer_types
        variants = {}
        for label, upd in (("no-window", {"layer_types": None, "sliding_window": None}),
                           ("W-1", {"sliding_window": W - 1}), ("W+1", {"sliding_window": W + 1})):
            m = type(drafter)(drafter.cfg.model_copy(update=upd))
            m.load_state_dict(drafter.state_dict())
            variants[label] = m
        checked, mismatched, first_bad = 0, 0, None
        differs = dict.fromkeys(variants, 0)
        for prompt, out, records in zip(prompts, extra["outputs"], extra["drafts"]):
            seq = prompt + out
            assert records, f"{name}: vLLM made no proposals"
            aux_all, _ = target.forward(torch.tensor([seq]), drafter.cfg.aux_layer_ids)
            for r in records:
                n = r["n"]
                assert seq[n] == r["next_token"]
                ctx, aux = torch.tensor([seq[: n + 1]]), aux_all[:, :n]
                ours = drafter.draft(ctx, aux, K_SPEC)[0].tolist()
                for label, m in variants.items():
                    differs[label] += m.draft(ctx, aux, K_SPEC)[0].tolist() != ours
                checked += 1
                if ours != r["drafts"]:
                    mismatched += 1
                    first_bad = first_bad or (n, ours, r["drafts"])
        report[name] = (checked, mismatched, first_bad, differs)
    bad = {k: v for k, v in report.items() if v[1]}
    assert not bad, f"torch drafter (window {W}) disagrees with vLLM: {bad}"
    assert all(v[0] >= 8 for v in report.values()), report
    # the window must matter here, and exactly W: otherwise this test could not see a wrong window
    for name, (_, _, _, differs) in report.items():
        assert differs["no-window"], f"{name}: dropping the window changes no draft: {report}"
    for label in ("W-1", "W+1"):
        assert any(v[3][label] for v in report.values()), f"window {label} drafts exactly as W: {report}"
