"""read_checkpoint on tiny checkpoints of every layout; write_checkpoint round trips (vLLM and speculators)."""

from __future__ import annotations

import json

import pytest
import torch

from eagle_migrate import toy
from eagle_migrate.drafter.config import DrafterConfig
from eagle_migrate.errors import InputError, UnsupportedError
from eagle_migrate.formats import aux_ids, read_checkpoint, write_checkpoint

from ..layouts import AUX_CONVENTION, AUX_DECIDED_BY, EXPECTED, LAYOUT_NAMES, MLA, canonical_state_dict, write_layout

SIZE_FIELDS = ("hidden_size", "target_hidden_size", "num_aux", "vocab_size", "draft_vocab_size", "intermediate_size",
               "num_attention_heads", "num_key_value_heads", "head_dim", "num_layers")

# A drafter that exercises every size: H != Ht, Vd < V, K = 3, GQA, two layers, EAGLE-3.1 flags.
BIG = DrafterConfig(hidden_size=32, target_hidden_size=48, num_aux=3, vocab_size=100, draft_vocab_size=40, intermediate_size=64,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_layers=2, aux_layer_ids=[2, 5, 9],
                    fc_norm=True, norm_output=True, max_position_embeddings=4096, rope_theta=500000.0, has_embed_tokens=True)

# layouts whose producer cannot express H != Ht / a second layer / the config at all
NO_BIG = {"modelopt", "quantized-modelopt-nvfp4", "safeailab-eagle3-noconfig", "vllm-v0-eagle", "safeailab-eagle2", "mla"}


def _sizes(cfg: DrafterConfig) -> dict[str, int]:
    return {k: getattr(cfg, k) for k in SIZE_FIELDS}


@pytest.mark.parametrize("name", LAYOUT_NAMES)
def test_every_layout_toy(tmp_path, name):
    cfg, sd = toy.drafter_config(), toy.drafter_state_dict("oracle")
    ck = read_checkpoint(write_layout(name, cfg, sd, tmp_path / name))
    exp = EXPECTED[name]
    assert (ck.layout, ck.producer) == (exp["layout"], exp["producer"])
    assert ck.format == (exp["format"] or cfg.format_name)
    got = _sizes(ck.config)
    if name in ("vllm-v0-eagle", "safeailab-eagle2"):
        assert ck.config.generation == "eagle2" and ck.config.has_lm_head == (name == "vllm-v0-eagle")
        assert (got["hidden_size"], got["vocab_size"], got["draft_vocab_size"]) == (64, 64, 64)
        assert ck.config.fc_bias and ck.config.fc_in_features == 128
        return
    if name == "mla":
        assert ck.config.architecture == "mla"
        assert {k: getattr(ck.config, k) for k in MLA} == MLA  # every MLA size from the weights
        assert got["head_dim"] == MLA["qk_nope_head_dim"] + MLA["qk_rope_head_dim"]
        return
    assert got == _sizes(cfg)
    if name != "safeailab-eagle3-noconfig":
        # undecided ids read literally (what vLLM does); the convention is decided with a target (test_aux_ids.py)
        literal = [i - 1 for i in toy.AUX_IDS] if AUX_CONVENTION[name] == "output-of-layer" else toy.AUX_IDS
        if AUX_DECIDED_BY[name] == "fingerprint":  # decided by the writer's own key: vLLM ids
            literal = toy.AUX_IDS
        assert ck.config.aux_layer_ids == (None if name.startswith("safeailab") else literal)
        assert ck.aux.decided_by == AUX_DECIDED_BY[name]
        assert ck.config.max_position_embeddings == 1024


@pytest.mark.parametrize("name", [n for n in LAYOUT_NAMES if n not in NO_BIG])
def test_every_layout_all_sizes(tmp_path, name):
    sd = canonical_state_dict(BIG)
    ck = read_checkpoint(write_layout(name, BIG, sd, tmp_path / name))
    assert ck.layout == EXPECTED[name]["layout"] and ck.producer == EXPECTED[name]["producer"]
    assert ck.format == "eagle3.1"
    assert _sizes(ck.config) == _sizes(BIG)
    assert ck.config.fc_norm and ck.config.norm_output and ck.config.has_embed_tokens
    if not name.startswith("safeailab"):
        literal = [i - 1 for i in BIG.aux_layer_ids] if AUX_CONVENTION[name] == "output-of-layer" else BIG.aux_layer_ids
        if AUX_DECIDED_BY[name] == "fingerprint":  # decided by the writer's own key: vLLM ids
            literal = BIG.aux_layer_ids
        assert ck.config.aux_layer_ids == literal, "undecided aux ids are read literally, as vLLM reads them"
    assert ck.config.rope_theta == (10000.0 if name.startswith("safeailab") else 500000.0)
    errors = [f.code for f in ck.findings if f.severity == "error"]
    expected_errors = {"model-prefix": ["model_prefix"]}.get(name, [])
    assert errors == expected_errors


