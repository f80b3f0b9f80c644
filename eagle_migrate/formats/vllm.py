"""The vLLM layout (what ``vllm serve --speculative-config '{"method": "eagle3", ...}'`` loads): its config and tensor names
(the writer is ``formats/write.py``: ``write_vllm``, ``write_checkpoint``).

Written exactly per the emit checklist in docs/formats.md: ``LlamaForCausalLMEagle3`` + ``model_type: llama``
(Qwen3 drafters: ``Eagle3Qwen3ForCausalLM`` + ``model_type: qwen3``, with ``head_dim`` and every q_norm/k_norm;
MLA drafters: ``Eagle3DeepseekV2ForCausalLM`` + ``model_type: deepseek_v2`` with the MLA sizes, ``q_lora_rank`` set
and ``num_aux_hidden_states`` always);
3.1 flags at the top level; aux layer ids at the top level and in ``eagle_config`` (+ ``num_aux_hidden_states``
when K != 3); no ``model.`` prefix; ``d2t`` iff Vd != V; never ``t2d``; ``tie_word_embeddings: false``.
"""

from __future__ import annotations

import json
from typing import Any


from .. import __version__
from ..drafter.config import DrafterConfig

VLLM_ARCH = "LlamaForCausalLMEagle3"
# per drafter family (DrafterConfig.architecture): the architecture vLLM's registry maps to the family's drafter
# class, the decoder layer's HF model_type, and the HF architecture of a plain model of that family (speculators'
# transformer_layer_config; vLLM picks the drafter class from its model_type)
FAMILY_ARCH = {"llama": VLLM_ARCH, "qwen3": "Eagle3Qwen3ForCausalLM", "mla": "Eagle3DeepseekV2ForCausalLM"}
# MLA: deepseek_v2, never deepseek_v3 (vLLM rewrites a deepseek_v3 drafter config to its MTP model and refuses it)
FAMILY_MODEL_TYPE = {"llama": "llama", "qwen3": "qwen3", "mla": "deepseek_v2"}
FAMILY_HF_ARCH = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "mla": "DeepseekV2ForCausalLM"}
MLA_ATTN = ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj")


def _family(cfg: DrafterConfig) -> str:
    if cfg.architecture not in FAMILY_ARCH:
        raise ValueError(f"no vLLM layout for {cfg.architecture} drafters here (families: {', '.join(FAMILY_ARCH)})")
    return cfg.architecture


