"""The torch drafter module: cache consistency, the toy world's known drafts, 3.1 flags."""

from __future__ import annotations

import torch

from eagle_migrate import toy
from eagle_migrate.drafter import DrafterConfig, EagleDrafter, KVCache


def _target_aux(ids: list[int]) -> torch.Tensor:
    """Aux states of the successor target: (1 + alpha)^i * E[x] at each aux layer i."""
    e = torch.eye(toy.H) * toy.H**0.5
    return torch.cat([e[ids] * toy.aux_rms(i) for i in toy.AUX_IDS], dim=-1).unsqueeze(0)


def _load(kind: str, **flags) -> EagleDrafter:
    m = EagleDrafter(toy.drafter_config(**flags))
    missing, unexpected = m.load_state_dict(toy.drafter_state_dict(kind), strict=False)
    assert not unexpected
    assert set(missing) <= {"embed_tokens.weight"} | {f"fc_norm.{k}.weight" for k in range(3)}
    return m


def test_incremental_cache_equals_full_forward():
    torch.manual_seed(0)
    cfg = DrafterConfig(hidden_size=32, target_hidden_size=24, vocab_size=50, draft_vocab_size=40, intermediate_size=64,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_layers=2, fc_norm=True, norm_output=True)
    m = EagleDrafter(cfg)
    ids, g = torch.randint(0, 50, (2, 10)), torch.randn(2, 10, 32)
    pos = torch.arange(10).expand(2, 10)
    full = m.forward_step(ids, g, pos)
    cache = KVCache()
    parts = [m.forward_step(ids[:, a:b], g[:, a:b], pos[:, a:b], cache=cache) for a, b in ((0, 3), (3, 4), (4, 10))]
    assert torch.allclose(torch.cat([p.h_post for p in parts], 1), full.h_post, atol=1e-5)


def test_oracle_drafts_successors():
    m = _load("oracle")
    ids = [5, 9, 10, 11]  # the target continues 12, 13, ...; context x_0..x_n with x_n = 11
    drafts = m.draft(torch.tensor([ids]), _target_aux(ids[:-1]), 4)
    assert drafts.tolist() == [[12, 13, 14, 15]]


def test_aux_only_repeats_first_draft():
    m = _load("aux-only")
    ids = [3, 4, 5]
    assert m.draft(torch.tensor([ids]), _target_aux(ids[:-1]), 3).tolist() == [[6, 6, 6]]


def test_norm_output_changes_feedback_only_when_scales_differ():
    m3 = _load("oracle")
    m31 = _load("oracle", norm_output=True)
    ids = [1, 2, 3, 4, 5]
    a = m3.draft(torch.tensor([ids]), _target_aux(ids[:-1]), 3)
    b = m31.draft(torch.tensor([ids]), _target_aux(ids[:-1]), 3)
    assert a.tolist() == b.tolist() == [[6, 7, 8]]  # the toy's h_pre already has RMS 1


def test_fc_norm_with_rms_weights_reproduces_source():
    src = _load("oracle")
    m = _load("oracle", fc_norm=True)
    with torch.no_grad():
        for k, layer in enumerate(toy.AUX_IDS):
            m.fc_norm[k].weight.fill_(toy.aux_rms(layer))
    ids = [7, 8, 9, 10]
    aux = _target_aux(ids[:-1])
    assert torch.allclose(m.combine(aux), src.combine(aux), atol=1e-4)
    ones = _load("oracle", fc_norm=True)  # all-ones fc_norm (what vLLM uses when weights are missing) differs
    assert not torch.allclose(ones.combine(aux), src.combine(aux), atol=1e-2)


def test_d2t_maps_draft_ids_to_target_ids():
    cfg = toy.drafter_config(draft_vocab_size=32)
    m = EagleDrafter(cfg)
    m.d2t.copy_(torch.arange(32) * 1)  # draft i -> target 2i
    assert m.to_target_ids(torch.tensor([[0, 3, 31]])).tolist() == [[0, 6, 62]]


def test_attention_bias_means_zero_o_proj_bias_as_in_vllm(tmp_path):
    """vLLM's LlamaAttention gives o_proj a bias whenever attention_bias is set (missing = uninitialised there),
    so our module starts it at zero and the writer stores zeros when the source has only q/k/v biases."""
    from safetensors.torch import load_file

    from eagle_migrate.formats.write import write_vllm

    cfg = toy.drafter_config(attention_bias=True)
    m = EagleDrafter(cfg)
    assert torch.count_nonzero(m.layers[0].self_attn.o_proj.bias) == 0
    sd = toy.drafter_state_dict("oracle")
    for x in "qkv":
        sd[f"layers.0.self_attn.{x}_proj.bias"] = torch.randn(sd[f"layers.0.self_attn.{x}_proj.weight"].shape[0])
    write_vllm(cfg, sd, tmp_path)
    on_disk = load_file(str(tmp_path / "model.safetensors"))
    assert torch.count_nonzero(on_disk["layers.0.self_attn.o_proj.bias"]) == 0
    assert on_disk["layers.0.self_attn.o_proj.bias"].shape == (toy.H,)