def test_layout_alone_never_shifts_aux_ids(tmp_path):
    """The old reader shifted SpecForge/ModelOpt/TorchSpec ids by +1 from the layout alone (a guess: vLLM itself
    reads midlayer.* checkpoints literally). Now both readings are kept and the ambiguity is reported."""
    cfg, sd = toy.drafter_config(), toy.drafter_state_dict("oracle")
    for name in ("specforge", "modelopt", "vllm-plain"):  # TorchSpec's own key decides (test_aux_ids.py)
        ck = read_checkpoint(write_layout(name, cfg, sd, tmp_path / name))
        stored = ck.meta["aux_ids_stored"]
        assert ck.aux.stored == stored and ck.config.aux_layer_ids == stored and not ck.aux.decided
        assert {c.convention: c.ids for c in ck.aux.candidates} == {"vllm": stored, "output-of-layer": [i + 1 for i in stored]}
        f = [f for f in ck.findings if f.code == "aux_ids_convention_ambiguous"]
        assert f and f[0].severity == "warning" and "--aux-ids-convention" in f[0].message


@pytest.mark.parametrize("model_type,layout,conv", [("kimi_k2", "torchspec", "output-of-layer"), ("kimi_k2", "torchspec-vllm", "vllm")])
def test_torchspec_kimi_rule_is_a_fingerprint(tmp_path, model_type, layout, conv):
    """TorchSpec's exporter adds +1 for kimi_k2 only: native kimi_k2 ids are output-of-layer, --vllm ones vLLM's."""
    cfg, sd = toy.drafter_config(), toy.drafter_state_dict("oracle")
    p = write_layout(layout, cfg, sd, tmp_path / layout, aux_convention=conv)  # as that exporter writes them
    d = json.loads((p / "config.json").read_text())
    d["model_type"] = model_type
    (p / "config.json").write_text(json.dumps(d))
    ck = read_checkpoint(p)
    assert (ck.aux.convention, ck.aux.decided_by) == (conv, "fingerprint")
    assert ck.config.aux_layer_ids == toy.AUX_IDS


def test_speculators_converted_ids_are_not_fingerprinted(tmp_path):
    """`speculators convert` (Eagle3Speculator) copies a source's ids unchanged; its trainer (Eagle3DraftModel) does not."""
    cfg, sd = toy.drafter_config(), toy.drafter_state_dict("oracle")
    p = write_layout("speculators", cfg, sd, tmp_path / "s")
    assert read_checkpoint(p).aux.decided_by == "fingerprint"
    d = json.loads((p / "config.json").read_text())
    d["architectures"] = ["Eagle3Speculator"]
    (p / "config.json").write_text(json.dumps(d))
    assert read_checkpoint(p).aux.decided_by == "undecided"


def test_safeailab_without_config_reads_weights_only(tmp_path):
    cfg, sd = toy.drafter_config(), toy.drafter_state_dict("oracle")
    p = write_layout("safeailab-eagle3-noconfig", cfg, sd, tmp_path / "s")
    assert not (p / "config.json").exists() and (p / "pytorch_model.bin").exists()
    ck = read_checkpoint(p / "pytorch_model.bin")  # a single file works too
    assert ck.layout == "safeailab-eagle3" and _sizes(ck.config) == _sizes(cfg)
    codes = {f.code for f in ck.findings}
    assert {"config_missing", "aux_ids_missing", "head_dim_guessed"} <= codes


def _same_tensors(a, b):
    assert set(a.canonical_names()) - {"t2d", "d2t"} == set(b.canonical_names()) - {"t2d", "d2t"}
    for n in a.canonical_names():
        if n in ("t2d", "d2t") and not b.has(n):
            continue
        ta, tb = a.tensor(n), b.tensor(n)
        assert ta.dtype == tb.dtype and torch.equal(ta, tb), n


