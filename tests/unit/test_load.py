"""The one drafter loader (loader.py): every layout and every quantized format ``quantize`` writes reads back
into a drafter that the reference engine runs at the toy's exact acceptance length (issue 16.3); leftover or
missing tensors fail; the target's embedding / head are shared as vLLM shares them."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from eagle_migrate import toy
from eagle_migrate.errors import CheckpointError, UnsupportedError
from eagle_migrate.formats.output import save_safetensors
from eagle_migrate.loader import build_drafter, load_drafter, read_tensors
from eagle_migrate.quantize import quantize
from eagle_migrate.target import load_target
from eagle_migrate.validate.api import validate

SCHEMES = ["fp8-dynamic", "fp8", "nvfp4a16", "nvfp4"]


@pytest.fixture(scope="module")
def quantized(tmp_path_factory, toy_oracle, toy_target):
    root = tmp_path_factory.mktemp("q")
    return {s: quantize(toy_oracle, root / s, s, target=str(toy_target), data=toy.prompts(4, 12) if s in ("fp8", "nvfp4") else None,
                        validate="none").output for s in SCHEMES}


@pytest.mark.parametrize("scheme", SCHEMES)
def test_each_quantized_format_validates_in_the_reference_engine_at_the_exact_al(quantized, toy_target, scheme):
    """Before the one loader, the reference engine refused these (unexpected weight_scale / weight_packed)."""
    rep = validate(quantized[scheme], str(toy_target), engine="reference", suites=["chat"], num_prompts=3, max_tokens=16, k=3)
    assert rep.engine == "reference"
    assert rep.suites[0].new.acceptance_length == pytest.approx(4.0)  # the oracle: every draft accepted


@pytest.mark.parametrize("scheme", SCHEMES)
def test_quantized_drafter_computes_what_the_scheme_computes(quantized, toy_target, scheme):
    t = load_target(str(toy_target), with_tokenizer=False)
    ck, tensors, qc = read_tensors(quantized[scheme])
    assert qc["quant_method"] == "compressed-tensors" and "layers.0.mlp.down_proj.weight" in tensors
    assert not [n for n in tensors if n.endswith(("weight_scale", "weight_packed", "input_scale"))]
    m = load_drafter(quantized[scheme], t)
    hooked = {n for n, mod in m.named_modules() if mod._forward_pre_hooks}
    quantized_linears = {n.rsplit(".", 1)[0] for n in ck.canonical_names() if n.endswith(".weight_scale")}
    # activations are fake-quantized exactly where the scheme quantizes them (none for the weight-only nvfp4a16)
    assert hooked == (set() if scheme in ("nvfp4a16",) else quantized_linears)
    plain = load_drafter(quantized[scheme], t, simulate_activations=False)
    assert not any(mod._forward_pre_hooks for mod in plain.modules())
    assert torch.equal(m.embed_tokens.weight, t.embed_weight)  # shared, not copied


def test_leftover_and_missing_tensors_fail(tmp_path, toy_oracle):
    from eagle_migrate.formats import read_checkpoint

    ck = read_checkpoint(toy_oracle)
    sd = {n: ck.tensor(n) for n in ck.canonical_names()}
    emb = SimpleNamespace(embed_weight=torch.eye(toy.H) * toy.H ** 0.5, lm_head_weight=torch.zeros(toy.H, toy.H))
    m = build_drafter(ck.config, sd, emb)
    assert m.fc.weight.device.type == "cpu" and m._inv_freq.dtype == torch.float32
    with pytest.raises(CheckpointError, match="unexpected.*extra.weight"):
        build_drafter(ck.config, {**sd, "extra.weight": torch.zeros(2)}, emb)
    with pytest.raises(CheckpointError, match="missing.*fc.weight"):
        build_drafter(ck.config, {n: t for n, t in sd.items() if n != "fc.weight"}, emb)
    with pytest.raises(CheckpointError, match="embed_tokens.*pass the target"):
        load_drafter(toy_oracle)
    # lm_head allowed to stay unloaded (convert's statistics pass without logits)
    part = build_drafter(ck.config, {n: t for n, t in sd.items() if n != "lm_head.weight"}, None, allow_missing=("lm_head.weight", "embed_tokens.weight"))
    assert part.lm_head.weight.device.type == "meta"


def test_bf16_keeps_rope_in_float32(toy_oracle, toy_target):
    t = load_target(str(toy_target), with_tokenizer=False)
    m = load_drafter(toy_oracle, t, dtype=torch.bfloat16)
    assert m.fc.weight.dtype == torch.bfloat16 and m._inv_freq.dtype == torch.float32


def test_other_quantization_is_refused_with_a_reason(tmp_path, toy_oracle):
    out = tmp_path / "modelopt-like"
    out.mkdir()
    cfg = json.loads((toy_oracle / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "FP8"}
    (out / "config.json").write_text(json.dumps(cfg))
    from safetensors.torch import load_file

    save_safetensors(load_file(str(toy_oracle / "model.safetensors")), out / "model.safetensors", {"format": "pt"})
    with pytest.raises(UnsupportedError, match="cannot read back"):
        load_drafter(out, None)


def test_quantize_gate_without_vllm_uses_the_reference_engine(tmp_path, toy_oracle, toy_target, monkeypatch):
    """``--validate auto`` picked vLLM for FP8 whether or not it was installed."""
    from eagle_migrate.engines import vllm_engine

    monkeypatch.setattr(vllm_engine, "vllm_importable", lambda python=None: False)
    suites = {"toy": {"prompts": toy.prompts(2, 12), "max_tokens": 12, "ignore_eos": True}}
    r = quantize(toy_oracle, tmp_path / "q", "fp8-dynamic", target=str(toy_target), suites=suites, max_al_drop_pct=1.0)
    assert r.acceptance.engine == "reference"
    assert r.acceptance.before == pytest.approx(4.0) and r.acceptance.after == pytest.approx(4.0)
