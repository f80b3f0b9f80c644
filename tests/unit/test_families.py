"""Drafter families: the Qwen3 layer (Eagle3Qwen3ForCausalLM) next to the Llama one, end to end on tiny fixtures.

What vLLM does (qwen3_eagle3.py, qwen3.py; vllm-contract.md section 13): per-head RMSNorm q_norm / k_norm [head_dim]
on queries and keys before rope, no o_proj bias, head_dim from the config (Qwen3Config's default is 128, not
H / heads), the family chosen by the architecture (HF layout) or transformer_layer_config.model_type (speculators).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from eagle_migrate import toy
from eagle_migrate.drafter import EagleDrafter
from eagle_migrate.errors import CheckpointError
from eagle_migrate.formats import aux_ids, read_checkpoint, write_checkpoint
from eagle_migrate.formats.output import save_safetensors, write_json
from eagle_migrate.formats.vllm import vllm_config_dict, vllm_tensor_names
from eagle_migrate.inspection import inspect_checkpoint

from ..layouts import AUX_CONVENTION, EXPECTED, LAYOUT_NAMES, canonical_state_dict, hf_config, write_layout

QWEN3_LAYOUTS = ["vllm", "vllm-plain", "speculators", "speculators-ours", "specforge"]


def qcfg(**kw):
    return toy.drafter_config(family="qwen3", **kw)


def codes(ck) -> set[str]:
    return {f.code for f in ck.findings}


def errors(ck) -> set[str]:
    return {f.code for f in ck.findings if f.severity == "error"}


# ----- the drafter math ---------------------------------------------------------------------------------------------
def _qwen3_drafter(seed: int = 0) -> EagleDrafter:
    cfg = qcfg()
    m = EagleDrafter(cfg)
    m.load_state_dict(canonical_state_dict(cfg, seed, embed=True), strict=True)
    return m.eval()


def test_qwen3_attention_is_per_head_rmsnorm_before_rope():
    """Our layer against a hand-written Qwen3 attention (qwen3.py Qwen3Attention.forward) on the same weights."""
    m = _qwen3_drafter()
    cfg, att = m.cfg, m.layers[0].self_attn
    assert not hasattr(att.o_proj, "bias") or att.o_proj.bias is None
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 5, 2 * cfg.hidden_size, generator=g)
    pos = torch.arange(5).unsqueeze(0)
    cos, sin = m.rope(pos, x.dtype)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()[None, None]
    ours, _, _ = att(x, cos, sin, causal, None, 0)

    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    assert hd * nh != cfg.hidden_size  # the fixture's head_dim is not H / heads

    def rms(t, w):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * w

    q = rms((x @ att.q_proj.weight.T).view(1, 5, nh, hd), att.q_norm.weight)
    k = rms((x @ att.k_proj.weight.T).view(1, 5, nkv, hd), att.k_norm.weight)
    v = (x @ att.v_proj.weight.T).view(1, 5, nkv, hd)
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2).float() / hd))
    ang = torch.arange(5).float()[:, None] * inv
    c, s = torch.cat([ang.cos()] * 2, -1)[None, :, None], torch.cat([ang.sin()] * 2, -1)[None, :, None]

    def rot(t):
        a, b = t.chunk(2, -1)
        return t * c + torch.cat([-b, a], -1) * s

    q, k = rot(q).transpose(1, 2), rot(k).transpose(1, 2).repeat_interleave(nh // nkv, 1)
    v = v.transpose(1, 2).repeat_interleave(nh // nkv, 1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
    scores = scores.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
    ref = (scores.softmax(-1) @ v).transpose(1, 2).reshape(1, 5, nh * hd) @ att.o_proj.weight.T
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_qk_norm_weights_change_the_drafts():
    """q_norm / k_norm are used (a Llama layer on the same weights, or all-ones norms, drafts differently)."""
    m = _qwen3_drafter(seed=5)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, toy.H, (1, 20), generator=g)
    aux = torch.randn(1, 19, 3 * toy.H, generator=g) * 3
    h0 = m.forward_step(ids[:, 1:], m.combine(aux), torch.arange(19).unsqueeze(0)).h_post
    with torch.no_grad():
        m.layers[0].self_attn.q_norm.weight.mul_(3.0)
    h1 = m.forward_step(ids[:, 1:], m.combine(aux), torch.arange(19).unsqueeze(0)).h_post
    assert (h0 - h1).abs().max() > 1e-3


def test_qwen3_toy_drafters_draft_successors(tmp_path):
    """The Qwen3 successor world: same exact behaviour as the Llama one (oracle drafts x+1, x+2, ...)."""
    from eagle_migrate.target import load_target
    from eagle_migrate.engines.reference import load_drafter

    target = load_target(str(toy.write_target(tmp_path / "t", family="qwen3")), with_tokenizer=False)
    assert type(target.model).__name__ == "Qwen3ForCausalLM" and target.tokenizer is None
    seq = torch.tensor([[(7 + i) % toy.H for i in range(10)]])
    aux, logits = target.forward(seq, toy.AUX_IDS)
    assert torch.equal(logits.argmax(-1), (seq + 1) % toy.H)  # the target's greedy token is x + 1
    # aux states grow by (1 + alpha) per layer: the layers are distinguishable
    rms = [float(aux[0, :, k * toy.H:(k + 1) * toy.H].pow(2).mean().sqrt()) for k in range(3)]
    assert rms == pytest.approx([toy.aux_rms(i) for i in toy.AUX_IDS], rel=1e-4)
    for kind, want in (("oracle", [17, 18, 19]), ("aux-only", [17, 17, 17])):
        d = load_drafter(toy.write_drafter(tmp_path / kind, kind, family="qwen3"), target)
        assert d.cfg.architecture == "qwen3"
        assert d.draft(seq, aux[:, :9], 3)[0].tolist() == want


# ----- the writer ---------------------------------------------------------------------------------------------------
def test_vllm_layout_for_qwen3(tmp_path):
    cfg = qcfg(fc_norm=True, norm_output=True).model_copy(update={"num_aux": 2, "aux_layer_ids": [1, 5]})
    d = vllm_config_dict(cfg)
    assert d["architectures"] == ["Eagle3Qwen3ForCausalLM"] and d["model_type"] == "qwen3"
    assert d["head_dim"] == 32 and d["num_attention_heads"] == 4 and d["hidden_size"] == 64
    assert d["eagle_aux_hidden_state_layer_ids"] == [1, 5] and d["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 5]
    assert d["num_aux_hidden_states"] == 2 and d["fc_norm"] is True and d["norm_output"] is True
    names = vllm_tensor_names(cfg)
    assert "layers.0.self_attn.q_norm.weight" in names and "layers.0.self_attn.k_norm.weight" in names
    biased = vllm_tensor_names(qcfg(attention_bias=True))
    assert "layers.0.self_attn.q_proj.bias" in biased and "layers.0.self_attn.o_proj.bias" not in biased  # Qwen3: never
    # what vLLM builds from it: transformers' Qwen3Config with our head_dim (not its default 128)
    from transformers import AutoConfig

    write_json(tmp_path / "config.json", d)
    hf = AutoConfig.from_pretrained(str(tmp_path))
    assert type(hf).__name__ == "Qwen3Config" and hf.head_dim == 32


def test_writer_refuses_a_qwen3_drafter_without_qk_norm(tmp_path):
    sd = canonical_state_dict(qcfg())
    del sd["layers.0.self_attn.k_norm.weight"]
    with pytest.raises(Exception, match="k_norm"):
        write_checkpoint(qcfg(), tmp_path / "out", tensors=sd)


def test_speculators_layout_for_qwen3_is_what_vllm_maps_to_eagle3qwen3(tmp_path):
    from vllm.transformers_utils.configs.speculators.algos import update_eagle3

    cfg = qcfg()
    write_checkpoint(cfg, tmp_path / "s", "speculators", canonical_state_dict(cfg), verifier="q")
    d = json.loads((tmp_path / "s" / "config.json").read_text())
    tlc = d["transformer_layer_config"]
    assert tlc["model_type"] == "qwen3" and tlc["architectures"] == ["Qwen3ForCausalLM"] and tlc["head_dim"] == 32
    assert d["speculators_config"]["verifier"]["architectures"] == ["Qwen3ForCausalLM"]
    pre = dict(tlc)
    update_eagle3(d, pre)
    assert pre["architectures"] == ["Eagle3Qwen3ForCausalLM"]


# ----- reading every producer layout that writes Qwen3 drafters --------------------------------------------------------
@pytest.mark.parametrize("name", QWEN3_LAYOUTS)
def test_every_qwen3_layout_reads_as_qwen3(tmp_path, name):
    cfg = qcfg(fc_norm=name != "specforge")
    sd = canonical_state_dict(cfg, 1)
    ck = read_checkpoint(write_layout(name, cfg, sd, tmp_path / name))
    exp = EXPECTED[name]
    assert (ck.layout, ck.producer) == (exp["layout"], exp["producer"])
    c = ck.config
    assert c.architecture == "qwen3" and c.format_name == cfg.format_name
    assert (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (64, 4, 2, 32)
    # ids nothing in the files decides are read literally (the aux-id convention is measured on a target, never
    # guessed from the layout: tests/unit/test_aux_ids.py); decide with the producer's convention to write them
    assert c.aux_layer_ids == ([i - 1 for i in toy.AUX_IDS] if AUX_CONVENTION[name] == "output-of-layer" else toy.AUX_IDS)
    if not ck.aux.decided:
        aux_ids.apply(ck, aux_ids.resolve(ck.aux, ck.config.num_aux, toy.NUM_LAYERS, override=AUX_CONVENTION[name]))
    assert ck.config.aux_layer_ids == toy.AUX_IDS
    # SpecForge always writes d2t, an identity one when Vd = V, which vLLM >= 0.30 refuses (its own finding)
    assert errors(ck) <= ({"d2t_with_full_vocab"} if name == "specforge" else set()), ck.findings
    assert "head_dim_not_hidden_over_heads" in codes(ck)
    tol = 1e-2 if name in ("speculators", "specforge") else 0  # bf16 producers
    torch.testing.assert_close(ck.tensor("layers.0.self_attn.q_norm.weight").float(), sd["layers.0.self_attn.q_norm.weight"], atol=tol, rtol=tol)
    # and written again as the vLLM layout: a Qwen3 drafter with every q_norm/k_norm
    out = write_checkpoint(ck, tmp_path / "out")
    again = read_checkpoint(out)
    assert again.config.architecture == "qwen3" and again.has("layers.0.self_attn.k_norm.weight")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Eagle3Qwen3ForCausalLM"]


@pytest.mark.parametrize("name", [n for n in LAYOUT_NAMES if n not in QWEN3_LAYOUTS and "mla" not in n and "quantized" not in n
                                  and n not in ("vllm-v0-eagle", "safeailab-eagle2")])
def test_qk_norm_weights_make_a_qwen3_drafter_in_any_layout(tmp_path, name):
    """The weights decide, whatever the layout (SafeAILab without a config included)."""
    cfg = qcfg()
    ck = read_checkpoint(write_layout(name, cfg, canonical_state_dict(cfg, 2), tmp_path / name))
    assert ck.config.architecture == "qwen3" and ck.config.head_dim == 32
    assert not {"family_mismatch", "qk_norm_weights_missing", "qk_norm_weights_incomplete"} & errors(ck)


def test_inspect_reports_the_qwen3_family(tmp_path):
    cfg = qcfg(draft_vocab_size=48)
    r = inspect_checkpoint(write_layout("specforge", cfg, canonical_state_dict(cfg), tmp_path / "sf"))
    assert (r.format, r.producer, r.architecture) == ("eagle3", "specforge", "qwen3")
    s = r.sizes
    assert (s.head_dim, s.num_attention_heads, s.num_key_value_heads, s.hidden_size, s.vocab_size, s.draft_vocab_size) == (32, 4, 2, 64, 64, 48)
    assert r.ok, r.errors


def test_llama_drafters_stay_llama(tmp_path):
    ck = read_checkpoint(write_layout("vllm-plain", toy.drafter_config(), toy.drafter_state_dict(), tmp_path / "l"))
    assert ck.config.architecture == "llama" and not hasattr(EagleDrafter(ck.config).layers[0].self_attn, "q_norm")


# ----- the family's traps ---------------------------------------------------------------------------------------------
def _plain(tmp_path, cfg, sd, **cfg_update):
    tmp_path.mkdir(parents=True, exist_ok=True)
    save_safetensors(sd, tmp_path / "model.safetensors", {"format": "pt"})
    d = hf_config(cfg)
    for k, v in cfg_update.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    write_json(tmp_path / "config.json", d)
    return read_checkpoint(tmp_path)


def test_trap_qwen3_config_without_qk_norm_weights(tmp_path):
    sd = {k: v for k, v in canonical_state_dict(qcfg()).items() if "_norm.weight" not in k or "self_attn" not in k}
    ck = _plain(tmp_path / "a", qcfg(), sd)
    assert ck.config.architecture == "qwen3" and "qk_norm_weights_missing" in errors(ck)
    # the same by model_type alone (no architecture we know)
    ck = _plain(tmp_path / "b", qcfg(), sd, architectures=["SomethingElse"])
    assert ck.config.architecture == "qwen3" and "qk_norm_weights_missing" in errors(ck)


def test_trap_qk_norm_weights_under_a_llama_config(tmp_path):
    ck = _plain(tmp_path, qcfg(), canonical_state_dict(qcfg()), architectures=["LlamaForCausalLMEagle3"], model_type="llama")
    assert ck.config.architecture == "qwen3" and "family_mismatch" in errors(ck)


def test_trap_qwen3_without_head_dim_in_the_config(tmp_path):
    """Qwen3Config's default head_dim is 128: with head_dim 32 != H / heads and no head_dim key, vLLM mis-builds."""
    ck = _plain(tmp_path, qcfg(), canonical_state_dict(qcfg()), head_dim=None)
    assert ck.config.head_dim == 32  # from the q_norm width, not H / heads = 16
    assert "head_dim_missing" in errors(ck)