def rope_from_config(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from an HF config dict; transformers-5 ``rope_parameters`` understood."""
    theta = cfg.get("rope_theta")
    scaling = cfg.get("rope_scaling")
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict):
        theta = theta if theta is not None else rp.get("rope_theta")
        rtype = rp.get("rope_type", rp.get("type", "default"))
        if scaling is None and rtype not in (None, "default"):
            scaling = {k: v for k, v in rp.items() if k != "rope_theta"}
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) in (None, "default"):
        scaling = None
    return float(theta if theta is not None else 10000.0), scaling


def llama_layer_config(cfg: DrafterConfig) -> dict[str, Any]:
    """The decoder-layer keys (``model_type`` .. ``vocab_size``, in this order) of the drafter's config, shared
    by the vLLM config.json and the speculators ``transformer_layer_config``; ``model_type`` per family (llama,
    qwen3, deepseek_v2). ``head_dim`` is always written: Qwen3Config's default is 128, not H / heads (MLA: the MLA
    sizes instead; DeepseekV2Config derives its own head_dim)."""
    if cfg.mla:
        if cfg.q_lora_rank is None:  # vLLM's Eagle3 DeepSeek loader maps q_a_proj into fused_qkv_a_proj
            raise ValueError("vLLM's Eagle3DeepseekV2ForCausalLM needs q_lora_rank (q_a_proj / q_b_proj): a drafter "
                             "with a plain q_proj fails to load there ('no module or parameter named fused_qkv_a_proj')")
        return {
            "model_type": FAMILY_MODEL_TYPE["mla"],
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size,
            "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads,
            **{k: getattr(cfg, k) for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")},
            "num_hidden_layers": cfg.num_layers,
            "hidden_act": "silu",
            "rms_norm_eps": cfg.rms_norm_eps,
            "rope_theta": cfg.rope_theta,
            "rope_scaling": cfg.rope_scaling,  # yarn: vLLM runs deepseek_yarn (drafter/model.py mla_rope_type)
            "max_position_embeddings": cfg.max_position_embeddings,
            "vocab_size": cfg.vocab_size,
        }
    d = {
        "model_type": FAMILY_MODEL_TYPE[_family(cfg)],
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": cfg.num_layers,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
    }
    if cfg.layer_types is not None:  # sliding-window layers, read back by drafter/config.py attention_windows_of
        # vLLM's Llama layer reads layer_types + sliding_window as given; Qwen3Config keeps sliding_window only
        # with use_sliding_window (and then takes layer_types over max_window_layers)
        d.update(layer_types=list(cfg.layer_types), sliding_window=cfg.sliding_window, use_sliding_window=True)
    return d


def vllm_config_dict(cfg: DrafterConfig, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """config.json of the vLLM layout for an EAGLE-3/3.1 drafter."""
    if cfg.generation != "eagle3":
        raise ValueError("the vLLM eagle3 layout holds EAGLE-3 style drafters only")
    d: dict[str, Any] = {
        "architectures": [FAMILY_ARCH[_family(cfg)]],
        **llama_layer_config(cfg),
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "tie_word_embeddings": False,
        "attention_bias": cfg.attention_bias,
        "fc_norm": cfg.fc_norm,
        "norm_output": cfg.norm_output,
        "norm_before_fc": cfg.norm_before_fc,
        "norm_before_residual": cfg.norm_before_residual,
        "torch_dtype": "bfloat16",
    }
    if cfg.mla:  # vLLM's DeepSeek drafter has neither (and reads no norm_before_fc)
        del d["attention_bias"], d["norm_before_fc"]
    if cfg.aux_layer_ids is not None:
        ids = sorted(cfg.aux_layer_ids)
        d["eagle_aux_hidden_state_layer_ids"] = ids
        d["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}
    if cfg.num_aux != 3 or cfg.mla:  # the DeepSeek drafter sizes fc from it (or eagle_config), never the top-level ids
        d["num_aux_hidden_states"] = cfg.num_aux
    d["eagle_migrate"] = {"version": __version__}
    if extra:
        d.update(extra)
    return d


def vllm_tensor_names(cfg: DrafterConfig) -> list[str]:
    """Every tensor the vLLM loader needs for this config (it never complains about a missing one)."""
    names = ["fc.weight", "norm.weight", "lm_head.weight"]
    if cfg.fc_bias:
        names.append("fc.bias")
    if cfg.fc_norm:
        names += [f"fc_norm.{k}.weight" for k in range(cfg.num_aux)]
    if cfg.norm_before_fc:
        names.append("input_norm.weight")
    if cfg.uses_d2t:
        names.append("d2t")
    if cfg.has_embed_tokens or cfg.hidden_size != cfg.target_hidden_size:
        names.append("embed_tokens.weight")
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        if cfg.mla:
            attn = MLA_ATTN if cfg.q_lora_rank is not None else ("q_proj",) + MLA_ATTN[3:]
            names += [p + f"self_attn.{x}.weight" for x in attn]
        else:
            names += [p + f"self_attn.{x}_proj.weight" for x in "qkvo"]
        if cfg.attention_bias:  # vLLM's Llama layer: o_proj has a bias too; its Qwen3 layer: never
            names += [p + f"self_attn.{x}_proj.bias" for x in ("qkvo" if not cfg.qk_norm else "qkv")]
        if cfg.qk_norm:  # vLLM loads all-ones norms without a word when these are missing
            names += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
        names += [p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        if i == 0:
            names.append(p + "hidden_norm.weight")
    return names


def speculative_config(model: str, num_speculative_tokens: int = 3) -> dict[str, Any]:
    """The ``--speculative-config`` dict vLLM takes for this drafter."""
    return {"model": model, "method": "eagle3", "num_speculative_tokens": num_speculative_tokens}


def speculative_config_json(model: str, num_speculative_tokens: int = 3) -> str:
    return json.dumps(speculative_config(model, num_speculative_tokens))