@pytest.mark.parametrize("src", ["safeailab-eagle3", "specforge", "speculators", "modelopt", "torchspec", "sharded", "model-prefix"])
@pytest.mark.parametrize("out_layout", ["vllm", "speculators"])
def test_write_round_trip(tmp_path, src, out_layout):
    cfg = BIG if src != "modelopt" else BIG.model_copy(update={"target_hidden_size": 32, "has_embed_tokens": False})
    sd = canonical_state_dict(cfg)
    ck = read_checkpoint(write_layout(src, cfg, sd, tmp_path / "src"))
    if src.startswith("safeailab"):  # ids are never stored by SafeAILab: the user supplies them on conversion
        ck.config = ck.config.model_copy(update={"aux_layer_ids": [2, 5, 9], "norm_output": True, "rope_theta": 500000.0})
    if not ck.aux.decided:
        # an undecided reading is carried verbatim and marked undecided (never laundered into our fingerprint) ...
        carried = read_checkpoint(write_checkpoint(ck, tmp_path / "carried", layout=out_layout, verifier="toy-target"))
        assert carried.producer == "eagle-migrate" and not carried.aux.decided and carried.aux.stored == ck.aux.stored
        assert carried.config.aux_layer_ids == ck.config.aux_layer_ids
        # ... and writing other ids than the stored ones while undecided would pick a convention: refused
        import copy

        shifted = copy.copy(ck)
        shifted.config = ck.config.model_copy(update={"aux_layer_ids": [i + 1 for i in ck.config.aux_layer_ids]})
        with pytest.raises(InputError, match="undecided"):
            write_checkpoint(shifted, tmp_path / "out-shifted", layout=out_layout, verifier="toy-target")
        aux_ids.apply(ck, aux_ids.resolve(ck.aux, 3, 12, override=AUX_CONVENTION[src]))
    out = write_checkpoint(ck, tmp_path / "out", layout=out_layout, verifier="toy-target")
    back = read_checkpoint(out)
    assert back.producer == "eagle-migrate" and back.layout == out_layout
    assert back.config == ck.config
    assert not [f for f in back.findings if f.severity == "error"], back.findings
    _same_tensors(ck, back)
    names = set(back.store.names())
    assert not any(n.startswith(("model.", "midlayer.")) for n in names)
    assert ("d2t" in names) == cfg.uses_d2t
    assert ("t2d" in names) == (out_layout == "speculators" and cfg.uses_d2t)


def test_vllm_writer_emit_checklist(tmp_path):
    sd = canonical_state_dict(BIG)
    out = write_checkpoint(BIG, tmp_path / "o", "vllm", sd)
    c = json.loads((out / "config.json").read_text())
    assert c["architectures"] == ["LlamaForCausalLMEagle3"] and c["model_type"] == "llama"
    assert c["fc_norm"] is True and c["norm_output"] is True and c["norm_before_residual"] is False
    assert c["eagle_aux_hidden_state_layer_ids"] == c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 5, 9]
    assert c["num_hidden_layers"] == 2 and c["target_hidden_size"] == 48 and c["tie_word_embeddings"] is False


