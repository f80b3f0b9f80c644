"""Our rotary embedding (drafter/model.py ``rope_inv_freq``) equals vLLM's ``get_rope`` for every rope type vLLM and
transformers know, on the same config (cos/sin including YaRN's / LongRoPE's attention factor, CPU, float32)."""

from __future__ import annotations

import pytest
import torch

from eagle_migrate import toy
from eagle_migrate.drafter.model import EagleDrafter
from eagle_migrate.drafter.rope import rope_parameters

from ..conftest import requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

HD = toy.HEAD_DIM
ROPES: dict[str, dict | None] = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "dynamic-trained": {"rope_type": "dynamic", "factor": 2.0, "max_trained_positions": 256},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
    "yarn-attention-factor": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 128,
                              "beta_fast": 16, "beta_slow": 2, "attention_factor": 1.3},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 256},
    "longrope": {"rope_type": "longrope", "original_max_position_embeddings": 256,
                 "short_factor": [1.0 + 0.05 * i for i in range(HD // 2)], "long_factor": [2.0 + 0.3 * i for i in range(HD // 2)]},
    "longrope-legacy-su": {"type": "su", "original_max_position_embeddings": 256,
                           "short_factor": [1.0] * (HD // 2), "long_factor": [3.0] * (HD // 2)},
}


def _vllm_cos_sin(cfg, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from types import SimpleNamespace
    from unittest import mock

    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers import rotary_embedding as re_mod
    from vllm.model_executor.layers.rotary_embedding import phi3_long_rope_scaled_rope as phi3

    rp = rope_parameters(cfg)
    fake = SimpleNamespace(model_config=SimpleNamespace(max_model_len=cfg.max_position_embeddings))  # vLLM's default
    re_mod._ROPE_DICT.clear()
    with set_current_vllm_config(VllmConfig()), mock.patch.object(phi3, "get_current_vllm_config", lambda: fake):
        emb = re_mod.get_rope(HD, max_position=cfg.max_position_embeddings, is_neox_style=True,
                              rope_parameters=rp, dtype=torch.float32)
    if hasattr(emb, "long_short_cos_sin_cache"):
        cache = emb.long_short_cos_sin_cache
        idx = positions + (emb.original_max_position_embeddings if emb.use_long_rope else 0)
    else:
        cache, idx = emb.cos_sin_cache, positions
    cos, sin = cache.index_select(0, idx).chunk(2, dim=-1)
    return cos, sin


@pytest.mark.parametrize("name", list(ROPES))
def test_rotary_embedding_equals_vllms(name):
    cfg = toy.drafter_config(rope_scaling=ROPES[name]).model_copy(update={"max_position_embeddings": 1024})
    with torch.device("meta"):  # how every loader builds the drafter: the frequencies must still be real
        m = EagleDrafter(cfg)
    assert m._inv_freq.device.type == "cpu"
    positions = torch.tensor([0, 1, 5, 17, 100, 255, 256, 700, 1023])
    cos, sin = m.rope(positions.unsqueeze(0), torch.float32)
    vcos, vsin = _vllm_cos_sin(cfg, positions)
    assert torch.allclose(cos[0, :, : HD // 2], vcos, rtol=1e-5, atol=2e-5), name
    assert torch.allclose(sin[0, :, : HD // 2], vsin, rtol=1e-5, atol=2e-5), name
    assert torch.equal(cos[0, :, : HD // 2], cos[0, :, HD // 2:])  # neox style: both halves
    if ROPES[name] is not None and name not in ("dynamic",):
        plain = EagleDrafter(toy.drafter_config()).rope(positions.unsqueeze(0), torch.float32)[0]
        assert not torch.allclose(plain, cos, atol=1e-3), f"{name}: the scaling changes nothing at these positions"
