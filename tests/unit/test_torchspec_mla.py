"""TorchSpec's Kimi K2 MLA drafter, both exports of its ``tools/convert_to_hf.py``, read by formats/torchspec.py.

TorchSpec (lightseekorg/TorchSpec) is not installable here: the PyPI name ``torchspec`` is a 0.0.1 placeholder, and
the project is a git checkout with its own training stack. So the fixture below rebuilds what its exporter writes,
with its exact names (read in its source, not copied):

* the draft model ``torchspec/models/draft/deepseek_eagle.py`` ``Eagle3DeepseekV2ForCausalLM``: ``embed_tokens``,
  ``midlayer.self_attn.{q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj}``,
  ``midlayer.mlp.{gate,up,down}_proj``, ``midlayer.{hidden_norm, input_layernorm, post_attention_layernorm}``, ``fc``,
  ``norm``, ``lm_head`` (``t2d`` / ``d2t`` buffers only when Vd != V); EAGLE-3.1: ``fc_norm.{i}`` (llama3_eagle.py);
* the config ``configs/draft_models/kimi_k3_eagle3_mla.json`` (Eagle3DeepseekV2ForCausalLM, ``model_type kimi_k2``,
  ``mla_use_nope``, yarn ``rope_scaling`` with mscale / mscale_all_dim, ``eagle_config`` with the output-of-layer
  aux ids and ModelOpt-style ``use_*`` keys), at tiny sizes;
* the export: safetensors metadata ``{"torchspec_version": v}`` only; config + ``draft_vocab_size``,
  ``_torchspec_version``, ``torch_dtype``; with ``--vllm`` the ``midlayer.`` -> ``layers.0.`` rename and, because
  ``model_type == "kimi_k2"``, +1 on the aux ids (top level and ``eagle_config``).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from eagle_migrate import toy
from eagle_migrate.formats import read_checkpoint
from eagle_migrate.formats.output import save_safetensors, write_json
from eagle_migrate.inspection import inspect_checkpoint

VERSION = "0.3.0"
KIMI_YARN = {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 32, "beta_fast": 32, "beta_slow": 1,
             "mscale": 1.0, "mscale_all_dim": 1.0}
OUTPUT_OF_LAYER = [i - 1 for i in toy.AUX_IDS]  # what TorchSpec trains with (layer outputs)


def _draft_config(eagle31: bool) -> dict:
    """configs/draft_models/kimi_k3_eagle3_mla.json's keys with the toy MLA sizes."""
    m = toy.MLA_SIZES
    nh = toy.TOY["mla"].geometry[0]
    d = {
        "architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "kimi_k2",
        "hidden_size": toy.H, "intermediate_size": toy.H, "num_hidden_layers": 1,
        "num_attention_heads": nh, "num_key_value_heads": nh,
        **{k: m[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")},
        "mla_use_nope": True, "hidden_act": "silu", "rms_norm_eps": 1e-06, "vocab_size": toy.H,
        "draft_vocab_size": toy.H, "torch_dtype": "bfloat16", "rope_theta": 50000.0, "rope_scaling": dict(KIMI_YARN),
        "max_position_embeddings": 1024,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(OUTPUT_OF_LAYER), "use_aux_hidden_state": True,
                         "use_input_layernorm_in_first_layer": True, "use_last_layernorm": True,
                         "use_mtp_layernorm": False},
        "bos_token_id": 0, "eos_token_id": toy.H - 1, "pad_token_id": 0,
    }
    if eagle31:
        d.update(fc_norm=True, norm_output=True)
    return d


def _model_state_dict(eagle31: bool) -> dict[str, torch.Tensor]:
    """``Eagle3DeepseekV2ForCausalLM.state_dict()`` names (``midlayer.``), the toy oracle's MLA weights."""
    sd = toy.drafter_state_dict("oracle", family="mla")
    out = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in sd.items()}
    out.setdefault("embed_tokens.weight", torch.randn(toy.H, toy.H, generator=torch.Generator().manual_seed(0)))
    if eagle31:
        for k in range(len(toy.AUX_IDS)):
            out[f"fc_norm.{k}.weight"] = torch.full((toy.H,), 1.0 / toy.aux_rms(toy.AUX_IDS[k]))
    return out


