"""The real pair: SmolLM2-135M-Instruct from its PyPI wheel, ShareGPT/HumanEval from theirs, and an EAGLE-3 drafter
for it (built by benchmarks/train_smollm2_eagle3.py into the asset cache; tests that need it skip without it)."""

from __future__ import annotations

import json

import pytest
import torch

from eagle_migrate import assets
from eagle_migrate.corpora import iter_sharegpt

from ..conftest import requires_vllm

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def smollm2():
    return assets.smollm2_target()


@pytest.fixture(scope="module")
def target(smollm2):
    from eagle_migrate.target import load_target

    return load_target(str(smollm2), device="cpu", dtype=torch.float32)


def _eagle3_scratch():
    """benchmarks/eagle3_scratch.py (the from-scratch helpers live with the benchmarks that use them)."""
    import importlib.util
    import sys
    from pathlib import Path

    if "eagle3_scratch" not in sys.modules:
        f = Path(__file__).resolve().parents[2] / "benchmarks" / "eagle3_scratch.py"
        spec = importlib.util.spec_from_file_location("eagle3_scratch", f)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["eagle3_scratch"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["eagle3_scratch"]


def _source_drafter():
    p = assets.cache_root() / "smollm2-eagle3"
    if not (p / "config.json").exists():
        pytest.skip("no trained SmolLM2 drafter in the cache (run benchmarks/train_smollm2_eagle3.py)")
    return p


@pytest.mark.ci
def test_smollm2_asset_is_a_plain_hf_folder(smollm2, target):
    cfg = json.loads((smollm2 / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]) == (576, 30, 49152)
    assert "quantization_config" not in cfg
    assert assets.smollm2_target() == smollm2  # idempotent: the second call returns the cached folder
    tok = target.tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    out = target.model.generate(ids, max_new_tokens=8, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:])


@pytest.mark.ci
def test_sharegpt_and_humaneval_from_wheels():
    recs = list(iter_sharegpt(assets.sharegpt_path(), limit=50))
    assert len(recs) == 50 and all("conversations" in r for r in recs)
    lines = assets.humaneval_path().read_text().splitlines()
    assert len(lines) == 164 and json.loads(lines[0])["task_id"] == "HumanEval/0"


def test_sharegpt_truncated_file_decodes_every_complete_record():
    assert sum(1 for _ in iter_sharegpt(assets.sharegpt_path())) == 17671


@pytest.mark.ci
def test_unrolled_forward_equals_drafting_on_the_real_target(target):
    """Real aux states (layers 2, 15, 27 of SmolLM2) through a SmolLM2-shaped EAGLE-3.1 drafter."""
    from eagle_migrate.drafter import DrafterConfig, EagleDrafter, KVCache
    from eagle_migrate.train import unrolled_forward

    init_from_target = _eagle3_scratch().init_from_target

    cfg = DrafterConfig(hidden_size=576, target_hidden_size=576, vocab_size=49152, draft_vocab_size=1024,
                        intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                        rope_theta=100000.0, max_position_embeddings=8192, aux_layer_ids=[2, 15, 27],
                        fc_norm=True, norm_output=True, norm_before_residual=True, rms_norm_eps=1e-5)
    m = EagleDrafter(cfg)
    init_from_target(m, target, torch.arange(1024) * 40, seed=0, std=0.05)
    with torch.no_grad():
        for k, s in enumerate((2.8, 6.4, 22.9)):
            m.fc_norm[k].weight.fill_(s)
    tok = target.tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": "Write a haiku about the sea."}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    n = ids.shape[1] - 1
    aux, _ = target.capture(ids, [2, 15, 27], torch.tensor([ids.shape[1]]))
    drafts, outs = m.draft_with_cache(ids, aux[:, :n], 3, KVCache())
    seq = torch.cat([ids, drafts], 1)
    pad_aux = torch.cat([aux, torch.zeros(1, seq.shape[1] - aux.shape[1], aux.shape[2])], 1)
    un = unrolled_forward(m, seq, pad_aux, 3)
    for j in range(3):
        assert torch.allclose(un[j].h_post[:, n - 1], outs[j].h_post[:, -1], atol=1e-3, rtol=1e-4)


@pytest.mark.vllm
@requires_vllm
def test_trained_source_drafter_is_served_with_acceptance_above_one(smollm2):
    from eagle_migrate.engines.vllm_engine import measure

    drafter = _source_drafter()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2))
    prompts = [list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                            tokenize=True, return_dict=True)["input_ids"])
               for q in ("Explain what a hash table is.", "Give me three tips for a job interview.")]
    res = measure(str(smollm2), str(drafter), {"chat": {"prompts": prompts, "max_tokens": 48}}, num_speculative_tokens=3,
                  max_model_len=1024)
    stats, _ = res["chat"]
    assert stats.num_drafts > 0 and stats.acceptance_length > 1.1


@pytest.mark.ci
@pytest.mark.vllm
@requires_vllm
def test_committed_best_source_unpacks_and_serves_with_its_acceptance(smollm2, tmp_path):
    """benchmarks/strong_source/best (issue 25's best CPU source, committed without the target's embedding) is
    written back whole and served by vLLM: a drafter with a wrong or missing embedding would accept almost nothing."""
    import importlib.util
    from pathlib import Path

    from transformers import AutoTokenizer

    from eagle_migrate.engines.vllm_engine import measure

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("strong_source_best", root / "benchmarks" / "strong_source_best.py")
    best = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(best)
    drafter = best.unpack(tmp_path / "best", best.STATE, force=False)
    tok = AutoTokenizer.from_pretrained(str(smollm2))
    prompts = [list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                            tokenize=True, return_dict=True)["input_ids"])
               for q in ("Explain what a hash table is.", "Give me three tips for a job interview.",
                         "Write a short poem about the sea.", "How do I reverse a list in Python?")]
    res = measure(str(smollm2), str(drafter), {"chat": {"prompts": prompts, "max_tokens": 48}}, num_speculative_tokens=3,
                  max_model_len=1024)
    stats, _ = res["chat"]
    assert stats.num_drafts > 0 and stats.acceptance_length > 1.2, stats
