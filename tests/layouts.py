"""Test-only builders: tiny drafter checkpoints in EVERY layout eagle-migrate reads, from one canonical state dict.

    from tests.layouts import LAYOUT_NAMES, write_layout, canonical_state_dict, EXPECTED
    cfg = toy.drafter_config(); sd = toy.drafter_state_dict("oracle")
    path = write_layout("safeailab-eagle3", cfg, sd, tmp_path / "x")     # -> the folder (or file) to read
    EXPECTED["safeailab-eagle3"]  # {"layout": ..., "producer": ..., "format": None (= from cfg)}

``canonical_sd`` uses vLLM-layout names (``fc.weight``, ``layers.0.*``, ``norm.weight``, ``lm_head.weight``,
``d2t`` when Vd != V, ``embed_tokens.weight`` optional). Each builder writes what that producer really writes
(names, file type, dtype, config keys, d2t/t2d rules, aux-id convention), per docs/formats.md. EAGLE-1/2 and MLA
layouts need their own state dicts: ``eagle2_state_dict(cfg)`` / ``mla_state_dict(...)``; ``write_layout`` builds
them itself when given an EAGLE-3 ``cfg`` (sizes are taken from it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from eagle_migrate.drafter.config import DrafterConfig
from eagle_migrate.formats.output import save_safetensors, write_json

# name -> what read_checkpoint must report (format None = cfg.format_name)
EXPECTED: dict[str, dict[str, Any]] = {
    "vllm": {"layout": "vllm", "producer": "eagle-migrate", "format": None},
    "vllm-plain": {"layout": "vllm", "producer": "vllm", "format": None},
    "vllm-v0-eagle": {"layout": "vllm-v0-eagle", "producer": "vllm", "format": "eagle2"},
    "speculators": {"layout": "speculators", "producer": "speculators", "format": None},
    "speculators-ours": {"layout": "speculators", "producer": "eagle-migrate", "format": None},
    "safeailab-eagle3": {"layout": "safeailab-eagle3", "producer": "safeailab", "format": None},
    "safeailab-eagle3-noconfig": {"layout": "safeailab-eagle3", "producer": "safeailab", "format": None},
    "safeailab-eagle2": {"layout": "safeailab-eagle2", "producer": "safeailab", "format": "eagle2"},
    "specforge": {"layout": "specforge", "producer": "specforge", "format": None},
    "modelopt": {"layout": "modelopt", "producer": "modelopt", "format": None},
    "torchspec": {"layout": "torchspec", "producer": "torchspec", "format": None},
    "torchspec-vllm": {"layout": "torchspec-vllm", "producer": "torchspec", "format": None},
    "sharded": {"layout": "vllm", "producer": "vllm", "format": None},
    "model-prefix": {"layout": "vllm", "producer": "vllm", "format": None},
    "mla": {"layout": "vllm", "producer": "vllm", "format": None},
    "quantized-fp8": {"layout": "vllm", "producer": "vllm", "format": None},
    "quantized-w4a16": {"layout": "vllm", "producer": "vllm", "format": None},
    "quantized-modelopt-nvfp4": {"layout": "modelopt", "producer": "modelopt", "format": None},
}
LAYOUT_NAMES = list(EXPECTED)

# The convention each builder writes aux ids in (as the producer's own code does), and what reading the
# checkpoint alone decides (docs/formats.md, aux-id decision table): "fingerprint" (a writer-unique key decides),
# "unambiguous" (no ids stored), "undecided" (both readings possible: a target measures, or --aux-ids-convention).
AUX_CONVENTION: dict[str, str] = {n: "vllm" for n in EXPECTED} | {
    "specforge": "output-of-layer", "modelopt": "output-of-layer", "torchspec": "output-of-layer",
    "torchspec-vllm": "output-of-layer", "quantized-modelopt-nvfp4": "output-of-layer",
}
AUX_DECIDED_BY: dict[str, str] = {n: "undecided" for n in EXPECTED} | {
    "vllm": "fingerprint", "speculators": "fingerprint", "speculators-ours": "fingerprint",
    "torchspec": "fingerprint", "torchspec-vllm": "fingerprint",
    "safeailab-eagle3": "unambiguous", "safeailab-eagle3-noconfig": "unambiguous",
}
# the convention a decided layout is read in (TorchSpec's code trains on layer outputs and its exporter shifts
# kimi_k2 ids only: formats/torchspec.py)
AUX_DECIDED_CONVENTION: dict[str, str] = {n: "vllm" for n in EXPECTED} | {
    "torchspec": "output-of-layer", "torchspec-vllm": "output-of-layer"}


# ----- canonical state dicts ----------------------------------------------------------------------------------------
def canonical_state_dict(cfg: DrafterConfig, seed: int = 0, *, embed: bool | None = None) -> dict[str, torch.Tensor]:
    """Random canonical EAGLE-3 tensors for any ``cfg`` (d2t iff Vd != V, fc_norm / input_norm per flags)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.05

    h, ht, k = cfg.hidden_size, cfg.target_hidden_size, cfg.num_aux
    qd, kvd = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    sd: dict[str, torch.Tensor] = {"fc.weight": r(h, k * ht), "norm.weight": 1 + r(h), "lm_head.weight": r(cfg.draft_vocab_size, h)}
    for i in range(cfg.num_layers):
        p, din = f"layers.{i}.", 2 * h if i == 0 else h
        sd[p + "self_attn.q_proj.weight"] = r(qd, din)
        sd[p + "self_attn.k_proj.weight"] = r(kvd, din)
        sd[p + "self_attn.v_proj.weight"] = r(kvd, din)
        sd[p + "self_attn.o_proj.weight"] = r(h, qd)
        if cfg.architecture == "qwen3":  # the Qwen3 layer: per-head q/k norms
            sd[p + "self_attn.q_norm.weight"] = 1 + r(cfg.head_dim)
            sd[p + "self_attn.k_norm.weight"] = 1 + r(cfg.head_dim)
        if cfg.attention_bias:
            for x, n in (("q", qd), ("k", kvd), ("v", kvd)):
                sd[p + f"self_attn.{x}_proj.bias"] = r(n)
        sd[p + "mlp.gate_proj.weight"] = r(cfg.intermediate_size, h)
        sd[p + "mlp.up_proj.weight"] = r(cfg.intermediate_size, h)
        sd[p + "mlp.down_proj.weight"] = r(h, cfg.intermediate_size)
        sd[p + "input_layernorm.weight"] = 1 + r(h)
        sd[p + "post_attention_layernorm.weight"] = 1 + r(h)
        if i == 0:
            sd[p + "hidden_norm.weight"] = 1 + r(h)
    if cfg.fc_norm:
        for j in range(k):
            sd[f"fc_norm.{j}.weight"] = 1 + r(ht)
    if cfg.norm_before_fc:
        sd["input_norm.weight"] = 1 + r(k * ht)
    if cfg.uses_d2t:
        used = torch.sort(torch.randperm(cfg.vocab_size, generator=g)[: cfg.draft_vocab_size]).values
        sd["d2t"] = used - torch.arange(cfg.draft_vocab_size)
    if embed or (embed is None and h != ht):
        sd["embed_tokens.weight"] = r(cfg.vocab_size, h)
    return sd