def torchspec_export(out: Path, export_for_vllm: bool, eagle31: bool = False) -> Path:
    """What ``tools/convert_to_hf.py`` (without vocab pruning) writes, with or without ``--vllm``."""
    tensors = {k: v.to(torch.bfloat16) for k, v in _model_state_dict(eagle31).items()}
    if export_for_vllm:  # _remap_weight_keys
        tensors = {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v for k, v in tensors.items()}
    out.mkdir(parents=True)
    save_safetensors(tensors, out / "model.safetensors", {"torchspec_version": VERSION})
    config = copy.deepcopy(_draft_config(eagle31))
    if export_for_vllm and config.get("model_type") == "kimi_k2":  # _fixup_export_config
        key = "eagle_aux_hidden_state_layer_ids"
        if key in config:
            config[key] = [x + 1 for x in config[key]]
        if key in config.get("eagle_config", {}):
            config["eagle_config"][key] = [x + 1 for x in config["eagle_config"][key]]
    config["draft_vocab_size"] = toy.H
    config["_torchspec_version"] = VERSION
    config["torch_dtype"] = "bfloat16"
    write_json(out / "config.json", config)
    return out


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> str:
    t = toy.write_target(tmp_path_factory.mktemp("kimi-target"), family="mla")
    c = json.loads((t / "config.json").read_text())
    write_json(t / "config.json", {**c, "rope_scaling": dict(KIMI_YARN), "rope_theta": 50000.0})
    return str(t)


@pytest.mark.parametrize("eagle31", [False, True], ids=["eagle3", "eagle3.1"])
@pytest.mark.parametrize("export_for_vllm,layout,stored", [(False, "torchspec", OUTPUT_OF_LAYER),
                                                           (True, "torchspec-vllm", list(toy.AUX_IDS))])
def test_inspect_reads_torchspecs_kimi_k2_mla_exports(tmp_path, target, export_for_vllm, layout, stored, eagle31):
    p = torchspec_export(tmp_path / layout, export_for_vllm, eagle31)
    assert json.loads((p / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == stored
    r = inspect_checkpoint(p, target=target)
    assert (r.producer, r.layout, r.architecture) == ("torchspec", layout, "mla"), r
    assert r.format == ("eagle3.1" if eagle31 else "eagle3")
    assert (r.flags.fc_norm, r.flags.norm_output) == (eagle31, eagle31)
    # the stored ids as written, read in vLLM's convention by TorchSpec's own kimi_k2 rule (a fingerprint: native
    # = layer outputs, --vllm = already +1), both the same target layers
    assert r.aux_layer_ids_stored == stored
    assert r.aux_layer_ids == toy.AUX_IDS
    assert r.aux_layer_ids_convention == ("vllm" if export_for_vllm else "output-of-layer")
    assert r.aux_ids_evidence is not None and r.aux_ids_evidence.decided_by == "fingerprint"
    assert r.sizes.mla == toy.MLA_SIZES and r.rope_scaling == KIMI_YARN
    assert r.ok, r.errors
    ck = read_checkpoint(p)
    assert ck.meta["torchspec_version"] == VERSION and ck.config.has_embed_tokens


def test_the_kimi_rule_is_torchspecs_not_any_kimi_config(tmp_path):
    """The same --vllm export without ``_torchspec_version`` (config and metadata) is no TorchSpec export: its ids
    are not fingerprinted by TorchSpec's kimi_k2 rule."""
    p = torchspec_export(tmp_path / "x", export_for_vllm=True)
    c = json.loads((p / "config.json").read_text())
    del c["_torchspec_version"]
    write_json(p / "config.json", c)
    from safetensors.torch import load_file

    tensors = {k: v.clone() for k, v in load_file(str(p / "model.safetensors")).items()}
    save_safetensors(tensors, p / "model.safetensors", {"format": "pt"})
    ck = read_checkpoint(p)
    # then the eagle_config.use_* keys make it ModelOpt's MLA export, whose ids no rule decides
    assert (ck.producer, ck.config.architecture) == ("modelopt", "mla")
    assert ck.aux.decided_by == "undecided" and "aux_ids_convention_ambiguous" in {f.code for f in ck.findings}
