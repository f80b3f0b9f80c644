"""benchmarks/eagle3_scratch.py, the from-scratch EAGLE-3 helpers the trainers in benchmarks/ share: the draft
vocabulary and fresh weights taken from the target."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def _scratch():
    if "eagle3_scratch" not in sys.modules:
        spec = importlib.util.spec_from_file_location("eagle3_scratch", ROOT / "benchmarks" / "eagle3_scratch.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["eagle3_scratch"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["eagle3_scratch"]


def test_build_draft_vocab_keeps_frequent_ids_sorted():
    s = _scratch()
    v = s.build_draft_vocab(Counter({7: 10, 3: 5, 9: 1}), 20, 4, always=[0])
    assert v.tolist() == [0, 3, 7, 9]
    v = s.build_draft_vocab(Counter({7: 10}), 20, 4)
    assert v.tolist() == [0, 1, 2, 7]


def test_token_frequencies_counts_only_masked_in_tokens():
    s = _scratch()
    assert s.token_frequencies([[1, 2, 2], [2, 3]]) == Counter({2: 3, 1: 1, 3: 1})
    assert s.token_frequencies([[1, 2, 2], [2, 3]], [[0, 1, 1], [0, 1]]) == Counter({2: 2, 3: 1})


def test_init_from_target_takes_embeddings_head_rows_norm_and_d2t(toy_target):
    from eagle_migrate.drafter import EagleDrafter
    from eagle_migrate.target import load_target
    from eagle_migrate.toy import drafter_config

    s = _scratch()
    target = load_target(str(toy_target), device="cpu", dtype=torch.float32)
    vocab = target.model.get_output_embeddings().weight.shape[0]
    t_ids = torch.arange(0, vocab, 2)[: vocab // 2]
    m = EagleDrafter(drafter_config(fc_norm=True, norm_output=True, draft_vocab_size=len(t_ids)))
    s.init_from_target(m, target, t_ids, seed=3)
    head = target.model.get_output_embeddings().weight.detach().float()
    assert torch.equal(m.lm_head.weight, head[t_ids])
    assert torch.equal(m.embed_tokens.weight, target.model.get_input_embeddings().weight.detach().float())
    assert torch.equal(m.norm.weight, target.model.model.norm.weight.detach().float())
    assert torch.equal(m.to_target_ids(torch.arange(len(t_ids))), t_ids)
    assert all(torch.equal(n.weight, torch.ones_like(n.weight)) for n in m.fc_norm)
    w = m.fc.weight.detach().clone()
    s.init_from_target(m, target, t_ids, seed=3)
    assert torch.equal(m.fc.weight, w) and 0.015 < float(w.std()) < 0.025  # seeded, normal(0.02)