def test_speculators_writer_config(tmp_path):
    sd = canonical_state_dict(BIG)
    out = write_checkpoint(BIG, tmp_path / "o", "speculators", sd, verifier="meta-llama/X")
    c = json.loads((out / "config.json").read_text())
    assert "model_type" not in c and c["speculators_model_type"] == "eagle3"
    for k in ("fc_norm", "norm_output", "norm_before_residual", "norm_before_fc"):
        assert k in c and isinstance(c[k], bool)
    assert c["transformer_layer_config"]["vocab_size"] == 100 and c["draft_vocab_size"] == 40
    assert c["speculators_config"]["verifier"]["name_or_path"] == "meta-llama/X"
    assert c["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    # vLLM's own parser accepts it
    pytest.importorskip("vllm")
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    SpeculatorsConfig.validate_speculators_config(c)
    hf = SpeculatorsConfig.extract_transformers_pre_trained_config(json.loads(json.dumps(c)))
    assert hf["fc_norm"] and hf["norm_output"] and hf["norm_before_residual"] is False
    assert hf["eagle_aux_hidden_state_layer_ids"] == [2, 5, 9]


def test_write_refuses_existing_output_and_unsupported(tmp_path):
    from eagle_migrate.errors import OutputExistsError

    cfg, sd = toy.drafter_config(), toy.drafter_state_dict("oracle")
    (tmp_path / "o").mkdir()
    with pytest.raises(OutputExistsError):
        write_checkpoint(cfg, tmp_path / "o", "vllm", sd)
    for name in ("safeailab-eagle2",):
        ck = read_checkpoint(write_layout(name, cfg, sd, tmp_path / name))
        with pytest.raises(UnsupportedError):
            write_checkpoint(ck, tmp_path / f"w-{name}")
        assert not (tmp_path / f"w-{name}").exists()


def test_write_is_atomic_on_missing_tensor(tmp_path):
    cfg, sd = toy.drafter_config(), toy.drafter_state_dict("oracle")
    del sd["norm.weight"]
    with pytest.raises(Exception, match="norm.weight"):
        write_checkpoint(cfg, tmp_path / "o", "vllm", sd)
    assert list(tmp_path.iterdir()) == []


def test_quantized_checkpoints_report_scheme_and_logical_shapes(tmp_path):
    cfg, sd = toy.drafter_config(), toy.drafter_state_dict("oracle")
    fp8 = read_checkpoint(write_layout("quantized-fp8", cfg, sd, tmp_path / "fp8"))
    assert fp8.quantization["quant_method"] == "compressed-tensors" and fp8.quantization["format"] == "float-quantized"
    assert fp8.quantization["scheme"].startswith("float-quantized:w8f")
    w4 = read_checkpoint(write_layout("quantized-w4a16", cfg, sd, tmp_path / "w4"))
    assert "g16" in w4.quantization["scheme"]
    assert w4.meta["logical_shapes"]["layers.0.self_attn.q_proj.weight"] == (64, 128)
    assert _sizes(w4.config) == _sizes(cfg)
    nv = read_checkpoint(write_layout("quantized-modelopt-nvfp4", cfg, sd, tmp_path / "nv"))
    assert nv.producer == "modelopt" and nv.quantization["scheme"] == "nvfp4"
    assert nv.info("layers.0.self_attn.q_proj.weight").shape == (64, 64)  # uint8, two values per byte
    # ModelOpt's keys do not decide the convention: the ids are read literally until a target measures them
    assert _sizes(nv.config) == _sizes(cfg) and nv.config.aux_layer_ids == [i - 1 for i in toy.AUX_IDS] and not nv.aux.decided
    # a quantized checkpoint is copied as is, with its quantization_config (its ids decided first: vLLM's here)
    aux_ids.apply(fp8, aux_ids.resolve(fp8.aux, 3, toy.NUM_LAYERS, override="vllm"))
    out = write_checkpoint(fp8, tmp_path / "fp8-out")
    c = json.loads((out / "config.json").read_text())
    assert c["quantization_config"]["format"] == "float-quantized"
    back = read_checkpoint(out)
    assert back.info("layers.0.self_attn.q_proj.weight").dtype == "float8_e4m3fn"
    assert back.info("layers.0.self_attn.q_proj.weight_scale").dtype == "float32"


def test_index_or_config_path_reads_the_folder(tmp_path):
    p = write_layout("sharded", BIG, canonical_state_dict(BIG), tmp_path / "s")
    for f in ("model.safetensors.index.json", "config.json"):
        ck = read_checkpoint(p / f)
        assert ck.layout == "vllm" and _sizes(ck.config) == _sizes(BIG) and len(ck.store.files) == 2


def test_tensor_store_mapped_is_a_zero_copy_view(tmp_path):
    """TensorStore.mapped: the same values and dtype as get(), backed by the file (no copy)."""
    from safetensors.torch import save_file

    from eagle_migrate.formats.io import TensorStore

    g = torch.Generator().manual_seed(0)
    sd = {"emb": torch.randn(1000, 64, generator=g).to(torch.bfloat16), "n": torch.arange(7, dtype=torch.int64),
          "w": torch.randn(3, 5, generator=g)}
    save_file(sd, str(tmp_path / "m.safetensors"))
    st = TensorStore(tmp_path, [tmp_path / "m.safetensors"])
    for name, t in sd.items():
        m = st.mapped(name)
        assert m.dtype == t.dtype and m.shape == t.shape and torch.equal(m, t) and torch.equal(m, st.get(name))
    emb = st.mapped("emb")
    rows = emb[torch.tensor([3, 999, 3])]  # a lookup reads three rows
    assert torch.equal(rows, sd["emb"][[3, 999, 3]])
    # the view shares the mapped file's memory (no copy): two views of one tensor have the same data pointer.
    # (The mapping is read-only: a write would fault, so nothing in the project writes to it.)
    assert st.mapped("emb").data_ptr() == emb.data_ptr()

