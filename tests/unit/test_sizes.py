"""formats/sizes.py: the drafter's sizes from tensor shapes first, the config second (no files, no findings), and
formats/checks.py: the traps those sizes set, one check per topic."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from eagle_migrate.errors import CheckpointError
from eagle_migrate.formats import checks
from eagle_migrate.formats.sizes import config_values, derive_sizes

H, HD, NH, NKV, I, V = 64, 16, 4, 2, 96, 100  # I: MLP width, as in docs/formats.md


def shapes(**over) -> dict[str, tuple[int, ...] | None]:
    p = "layers.0."
    s = {"fc.weight": (H, 3 * H), "norm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
         p + "hidden_norm.weight": (H,), p + "self_attn.q_proj.weight": (NH * HD, 2 * H),
         p + "self_attn.k_proj.weight": (NKV * HD, 2 * H), p + "self_attn.v_proj.weight": (NKV * HD, 2 * H),
         p + "self_attn.o_proj.weight": (H, NH * HD), p + "mlp.gate_proj.weight": (I, H),
         p + "mlp.up_proj.weight": (I, H), p + "mlp.down_proj.weight": (H, I), "lm_head.weight": (V, H)}
    s.update(over)
    return {k: v for k, v in s.items() if v is not None}


def sizes_of(shp: dict, flat: dict | None = None, aux_ids=None):
    return derive_sizes(list(shp), shp.get, flat or {}, layout="vllm", aux_ids=aux_ids, where="x",
                        missing=lambda c: f"x: no {c}")


def test_sizes_come_from_the_weights_not_the_config():
    flat = {"hidden_size": 128, "head_dim": 8, "num_attention_heads": 16, "vocab_size": 7, "target_hidden_size": 64}
    s = sizes_of(shapes(), flat)
    assert (s.generation, s.hidden_size, s.target_hidden_size, s.num_aux, s.intermediate_size, s.draft_vocab_size) == ("eagle3", H, H, 3, I, V)
    assert (s.head_dim, s.num_heads, s.num_kv_heads) == (8, 8, 4)  # config head_dim 8 fits the q/k rows, so it decides the split
    assert s.vocab_size == 7  # no t2d / embed_tokens: V is the config's (vocab_checks then reports Vd > V)
    codes = [f.code for f in checks.hidden_size_checks(s, flat) + checks.head_checks(s, flat) + checks.vocab_checks(s, flat)]
    assert codes == ["hidden_size_mismatch", "num_heads_mismatch", "draft_vocab_exceeds_vocab", "d2t_missing"]


def test_head_dim_from_q_norm_when_the_config_is_silent():
    s = sizes_of(shapes(**{"layers.0.self_attn.q_norm.weight": (32,), "layers.0.self_attn.k_norm.weight": (32,)}))
    assert (s.head_dim, s.num_heads, s.num_kv_heads, s.family) == (32, 2, 1, "qwen3")
    assert not s.head_dim_guessed


def test_ht_from_fc_norm_then_from_the_aux_id_count():
    s = sizes_of(shapes(**{"fc.weight": (H, 3 * 48), "fc_norm.0.weight": (48,), "fc_norm.1.weight": (48,),
                           "fc_norm.2.weight": (48,)}), {"target_hidden_size": 96})
    assert (s.target_hidden_size, s.num_aux) == (48, 3)
    assert [f.code for f in checks.hidden_size_checks(s, {"target_hidden_size": 96})] == ["target_hidden_size_mismatch"]
    s = sizes_of(shapes(**{"fc.weight": (H, 8 * H)}), {}, aux_ids=[1, 2])  # K=8 with Ht=H makes no sense: 2 ids
    assert (s.target_hidden_size, s.num_aux, s.target_hidden_from_ids) == (4 * H, 2, True)


def test_config_values_are_the_config_and_eagle2_flags_are_dropped():
    s = sizes_of(shapes(**{"input_norm.weight": (3 * H,)}))
    cv = config_values(s, {"use_aux_norm": True, "rope_theta": 5e5, "rms_norm_eps": 1e-6}, False)
    assert (cv.fc_norm, cv.norm_before_fc, cv.rope_theta, cv.rms_norm_eps) == (True, True, 5e5, 1e-6)


@pytest.mark.parametrize("over, message", [
    ({"norm.weight": (H + 1,), "fc.weight": (H + 1, 3 * H)}, "'norm.weight' is [65]"),  # the first contradiction
    ({"fc.weight": (H, 3 * H + 1)}, "neither a multiple of Ht"),
    ({"layers.0.self_attn.o_proj.weight": (H, 7)}, "o_proj is [64, 7]"),
    ({"lm_head.weight": (V, H + 1)}, "lm_head.weight is [100, 65]"),
    ({"d2t": (3,)}, "d2t is [3]"),
    ({"layers.0.mlp.gate_proj.weight": None}, "no 'layers.0.mlp.gate_proj.weight'"),
    ({"fc.weight": None}, "x: no fc.weight"),
])
def test_contradicting_tensors_raise(over, message):
    with pytest.raises(CheckpointError, match=message.replace("[", r"\[").replace("]", r"\]")):
        sizes_of(shapes(**over))


def test_derive_and_its_parts_are_short():
    root = Path(__file__).resolve().parents[2] / "eagle_migrate" / "formats"
    long = [(f, n.name, n.end_lineno - n.lineno + 1) for f in ("common.py", "sizes.py", "checks.py")
            for n in ast.walk(ast.parse((root / f).read_text())) if isinstance(n, ast.FunctionDef)
            and n.end_lineno - n.lineno + 1 > 60]
    assert not long, long