def test_trap_fc_norm_flag_without_weights_in_a_qwen3_drafter(tmp_path):
    cfg = qcfg(fc_norm=True)
    sd = {k: v for k, v in canonical_state_dict(cfg).items() if not k.startswith("fc_norm.")}
    ck = _plain(tmp_path, cfg, sd)
    assert ck.config.architecture == "qwen3" and "fc_norm_weights_missing" in errors(ck)


def test_trap_incomplete_and_misshapen_qk_norm(tmp_path):
    cfg = qcfg().model_copy(update={"num_layers": 2})
    sd = canonical_state_dict(cfg)
    del sd["layers.1.self_attn.q_norm.weight"]
    ck = _plain(tmp_path / "a", cfg, sd)
    assert "qk_norm_weights_incomplete" in errors(ck)
    sd = canonical_state_dict(qcfg())
    sd["layers.0.self_attn.k_norm.weight"] = torch.ones(16)
    with pytest.raises(CheckpointError, match="k_norm"):
        _plain(tmp_path / "b", qcfg(), sd)


# ----- convert / quantize keep the family -------------------------------------------------------------------------------
def test_convert_and_quantize_keep_qwen3(tmp_path):
    from eagle_migrate.convert import convert
    from eagle_migrate.quantize import quantize

    target = str(toy.write_target(tmp_path / "t", family="qwen3"))
    src = toy.write_drafter(tmp_path / "src", "oracle", family="qwen3")
    convert(src, target, tmp_path / "31", num_sequences=8, command="test", calibrate=False)
    ck = read_checkpoint(tmp_path / "31")
    assert ck.config.architecture == "qwen3" and ck.format == "eagle3.1" and not errors(ck)
    # the toy's fc chunks are divided by each aux layer's RMS: fc_norm initialised from target statistics finds it
    for k, i in enumerate(toy.AUX_IDS):
        w = ck.tensor(f"fc_norm.{k}.weight").float()
        assert float(w.mean()) == pytest.approx(toy.aux_rms(i), rel=0.05)
    qn = toy.drafter_state_dict("oracle", family="qwen3")["layers.0.self_attn.q_norm.weight"]
    torch.testing.assert_close(ck.tensor("layers.0.self_attn.q_norm.weight").float(), qn, rtol=1e-2, atol=1e-2)
    q = quantize(src, tmp_path / "fp8", "fp8-dynamic", validate="none")
    assert not any("norm" in p for p in q.quantized) and "layers.0.self_attn.q_proj" in q.quantized
    ckq = read_checkpoint(tmp_path / "fp8")
    assert ckq.config.architecture == "qwen3"
    assert ckq.info("layers.0.self_attn.q_norm.weight").dtype in ("float32", "bfloat16", "float16")


