"""MLA drafters with rope scaling (Kimi K2, DeepSeek-V3: ``rope_scaling: {type: yarn, factor, original_max_position_
embeddings, beta_fast, beta_slow, mscale, mscale_all_dim}``) against vLLM's own attention module.

vLLM's DeepseekV2MLAAttention (what Eagle3DeepseekV2ForCausalLM builds) is constructed here from the same config as in
a served drafter (transformers DeepseekV2Config + vLLM's patch_rope_parameters); its ``rotary_emb``
(DeepseekScalingRotaryEmbedding, is_neox_style=False) and ``scaling`` (the softmax scale, times mscale^2 under
deepseek_yarn) are compared with the drafter's rope tables (drafter/rope.py), the interleaved q/k rotation
(families/layers.py) and MLAAttention.scale (families/mla.py)."""

from __future__ import annotations

import pytest
import torch

from eagle_migrate import toy
from eagle_migrate.drafter import EagleDrafter
from eagle_migrate.families import layers

from ..conftest import requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

ORIG = 256
ROPES: dict[str, dict | None] = {
    "default": None,
    # Kimi K2's drafter (lightseekorg's / TorchSpec's kimi config): mscale == mscale_all_dim, so cos/sin are unscaled
    # and only the softmax scale grows by mscale(factor, 1) ** 2
    "kimi-k2-yarn": {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": ORIG, "beta_fast": 32,
                     "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "deepseek-v3-yarn": {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": ORIG,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    # mscale != mscale_all_dim: the cos/sin tables are scaled too
    "yarn-unequal-mscale": {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": ORIG, "beta_fast": 16,
                            "beta_slow": 2, "mscale": 1.0, "mscale_all_dim": 0.5},
    # no mscale_all_dim: cos/sin times mscale(factor, 1), softmax unscaled
    "yarn-no-all-dim": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIG},
    # attention_factor 1.0: vLLM picks deepseek_llama_scaling (no softmax mscale)
    "deepseek-llama-scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": ORIG,
                               "attention_factor": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
}


def _cfg(rope_scaling):
    factor = (rope_scaling or {}).get("factor", 4.0)
    return toy.drafter_config(family="mla", num_attention_heads=2, num_key_value_heads=2, rope_scaling=rope_scaling
                              ).model_copy(update={"rope_theta": 50000.0, "max_position_embeddings": int(ORIG * factor)})


@pytest.fixture(scope="module")
def vllm_attention():
    """Build vLLM's DeepseekV2MLAAttention for a drafter config (single process, TP 1)."""
    import tempfile

    from transformers import DeepseekV2Config
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps
    from vllm.model_executor.layers import rotary_embedding as re_mod
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2MLAAttention
    from vllm.transformers_utils.config import patch_rope_parameters

    vc = VllmConfig()
    with set_current_vllm_config(vc):
        if not ps.model_parallel_is_initialized():
            ps.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                            distributed_init_method=f"file://{tempfile.mktemp()}")
            ps.initialize_model_parallel(1, 1)

    def build(cfg):
        hf = DeepseekV2Config(hidden_size=cfg.hidden_size, num_attention_heads=cfg.num_attention_heads,
                              num_key_value_heads=cfg.num_key_value_heads, q_lora_rank=cfg.q_lora_rank,
                              kv_lora_rank=cfg.kv_lora_rank, qk_nope_head_dim=cfg.qk_nope_head_dim,
                              qk_rope_head_dim=cfg.qk_rope_head_dim, v_head_dim=cfg.v_head_dim,
                              rope_theta=cfg.rope_theta, rope_scaling=cfg.rope_scaling,
                              max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=cfg.rms_norm_eps)
        patch_rope_parameters(hf)
        re_mod._ROPE_DICT.clear()
        fresh = VllmConfig()  # one attention layer per config (vLLM refuses a second layer of the same name)
        with set_current_vllm_config(fresh):
            return DeepseekV2MLAAttention(
                vllm_config=fresh, config=hf, hidden_size=cfg.hidden_size, num_heads=cfg.num_attention_heads,
                qk_nope_head_dim=cfg.qk_nope_head_dim, qk_rope_head_dim=cfg.qk_rope_head_dim,
                v_head_dim=cfg.v_head_dim, q_lora_rank=cfg.q_lora_rank, kv_lora_rank=cfg.kv_lora_rank,
                max_position_embeddings=cfg.max_position_embeddings, prefix="layers.0.self_attn",
                input_size=2 * cfg.hidden_size)

    return build


@pytest.mark.parametrize("name", list(ROPES))
def test_mla_rope_and_softmax_scale_equal_vllms(name, vllm_attention):
    cfg = _cfg(ROPES[name])
    va = vllm_attention(cfg)
    want_type = {"default": "RotaryEmbedding", "deepseek-llama-scaling": "DeepseekScalingRotaryEmbedding"}.get(
        name, "DeepseekScalingRotaryEmbedding")
    assert type(va.rotary_emb).__name__ == want_type
    with torch.device("meta"):  # as every loader builds the drafter
        ours = EagleDrafter(cfg)
    rd, nh = cfg.qk_rope_head_dim, cfg.num_attention_heads

    # the softmax scale
    assert ours.layers[0].self_attn.scale == pytest.approx(va.scaling, rel=1e-12), name
    if name in ("kimi-k2-yarn", "deepseek-v3-yarn"):
        assert va.scaling > 1.2 * (cfg.head_dim ** -0.5)  # the mscale^2 is in play, so the test can fail

    # cos / sin tables
    positions = torch.tensor([0, 1, 5, 17, 100, ORIG - 1, ORIG, 3 * ORIG + 7, cfg.max_position_embeddings - 1])
    cos, sin = ours.rope(positions.unsqueeze(0), torch.float32)
    vcos, vsin = va.rotary_emb.cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
    torch.testing.assert_close(cos[0, :, : rd // 2], vcos, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(sin[0, :, : rd // 2], vsin, rtol=1e-5, atol=2e-5)

    # the rotation of q's rope part (every head) and of the shared k_pe, interleaved pairs
    g = torch.Generator().manual_seed(0)
    q = torch.randn(len(positions), nh, rd, generator=g)
    k = torch.randn(len(positions), 1, rd, generator=g)
    vq, vk = va.rotary_emb.forward_native(positions, q.clone(), k.clone())
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)  # [1, 1, T, rd]
    oq = layers.rope_interleaved(q.transpose(0, 1).unsqueeze(0), c, s)[0].transpose(0, 1)
    ok = layers.rope_interleaved(k.transpose(0, 1).unsqueeze(0), c, s)[0].transpose(0, 1)
    torch.testing.assert_close(oq, vq, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(ok, vk, rtol=1e-5, atol=2e-5)
    if ROPES[name] is not None:  # the scaling changes the rotation at these positions: the comparison can fail
        plain = EagleDrafter(_cfg(None)).rope(positions.unsqueeze(0), torch.float32)[0]
        assert not torch.allclose(plain[0, -1], cos[0, -1], atol=1e-3), name