def t2d_from(cfg: DrafterConfig, sd: dict[str, torch.Tensor]) -> torch.Tensor:
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    d2t = sd.get("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
    t2d[torch.arange(cfg.draft_vocab_size) + d2t] = True
    return t2d


def eagle2_state_dict(h: int, heads: int, kv_heads: int, inter: int, vocab: int, *, fc_bias: bool = True, seed: int = 0) -> dict[str, torch.Tensor]:
    """SafeAILab EAGLE-1/2 tensors: fc [H, 2H] (+bias), one ordinary decoder layer without input_layernorm, embed."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.05

    hd = h // heads
    sd = {"embed_tokens.weight": r(vocab, h), "fc.weight": r(h, 2 * h)}
    if fc_bias:
        sd["fc.bias"] = r(h)
    p = "layers.0."
    sd[p + "self_attn.q_proj.weight"] = r(heads * hd, h)
    sd[p + "self_attn.k_proj.weight"] = r(kv_heads * hd, h)
    sd[p + "self_attn.v_proj.weight"] = r(kv_heads * hd, h)
    sd[p + "self_attn.o_proj.weight"] = r(h, heads * hd)
    sd[p + "mlp.gate_proj.weight"] = r(inter, h)
    sd[p + "mlp.up_proj.weight"] = r(inter, h)
    sd[p + "mlp.down_proj.weight"] = r(h, inter)
    sd[p + "post_attention_layernorm.weight"] = 1 + r(h)
    return sd


MLA = {"q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16}


def mla_state_dict(cfg: DrafterConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """An MLA (DeepSeek/Kimi) EAGLE-3 drafter's tensors, sizes from ``cfg`` + ``MLA``."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.05

    h, nh, m = cfg.hidden_size, cfg.num_attention_heads, MLA
    sd = canonical_state_dict(cfg, seed, embed=True)
    for n in [n for n in sd if n.startswith("layers.0.self_attn.")]:
        del sd[n]
    p = "layers.0.self_attn."
    sd[p + "q_a_proj.weight"] = r(m["q_lora_rank"], 2 * h)
    sd[p + "q_a_layernorm.weight"] = 1 + r(m["q_lora_rank"])
    sd[p + "q_b_proj.weight"] = r(nh * (m["qk_nope_head_dim"] + m["qk_rope_head_dim"]), m["q_lora_rank"])
    sd[p + "kv_a_proj_with_mqa.weight"] = r(m["kv_lora_rank"] + m["qk_rope_head_dim"], 2 * h)
    sd[p + "kv_a_layernorm.weight"] = 1 + r(m["kv_lora_rank"])
    sd[p + "kv_b_proj.weight"] = r(nh * (m["qk_nope_head_dim"] + m["v_head_dim"]), m["kv_lora_rank"])
    sd[p + "o_proj.weight"] = r(h, nh * m["v_head_dim"])
    return sd


# ----- configs ---------------------------------------------------------------------------------------------------
QWEN3_ARCH = {"LlamaForCausalLMEagle3": "Eagle3Qwen3ForCausalLM", "LlamaForCausalLM": "Qwen3ForCausalLM"}


def hf_config(cfg: DrafterConfig, arch: str = "LlamaForCausalLMEagle3", *, rope: bool = True, ids: list[int] | None | str = "cfg") -> dict[str, Any]:
    """The producer's HF config; a Qwen3 ``cfg`` gets the Qwen3 names (Eagle3Qwen3ForCausalLM / Qwen3ForCausalLM,
    model_type qwen3)."""
    qwen3 = cfg.architecture == "qwen3"
    d: dict[str, Any] = {
        "architectures": [QWEN3_ARCH.get(arch, arch) if qwen3 else arch], "model_type": "qwen3" if qwen3 else "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim, "num_hidden_layers": cfg.num_layers,
        "hidden_act": "silu", "rms_norm_eps": cfg.rms_norm_eps, "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size, "draft_vocab_size": cfg.draft_vocab_size, "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    if rope:
        d["rope_theta"] = cfg.rope_theta
        if cfg.rope_scaling:
            d["rope_scaling"] = cfg.rope_scaling
    if cfg.target_hidden_size != cfg.hidden_size:
        d["target_hidden_size"] = cfg.target_hidden_size
    if cfg.fc_norm:
        d["fc_norm"] = True
    if cfg.norm_output:
        d["norm_output"] = True
    if cfg.norm_before_fc:
        d["norm_before_fc"] = True
    d["norm_before_residual"] = cfg.norm_before_residual
    if ids == "cfg":
        ids = cfg.aux_layer_ids
    if ids is not None:
        d["eagle_aux_hidden_state_layer_ids"] = list(ids)
    if cfg.num_aux != 3:
        d["num_aux_hidden_states"] = cfg.num_aux
    return d


def _cast(sd: dict[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    if dtype is None:
        return dict(sd)
    return {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in sd.items()}


def _midlayer(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in sd.items()}


def _save_bin(sd: dict[str, torch.Tensor], path: Path) -> None:
    torch.save({k: v.contiguous() for k, v in sd.items()}, path)


# ----- the builders -------------------------------------------------------------------------------------------------
def write_layout(name: str, cfg: DrafterConfig, canonical_sd: dict[str, torch.Tensor], out: Path | str, **opts: Any) -> Path:
    """Write ``canonical_sd`` (sizes/flags from ``cfg``) as producer layout ``name`` into the new folder ``out``.

    Returns the path to hand to ``read_checkpoint`` (the folder). ``opts``: ``with_config`` (safeailab-eagle3,
    default True), ``shards`` (sharded, default 2), ``dtype`` (override the producer's dtype), ``aux_convention``
    (write ``cfg.aux_layer_ids`` -- vLLM ids -- in this convention wherever the builder stores ids, instead of the
    producer's own: the same weights with ids in either convention).
    """
    conv = opts.pop("aux_convention", None)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sd = {k: v for k, v in canonical_sd.items() if k != "t2d"}
    if "d2t" not in sd and cfg.uses_d2t:
        raise ValueError("a reduced-vocab cfg needs d2t in canonical_sd")
    fn = _BUILDERS.get(name)
    if fn is None:
        raise KeyError(f"unknown layout '{name}'; known: {', '.join(_BUILDERS)}")
    fn(cfg, sd, out, **opts)
    if conv is not None and cfg.aux_layer_ids and (out / "config.json").is_file():
        stored = [i - 1 for i in cfg.aux_layer_ids] if conv == "output-of-layer" else list(cfg.aux_layer_ids)
        d = json.loads((out / "config.json").read_text())
        for holder in (d, d.get("eagle_config")):
            if isinstance(holder, dict) and "eagle_aux_hidden_state_layer_ids" in holder:
                holder["eagle_aux_hidden_state_layer_ids"] = stored
        write_json(out / "config.json", d)
    return out


def _vllm(cfg, sd, out, dtype=torch.float32, **_):
    from eagle_migrate.formats.write import write_vllm

    write_vllm(cfg, sd, out, dtype=dtype)


def _vllm_plain(cfg, sd, out, dtype=torch.float32, **_):
    sd = {k: v for k, v in sd.items() if k != "d2t" or cfg.uses_d2t}
    save_safetensors(_cast(sd, dtype), out / "model.safetensors", {"format": "pt"})
    d = hf_config(cfg)
    if cfg.aux_layer_ids:
        d["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids)}
    write_json(out / "config.json", d)


def _eagle2_config(cfg):
    d = hf_config(cfg, "LlamaForCausalLM", ids=None)
    for k in ("draft_vocab_size", "norm_before_residual", "target_hidden_size", "fc_norm", "norm_output", "norm_before_fc", "num_aux_hidden_states"):
        d.pop(k, None)
    d["head_dim"] = cfg.hidden_size // cfg.num_attention_heads
    return d


def _vllm_v0(cfg, sd, out, dtype=torch.float32, **_):
    e2 = eagle2_state_dict(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size, cfg.vocab_size)
    e2["lm_head.weight"] = torch.randn(cfg.vocab_size, cfg.hidden_size) * 0.05
    save_safetensors(_cast(e2, dtype), out / "model.safetensors", {"format": "pt"})
    inner = _eagle2_config(cfg)
    inner["head_dim"] = cfg.hidden_size // cfg.num_attention_heads
    write_json(out / "config.json", {"model_type": "eagle", "architectures": ["EAGLEModel"], "model": inner, "eagle_fc_bias": True})


def _speculators(cfg, sd, out, dtype=torch.bfloat16, **_):
    """As vllm-project/speculators writes a trained Eagle3 drafter (no eagle_migrate key, t2d/d2t iff Vd != V)."""
    sd = dict(sd)
    if cfg.uses_d2t:
        sd["t2d"] = t2d_from(cfg, sd)
    else:
        sd.pop("d2t", None)
    save_safetensors(_cast(sd, dtype), out / "model.safetensors", {"format": "pt"})
    tlc = hf_config(cfg, "LlamaForCausalLM", ids=None)
    for k in ("draft_vocab_size", "target_hidden_size", "fc_norm", "norm_output", "norm_before_fc", "norm_before_residual", "num_aux_hidden_states"):
        tlc.pop(k, None)
    d = {
        "architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3", "speculators_version": "0.3.0",
        "transformer_layer_config": tlc, "draft_vocab_size": cfg.draft_vocab_size,
        "norm_before_residual": cfg.norm_before_residual, "norm_before_fc": cfg.norm_before_fc,
        "fc_norm": cfg.fc_norm, "norm_output": cfg.norm_output,
        "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                               "verifier": {"name_or_path": "toy-target", "architectures": ["LlamaForCausalLM"]}},
    }
    if cfg.target_hidden_size != cfg.hidden_size:
        d["target_hidden_size"] = cfg.target_hidden_size
    if cfg.aux_layer_ids:
        d["eagle_aux_hidden_state_layer_ids"] = list(cfg.aux_layer_ids)
    if cfg.num_aux != 3:
        tlc["num_aux_hidden_states"] = cfg.num_aux
    write_json(out / "config.json", d)


def _speculators_ours(cfg, sd, out, dtype=torch.float32, **_):
    import shutil

    from eagle_migrate.formats import write_checkpoint

    tmp = out.parent / (out.name + ".w")
    write_checkpoint(cfg, tmp, "speculators", sd, dtype=dtype, verifier="toy-target")
    for f in tmp.iterdir():
        shutil.move(str(f), out / f.name)
    tmp.rmdir()


def _safeailab3(cfg, sd, out, dtype=torch.float16, with_config: bool = True, **_):
    """SafeAILab trainer: midlayer.*, fp16 .bin, d2t (zeros if Vd = V) and t2d always, no embed (unless H != Ht)."""
    sd = dict(sd)
    if cfg.hidden_size == cfg.target_hidden_size:
        sd.pop("embed_tokens.weight", None)
    sd.setdefault("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
    sd["t2d"] = t2d_from(cfg, sd)
    _save_bin(_midlayer(_cast(sd, dtype)), out / "pytorch_model.bin")
    if with_config:
        d = hf_config(cfg, "LlamaForCausalLM", rope=False, ids=None)
        d.pop("norm_before_residual")
        d["torch_dtype"] = "float16"
        write_json(out / "config.json", d)


def _safeailab3_noconfig(cfg, sd, out, **kw):
    _safeailab3(cfg, sd, out, with_config=False, **kw)


def _safeailab2(cfg, sd, out, dtype=torch.float32, fc_bias: bool = True, **_):
    e2 = eagle2_state_dict(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size, cfg.vocab_size, fc_bias=fc_bias)
    _save_bin(_cast(e2, dtype), out / "pytorch_model.bin")
    d = _eagle2_config(cfg)
    d["bias"] = fc_bias
    write_json(out / "config.json", d)


def _specforge(cfg, sd, out, dtype=torch.bfloat16, **_):
    """specforge export --to sglang: midlayer.*, safetensors, no embed, t2d + d2t always, output-of-layer ids."""
    sd = dict(sd)
    if cfg.hidden_size == cfg.target_hidden_size:
        sd.pop("embed_tokens.weight", None)
    sd.setdefault("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
    sd["t2d"] = t2d_from(cfg, sd)
    save_safetensors(_midlayer(_cast(sd, dtype)), out / "model.safetensors", {"format": "pt"})
    ids = [i - 1 for i in cfg.aux_layer_ids] if cfg.aux_layer_ids else None
    write_json(out / "config.json", hf_config(cfg, ids=ids))


def _modelopt(cfg, sd, out, dtype=torch.bfloat16, **_):
    """ModelOpt hf_spec_export: layers.0.*, fixed key set, d2t only if Vd < V, never t2d, no embed."""
    sd = {k: v for k, v in sd.items() if k != "embed_tokens.weight" and (k != "d2t" or cfg.uses_d2t)}
    save_safetensors(_cast(sd, dtype), out / "model.safetensors", {"format": "pt"})
    d = hf_config(cfg, ids=None)
    d.pop("target_hidden_size", None)
    d["eagle_config"] = {
        "use_input_layernorm_in_first_layer": True, "use_last_layernorm": True, "use_mtp_layernorm": False,
        "next_layer_regular": True,
    }
    if cfg.aux_layer_ids:
        d["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [i - 1 for i in cfg.aux_layer_ids]
    write_json(out / "config.json", d)


def _torchspec(cfg, sd, out, dtype=torch.bfloat16, **_):
    """TorchSpec native: midlayer.*, embed included, d2t/t2d iff Vd != V, output-of-layer ids in eagle_config."""
    sd = dict(sd)
    if "embed_tokens.weight" not in sd:
        sd["embed_tokens.weight"] = torch.randn(cfg.vocab_size, cfg.hidden_size) * 0.05
    if cfg.uses_d2t:
        sd["t2d"] = t2d_from(cfg, sd)
    save_safetensors(_midlayer(_cast(sd, dtype)), out / "model.safetensors", {"format": "pt", "torchspec_version": "0.2.0"})
    d = hf_config(cfg, ids=None)
    d["_torchspec_version"] = "0.2.0"
    if cfg.aux_layer_ids:
        d["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in cfg.aux_layer_ids]}
    write_json(out / "config.json", d)


def _torchspec_vllm(cfg, sd, out, dtype=torch.bfloat16, **_):
    """TorchSpec tools/convert_to_hf.py --vllm: layers.0.*, the training's output-of-layer ids copied unchanged at
    the top level (its exporter shifts kimi_k2 ids only)."""
    sd = dict(sd)
    if "embed_tokens.weight" not in sd:
        sd["embed_tokens.weight"] = torch.randn(cfg.vocab_size, cfg.hidden_size) * 0.05
    save_safetensors(_cast(sd, dtype), out / "model.safetensors", {"format": "pt", "torchspec_version": "0.2.0"})
    d = hf_config(cfg)
    if cfg.aux_layer_ids:
        d["eagle_aux_hidden_state_layer_ids"] = [i - 1 for i in cfg.aux_layer_ids]
    d["_torchspec_version"] = "0.2.0"
    write_json(out / "config.json", d)


def _sharded(cfg, sd, out, dtype=torch.float32, shards: int = 2, **_):
    names = sorted(sd)
    wm = {}
    for i in range(shards):
        part = names[i::shards]
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_safetensors(_cast({k: sd[k] for k in part}, dtype), out / fname, {"format": "pt"})
        wm.update({k: fname for k in part})
    write_json(out / "model.safetensors.index.json", {"metadata": {"total_size": 0}, "weight_map": wm})
    write_json(out / "config.json", hf_config(cfg))


def _model_prefix(cfg, sd, out, dtype=torch.float32, **_):
    """NeMo-style: every name but lm_head under ``model.``."""
    sd2 = {(k if k.startswith("lm_head.") else "model." + k): v for k, v in sd.items()}
    save_safetensors(_cast(sd2, dtype), out / "model.safetensors", {"format": "pt"})
    write_json(out / "config.json", hf_config(cfg))


def _mla(cfg, sd, out, dtype=torch.bfloat16, **_):
    msd = mla_state_dict(cfg)
    save_safetensors(_cast(msd, dtype), out / "model.safetensors", {"format": "pt"})
    d = hf_config(cfg, "Eagle3DeepseekV2ForCausalLM")
    d["model_type"] = "kimi_k2"
    d.update(MLA)
    d.pop("head_dim")
    write_json(out / "config.json", d)


QUANT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _quant_fp8(cfg, sd, out, **_):
    """compressed-tensors FP8: per-channel float8_e4m3fn weights + weight_scale [out, 1], dynamic activations."""
    q = {}
    for k, v in sd.items():
        if k.startswith("layers.") and k.endswith("_proj.weight"):
            scale = v.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 448.0
            q[k] = (v / scale).to(torch.float8_e4m3fn)
            q[k[: -len("weight")] + "weight_scale"] = scale.float()
        else:
            q[k] = v
    save_safetensors(q, out / "model.safetensors", {"format": "pt"})
    d = hf_config(cfg)
    d["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"],
                                      "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": False, "symmetric": True},
                                      "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True, "symmetric": True}}},
        "ignore": ["lm_head", "re:.*fc$"],
    }
    write_json(out / "config.json", d)


def _quant_w4a16(cfg, sd, out, group: int = 16, **_):
    """compressed-tensors pack-quantized W4A16: int32 weight_packed [out, in/8], weight_scale [out, in/group], weight_shape."""
    q = {}
    for k, v in sd.items():
        if k.startswith("layers.") and k.endswith("_proj.weight"):
            o, i = v.shape
            base = k[: -len("weight")]
            q[base + "weight_packed"] = torch.zeros(o, i // 8, dtype=torch.int32)
            q[base + "weight_scale"] = torch.ones(o, i // group, dtype=torch.bfloat16)
            q[base + "weight_shape"] = torch.tensor([o, i], dtype=torch.int64)
        else:
            q[k] = v
    save_safetensors(q, out / "model.safetensors", {"format": "pt"})
    d = hf_config(cfg)
    d["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": group, "symmetric": True}}},
        "ignore": ["lm_head", "re:.*fc$"],
    }
    write_json(out / "config.json", d)


def _quant_modelopt_nvfp4(cfg, sd, out, group: int = 16, **_):
    """ModelOpt NVFP4 export: uint8 ``X.weight`` [out, in/2] (two FP4 values per byte), fp8 ``weight_scale``
    [out, in/16], fp32 ``weight_scale_2`` and ``input_scale``; hf_quant_config.json + the same dict in config.json."""
    q = {}
    for k, v in sd.items():
        if k == "embed_tokens.weight" or (k == "d2t" and not cfg.uses_d2t):
            continue
        if k.startswith("layers.") and k.endswith("_proj.weight"):
            o, i = v.shape
            base = k[: -len("weight")]
            q[k] = torch.zeros(o, i // 2, dtype=torch.uint8)
            q[base + "weight_scale"] = torch.ones(o, i // group).to(torch.float8_e4m3fn)
            q[base + "weight_scale_2"] = torch.ones(())
            q[base + "input_scale"] = torch.ones(())
        else:
            q[k] = v.to(torch.bfloat16) if v.is_floating_point() else v
    save_safetensors(q, out / "model.safetensors", {"format": "pt"})
    hq = {"producer": {"name": "modelopt", "version": "0.40.0"},
          "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": group,
                           "exclude_modules": ["lm_head", "fc"]}}
    write_json(out / "hf_quant_config.json", hq)
    d = hf_config(cfg, ids=None)
    d.pop("target_hidden_size", None)
    d["eagle_config"] = {"use_input_layernorm_in_first_layer": True, "use_last_layernorm": True, "use_mtp_layernorm": False,
                         "next_layer_regular": True, "use_aux_hidden_state": True}
    if cfg.aux_layer_ids:
        d["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [i - 1 for i in cfg.aux_layer_ids]
    d["quantization_config"] = hq
    write_json(out / "config.json", d)


_BUILDERS = {
    "vllm": _vllm, "vllm-plain": _vllm_plain, "vllm-v0-eagle": _vllm_v0, "speculators": _speculators,
    "speculators-ours": _speculators_ours, "safeailab-eagle3": _safeailab3, "safeailab-eagle3-noconfig": _safeailab3_noconfig,
    "safeailab-eagle2": _safeailab2, "specforge": _specforge, "modelopt": _modelopt, "torchspec": _torchspec,
    "torchspec-vllm": _torchspec_vllm, "sharded": _sharded, "model-prefix": _model_prefix, "mla": _mla,
    "quantized-fp8": _quant_fp8, "quantized-w4a16": _quant_w4a16, "quantized-modelopt-nvfp4": _quant_modelopt_nvfp4,
}
assert set(_BUILDERS) == set(EXPECTED)


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())