def test_calibration_runs_on_a_qwen3_drafter_and_trains_its_qk_norms_with_all(tmp_path):
    """calibrate runs on the Qwen3 layer; --train all includes q_norm / k_norm (the norm modes keep them: they
    neither see the inserted fc_norm output nor the fed-back state directly)."""
    from eagle_migrate.calibrate import trainable_names
    from eagle_migrate.convert import convert

    names = trainable_names(EagleDrafter(qcfg()), "all")
    assert "layers.0.self_attn.q_norm.weight" in names and "layers.0.self_attn.k_norm.weight" in names
    assert not any("q_norm" in n or "k_norm" in n for n in trainable_names(EagleDrafter(qcfg()), "norms"))
    target = str(toy.write_target(tmp_path / "t", family="qwen3"))
    src = toy.write_drafter(tmp_path / "src", "random", family="qwen3")
    with pytest.warns(UserWarning, match="did not improve"):  # a random drafter in 4 steps: expected
        res = convert(src, target, tmp_path / "cal", num_sequences=8, command="test", calibrate=True, steps=4, train="all")
    assert res.calibration.improved is not None  # the fine-tune ran
    ck = read_checkpoint(tmp_path / "cal")
    assert ck.config.architecture == "qwen3" and ck.format == "eagle3.1"
    assert ck.has("layers.0.self_attn.q_norm.weight") and ck.has("layers.0.self_attn.k_norm.weight")
